"""What ``foxhunt train start`` knows of a job before the store does: its plan and its launch.

A job's plan is one :class:`PlannedCell` per cell of its grid, composed and validated before
anything starts (:func:`foxhunt.jobs.launch.plan_cells`), kept on the job's parent run (tag
``job.plan``) and in its :class:`LaunchFile`. The launch file
(``<root>/outputs/jobs/<job_id>.json``: the latest launch's leader pid, command, plan) is read
for the moments before the store knows a job, or to tell a resume in progress (STARTING).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foxhunt.runs.cell import CellKey
from foxhunt.runs.tags import Tag

JOBS_SUBDIR = Path("outputs") / "jobs"


def jobs_dir(root: Path) -> Path:
    """Where launch files (``<job_id>.json``) and job logs (``<job_id>.log``) live."""
    return Path(root) / JOBS_SUBDIR


def open_log(path: Path):
    """The job's log, opened to append; a symbolic link at its name (planted to have a job's
    output written into another file) is refused with ``OSError`` (ELOOP), never followed."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644), "a")


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
        values = dict(data)
        values["plan"] = [PlannedCell.from_dict(cell) for cell in data.get("plan", [])]
        return cls(**values)

    @classmethod
    def read(cls, path: Path) -> LaunchFile:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def write(self, path: Path) -> None:
        """Whole or not at all: a temporary file of this process's own (created, never opened
        through a link planted at its name), then renamed over ``path`` (a link there is replaced,
        not followed)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "w") as out:
            out.write(json.dumps(self.to_dict(), indent=1))
        tmp.replace(path)


def job_tags(job_id: str, pid: int, command: Iterable[str], overrides: Iterable[str]) -> dict[str, str]:
    """The tags that make a parent run a job: id, process-group leader, host, command, overrides."""
    return {
        Tag.JOB_ID: job_id,
        Tag.PID: str(pid),
        Tag.HOST: socket.gethostname(),
        Tag.COMMAND: shlex.join(list(command)),
        Tag.JOB_OVERRIDES: json.dumps(list(overrides)),
    }
