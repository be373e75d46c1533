"""Run statuses: MLflow's, and the states foxhunt shows beside them. Defined here only.

A run in the store has one of MLflow's statuses (``RUNNING``, ``SCHEDULED``, ``FINISHED``,
``FAILED``, ``KILLED``). The job views and the sweep add four states the store never holds:

- ``STALE``: the store says RUNNING but the process that runs it is gone from this host
  (:mod:`foxhunt.runs.liveness`);
- ``SKIPPED``: a cell ``resume=true`` did not train because an earlier run of the same config
  had FINISHED (its result is that run's);
- ``PENDING``: a planned cell that has no run yet;
- ``STARTING``: a job launched moments ago whose runs are not in the store yet.

``Status`` is a ``str`` enum: a member equals the plain string (``Status.FINISHED ==
"FINISHED"``), so the values read back from the store, from JSON or from the command line
compare with it directly.
"""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    RUNNING = "RUNNING"
    SCHEDULED = "SCHEDULED"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"
    STALE = "STALE"
    SKIPPED = "SKIPPED"
    PENDING = "PENDING"
    STARTING = "STARTING"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


#: The statuses a run ends with.
TERMINAL = (Status.FINISHED, Status.FAILED, Status.KILLED)
#: What ``foxhunt train list --status`` filters on: a job's states.
JOB_STATES = (Status.RUNNING, Status.FINISHED, Status.FAILED, Status.KILLED, Status.STALE, Status.STARTING)
#: A cell's result that is no failure (the sweep's exit code, the summary's pivot).
OK_RESULTS = (Status.FINISHED, Status.SKIPPED)


def ending_status(exc: BaseException | None) -> Status:
    """How a run that ended with ``exc`` is recorded: FINISHED (no exception), KILLED (a stop
    request: Ctrl-C, or SIGTERM, which Lightning raises as ``SIGTERMException``, a
    ``SystemExit``), else FAILED."""
    if exc is None:
        return Status.FINISHED
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return Status.KILLED
    return Status.FAILED
