"""What ``foxhunt train start`` knows of a job before the store does: its plan and its launch.

A job's plan is one :class:`PlannedCell` per cell of its grid, composed and validated before
anything starts (:func:`foxhunt.jobs.launch.plan_cells`), kept on the job's parent run (tag
``job.plan``) and in its :class:`LaunchFile`. The launch file
(``<root>/outputs/jobs/<job_id>.json``: the latest launch's leader pid, command, plan) is read
for the moments before the store knows a job, or to tell a resume in progress (STARTING).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import socket
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foxhunt.files import read_regular_file, write_whole
from foxhunt.runs.cell import CellKey
from foxhunt.runs.tags import Tag

JOBS_SUBDIR = Path("outputs") / "jobs"


def jobs_dir(root: Path) -> Path:
    """Where launch files (``<job_id>.json``) and job logs (``<job_id>.log``) live."""
    return Path(root) / JOBS_SUBDIR


def open_log(path: Path):
    """The job's log, opened to append; a symbolic link at its name (planted to have a job's
    output written into another file) is refused with ``OSError`` (ELOOP), never followed, and
    anything else that is not a regular file with ``OSError`` (EINVAL): a FIFO planted there held
    the launch, its job's lock taken, for good (found by a helper probing the job CLI)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO no one reads
            raise OSError(errno.EINVAL, "not a regular file", str(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a")


@dataclass
class PlannedCell:
    """A cell the launcher composed and validated before the job started."""

    key: CellKey
    steps: int  # planned training batches
    weight: float  # expected cost: steps x the model's expected_seconds_per_batch (conf/model/<family>.yaml)
    overrides: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.key.name

    def to_dict(self) -> dict[str, Any]:
        return {**self.key.to_dict(), "steps": self.steps, "weight": self.weight, "overrides": self.overrides}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlannedCell:
        return cls(
            key=CellKey.from_dict(data), steps=int(data.get("steps", 0)), weight=float(data.get("weight", 1.0)),
            overrides=list(data.get("overrides", [])),
        )  # fmt: skip


#: A job id as foxhunt makes them (8 hex digits; a sweep started by hand: its parent run's id): what
#: a launch file's name and ``job_id``, and an id read back from a store, must be (file names under outputs/jobs/).
JOB_ID_PATTERN = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,63}")
MAX_LAUNCH_FILE_BYTES = 1 << 20  # a grid's plan is a few KB
MAX_PID = 1 << 22  # Linux's pid_max limit
MAX_TIME_MS = 4_102_444_800_000  # 2100-01-01: a started_ms beyond it is no launch time
#: The type of each field of a launch file (LaunchFile.from_dict); the last two may be absent.
_FIELD_TYPES: dict[str, type] = {
    "job_id": str, "pid": int, "host": str, "command": list, "overrides": list, "log": str, "tracking_uri": str,
    "root": str, "sweep_dir": str, "started_ms": int, "plan": list, "experiment": str, "artifact_location": str,
}  # fmt: skip
_OPTIONAL = {"experiment", "artifact_location"}


@dataclass
class LaunchFile:
    """What ``foxhunt train start`` wrote next to the job's log before the store knew the job.

    Read only while the job's parent run is not in the store yet (the moments after start), or
    when nothing ever reached it (a crash at import time): the store knows the job otherwise.
    """

    job_id: str
    pid: int
    host: str
    command: list[str]
    overrides: list[str]
    log: str
    tracking_uri: str
    root: str
    sweep_dir: str
    started_ms: int
    plan: list[PlannedCell]
    experiment: str = ""  # where a job that dies before reaching the store is recorded
    artifact_location: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["plan"] = [cell.to_dict() for cell in self.plan]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchFile:
        """The launch file ``data`` describes, its fields checked by type and range (a ``ValueError``
        naming the first that is not as foxhunt writes it): the file sits in a folder others may
        write, and its values reach signals (``pid``), clocks and the terminal."""
        if not isinstance(data, Mapping):
            raise ValueError("not a JSON object")
        values = dict(data)
        unknown = sorted(set(values) - set(_FIELD_TYPES))
        if unknown:
            raise ValueError(f"fields foxhunt does not write: {', '.join(map(str, unknown))[:80]}")
        for name, kind in _FIELD_TYPES.items():
            value = values.get(name)
            if name not in values and name in _OPTIONAL:
                continue
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ValueError(f"{name}: {str(value)[:40]!r} is not a {kind.__name__}")
        if not JOB_ID_PATTERN.fullmatch(values["job_id"]):
            raise ValueError(f"job_id: {values['job_id'][:40]!r} is not a job id")
        if not 0 <= values["pid"] <= MAX_PID or not 0 <= values["started_ms"] <= MAX_TIME_MS:
            raise ValueError(f"pid {values['pid']} or started_ms {values['started_ms']} out of range")
        for name in ("command", "overrides"):
            if not all(isinstance(item, str) for item in values[name]):
                raise ValueError(f"{name}: not a list of strings")
        if not all(isinstance(cell, Mapping) for cell in values["plan"]):
            raise ValueError("plan: not a list of cells")
        values["plan"] = [PlannedCell.from_dict(cell) for cell in values["plan"]]
        return cls(**values)

    @classmethod
    def read(cls, path: Path) -> LaunchFile:
        """The launch file at ``path``: a regular file (no link, no pipe: a reader never blocks),
        of at most :data:`MAX_LAUNCH_FILE_BYTES`, named after its job; ``ValueError`` (or
        ``OSError``) when it is not one."""
        path = Path(path)
        text = read_regular_file(path, MAX_LAUNCH_FILE_BYTES)
        if text is None:
            raise ValueError(f"{path.name}: not a launch file (not a regular file of at most {MAX_LAUNCH_FILE_BYTES} bytes)")
        try:
            launch_file = cls.from_dict(json.loads(text))
        except RecursionError:
            raise ValueError(f"{path.name}: nested too deep to be a launch file") from None
        if f"{launch_file.job_id}.json" != path.name:
            raise ValueError(f"{path.name}: holds job {launch_file.job_id}, not the job it is named after")
        return launch_file

    def write(self, path: Path) -> None:
        """Whole or not at all: a temporary file of this process's own (created, never opened
        through a link planted at its name), then renamed over ``path`` (a link there is replaced,
        not followed)."""
        write_whole(path, json.dumps(self.to_dict(), indent=1))


def job_tags(job_id: str, pid: int, command: Iterable[str], overrides: Iterable[str]) -> dict[str, str]:
    """The tags that make a parent run a job: id, process-group leader, host, command, overrides."""
    return {
        Tag.JOB_ID: job_id,
        Tag.PID: str(pid),
        Tag.HOST: socket.gethostname(),
        Tag.COMMAND: shlex.join(list(command)),
        Tag.JOB_OVERRIDES: json.dumps(list(overrides)),
    }
