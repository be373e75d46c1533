"""Where a run came from: the process that runs it.

``host``, ``pid`` and ``job_id`` (``$FOXHUNT_JOB_ID``) name the process, which
:mod:`foxhunt.runs.liveness` checks while the store shows the run RUNNING.
"""

from __future__ import annotations

import os
import socket

from foxhunt.runs.environment import JOB_ID_ENV
from foxhunt.runs.tags import Tag


def process_tags() -> dict[str, str]:
    """The process that runs a run: host, pid, and the job it belongs to (if any)."""
    return {Tag.HOST: socket.gethostname(), Tag.PID: str(os.getpid()), Tag.JOB_ID: os.environ.get(JOB_ID_ENV, "")}
