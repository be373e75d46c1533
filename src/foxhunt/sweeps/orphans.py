"""A sweep's worker processes end when the sweep's own process dies.

joblib's loky workers (``strategy=parallel``) and submitit's local processes are children of
the process that runs the sweep. When that process is killed (``kill -9``, out of memory) they
are orphaned, and loky's do not notice: they would finish their cells, minutes later, while a
``resume=true`` started in between could train the same cells again. Linux's parent-death
signal (``PR_SET_PDEATHSIG``) is no help here: it follows the thread that forked the child,
and loky forks from a manager thread.

So each such worker runs :func:`watch_sweep_process`: a daemon thread that polls the worker's
parent; once it is no longer the sweep's process (the worker was re-parented), the thread
sends the worker SIGTERM, which a training cell turns into a graceful stop (``interrupted.ckpt``,
run KILLED: :mod:`foxhunt.training.graceful_stop`), and after ``strategy.orphan_grace_s`` seconds
ends the process whatever it is doing. :func:`orphaned` tells a finished job to exit at once.
The sweep's process names itself in ``$FOXHUNT_SWEEP_PID`` (:mod:`foxhunt.runs.environment`)
before any job starts; a job running inside that process (Hydra's basic launcher) or on
another host (SLURM) is not its child, and is not watched. A local worker whose job begins after
the sweep's process died (re-parented already) does not start the job (:func:`orphaned`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import psutil

from foxhunt.runs.environment import SWEEP_PID_ENV

log = logging.getLogger(__name__)

POLL_S = 0.5  # how often the parent is checked: the delay between the sweep's death and the stop
EXIT_ORPHANED = 128 + signal.SIGTERM  # the status of a worker ended by the watcher
SLURM_JOB_ENV = "SLURM_JOB_ID"  # set in a SLURM job: on another host than the sweep's process

_orphaned = threading.Event()
_watching: int | None = None  # the sweep pid this process watches


def sweep_pid() -> int | None:
    value = os.environ.get(SWEEP_PID_ENV, "")
    return int(value) if value.isdigit() else None


def watch_sweep_process(grace_s: float | None) -> bool:
    """Start the watcher in this worker (once per process) when it is a child of the sweep's
    process; ``grace_s`` None: not watched. Returns whether this process is watched."""
    global _watching
    pid = sweep_pid()
    if grace_s is None or pid is None or pid == os.getpid():
        return False
    if os.getppid() != pid:
        # not the sweep's child: a SLURM job (another host: the pid means nothing here), or a worker this
        # host's sweep process left before its job began (it was re-parented already: such workers trained
        # their trials minutes after the kill, racing the relaunch; found by a helper probing searches)
        if not os.environ.get(SLURM_JOB_ENV) and not psutil.pid_exists(pid):
            _orphaned.set()
            log.warning("the sweep's process %d is gone before this worker's job began: not starting it (pid %d)",
                        pid, os.getpid())  # fmt: skip
        return False
    if _watching != pid:
        _watching = pid
        threading.Thread(target=_watch, args=(pid, float(grace_s)), name="foxhunt-sweep-watch", daemon=True).start()
    return True


def orphaned() -> bool:
    """True once the sweep's process is gone (this worker should exit)."""
    return _orphaned.is_set()


def _watch(pid: int, grace_s: float) -> None:
    while os.getppid() == pid:
        time.sleep(POLL_S)
    _orphaned.set()
    log.warning("the sweep's process %d is gone: stopping this worker (pid %d)", pid, os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os._exit(EXIT_ORPHANED)
