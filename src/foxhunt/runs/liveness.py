"""Is a run that the store shows RUNNING still running? One rule, for every reader.

The store cannot tell: a process killed with ``kill -9``, out of memory or on a rebooted host
never ends its run. A run's ``host`` and ``pid`` tags name the process that runs it; on this
host that process is checked (:func:`process_alive`): gone, or a zombie, and the run is
STALE. A pid can be reused (after a reboot): a process created after the run was last seen
working counts only if it is a foxhunt command, while a run that ``resume=true`` reopened (an
old start time, a new process) still counts as alive. A run on another host cannot be checked
from here: it is shown as the store says, RUNNING, and never declared stale from here (on a
cluster, end it from its node, or let its job's resume settle it there).

``foxhunt train list/status/watch``, ``stop``, the supervisor and ``resume=true`` all use
:func:`run_state`.
"""

from __future__ import annotations

import socket

import psutil

from foxhunt.runs.status import Status
from foxhunt.runs.stored import StoredRun
from foxhunt.runs.tags import Tag

#: Seconds of slack between a run's last sign of life and its process's creation time.
CREATE_TIME_SLACK_S = 1.0
FOXHUNT_COMMAND = "foxhunt"  # in the command line of every foxhunt process


def process_alive(pid: int | None, since_ms: int | None = None) -> bool:
    """True if ``pid`` runs on this host and is no zombie; with ``since_ms`` (the last moment
    the run was seen working), a process created after it must be a foxhunt command."""
    if not pid or pid <= 0:
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        if since_ms is not None and process.create_time() > since_ms / 1000 + CREATE_TIME_SLACK_S:
            return any(FOXHUNT_COMMAND in part for part in process.cmdline())
        return True
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def on_this_host(run: StoredRun, host: str | None = None) -> bool:
    return run.tags.get(Tag.HOST, "") == (host or socket.gethostname())


def run_state(run: StoredRun, host: str | None = None) -> str:
    """The run's status, or STALE when it is RUNNING on this host with its process gone."""
    if run.status != Status.RUNNING:
        return run.status
    if not on_this_host(run, host):
        return Status.RUNNING
    pid = run.tags.get(Tag.PID, "")
    return Status.RUNNING if pid.isdigit() and process_alive(int(pid), run.last_seen_ms()) else Status.STALE
