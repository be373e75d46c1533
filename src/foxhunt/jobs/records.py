"""Jobs as the MLflow store records them: reading, grouping, and the state each one is shown in.

A job is what ``foxhunt train start`` launched: a parent MLflow run (the sweep's, tag
``foxhunt.run_kind=sweep``) whose cells are nested runs (tag ``mlflow.parentRunId``); its
cells carry the tag ``job_id`` from the start, the parent from the moment the job's supervisor
tags it (a second or so later). The store is the only database: nothing here writes to it,
and a job's state is its parent run's status (its cells' when it has no parent), with one
display-only state added, STALE (a run still RUNNING whose process is gone from this host:
after ``kill -9`` or a reboot; a sweep's parent run carries the ``pid`` and ``host`` of the
process that runs it, whether the launcher or a user at a shell started it). A cell that
``resume=true`` skipped, because an earlier run of the same config had FINISHED, has no run in
the job: its parent run's ``foxhunt.skipped.*`` tag names that earlier run, and the cell shows
as SKIPPED with that run's metrics. The store is changed only when a job is stopped or resumed
(:mod:`foxhunt.jobs.launch`). Besides the store, the launcher leaves a small launch record
(``outputs/jobs/<job_id>.json``: the latest launch's leader pid, command, plan), read for the
moments before the store knows a job, or to tell a resume in progress (STARTING).

Why not only ``MlflowClient``: reading the store through it costs about 2-3.5 s per command on
this machine (``import mlflow`` 1.3-2.2 s, opening the SQLite store 0.6 s; measured with
``time python -c ...`` on the project's 2-core box), which the read-only commands (``list``,
``status``, ``watch``'s refresh) cannot afford. For the default SQLite store they read MLflow's
tables (``runs``, ``tags``, ``latest_metrics``, ``params``, ``experiments``) directly with the
standard library's ``sqlite3``, queries only; a whole ``foxhunt train list`` or ``status`` takes
0.7-0.8 s (interpreter and typer start-up included). Any other tracking URI (a server), or a
SQLite schema this reader does not recognise, goes through ``MlflowClient``. The tests check
that both readers give the same jobs. This module imports neither torch, lightning nor mlflow.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# MLflow run statuses, and the display states: the statuses plus STALE (and STARTING for a job
# launched moments ago whose runs are not in the store yet; SKIPPED for a cell that
# ``resume=true`` did not train because an earlier run of the same config had FINISHED).
RUNNING, FINISHED, FAILED, KILLED, STALE, STARTING = "RUNNING", "FINISHED", "FAILED", "KILLED", "STALE", "STARTING"
SKIPPED, PENDING = "SKIPPED", "PENDING"
TERMINAL = (FINISHED, FAILED, KILLED)

# Tags: the ones every foxhunt run carries (TrackedRun), and the ones the job launcher adds to
# the job's parent run.
TAG_JOB_ID = "job_id"
TAG_PID = "pid"
TAG_HOST = "host"
TAG_COMMAND = "command"
TAG_OVERRIDES = "job.overrides"  # JSON list (the sweep's own "overrides" tag is one string)
TAG_SWEEP_OVERRIDES = "overrides"
TAG_RUN_KIND = "foxhunt.run_kind"  # "sweep" on a sweep's parent run (foxhunt.sweeps.callback)
RUN_KIND_SWEEP = "sweep"
TAG_SWEEP_DIR_OF_PARENT = "sweep_dir"  # the sweep folder, on a sweep's parent run
TAG_OUTPUT_DIR = "output_dir"  # a cell's output folder, updated on every attempt
RESUME_FLAG = "resume=true"
TAG_LOG = "job.log"
TAG_PLAN = "job.plan"
TAG_SWEEP_DIR = "job.sweep_dir"
TAG_ERROR = "error"
TAG_STOP_REASON = "stop_reason"
TAG_PARENT = "mlflow.parentRunId"
TAG_RUN_NAME = "mlflow.runName"
CELL_KEY_TAGS = ("model", "asset", "precision", "seed")
# On a sweep's parent run, one tag per cell that resume=true skipped without a run of its own in
# this sweep (foxhunt.sweeps.cell): ``foxhunt.skipped.<model>-<asset>-<precision>-s<seed>`` =
# JSON of :class:`SkippedCell` (the earlier FINISHED run, the metrics the job commands show).
TAG_SKIPPED_PREFIX = "foxhunt.skipped."

# Metrics the job commands show.
METRIC_PROGRESS = "progress"
METRIC_LOSS = "train/loss"
METRIC_PEAK_MB = "memory/peak_mb"
METRIC_SHARPE = "val/sharpe"  # the sweep objective (train.OBJECTIVE): the list's --sort sharpe

SKIPPED_METRICS = (METRIC_LOSS, METRIC_SHARPE, METRIC_PEAK_MB)  # kept in a skipped cell's tag

# Params read for each cell: where its checkpoints are (the resolved config, flattened).
PARAM_CHECKPOINT_DIRS = ("callbacks.graceful_stop.dirpath", "callbacks.model_checkpoint.dirpath")

JOBS_SUBDIR = Path("outputs") / "jobs"


class JobNotFound(LookupError):
    """No job, or more than one, matches what the user typed; the message says which."""


# --------------------------------------------------------------------------------------------
# Store locations
# --------------------------------------------------------------------------------------------
def default_root() -> Path:
    """The folder holding ``mlruns/`` and ``outputs/``: ``$FOXHUNT_ROOT`` or the current one."""
    return Path(os.environ.get("FOXHUNT_ROOT") or Path.cwd()).resolve()


def default_tracking_uri(root: Path) -> str:
    """The project's store under ``root`` (conf/logger/mlflow.yaml)."""
    return f"sqlite:///{(Path(root) / 'mlruns' / 'mlflow.db').resolve()}"


def jobs_dir(root: Path) -> Path:
    """Where launch records (``<job_id>.json``) and job logs (``<job_id>.log``) live."""
    return Path(root) / JOBS_SUBDIR


def sqlite_path(tracking_uri: str) -> Path | None:
    prefix = "sqlite:///"
    return Path(tracking_uri[len(prefix):]) if tracking_uri.startswith(prefix) else None


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    value: float
    step: int | None
    timestamp_ms: int | None


@dataclass
class RunRecord:
    """One MLflow run as the job commands need it."""

    run_id: str
    name: str
    experiment: str
    status: str
    start_ms: int
    end_ms: int | None
    tags: dict[str, str]
    metrics: dict[str, Metric]
    params: dict[str, str] = field(default_factory=dict)
    state: str = ""  # the display state, set by load_jobs (status, or STALE)

    @property
    def parent_id(self) -> str | None:
        return self.tags.get(TAG_PARENT) or None

    @property
    def job_id(self) -> str:
        return self.tags.get(TAG_JOB_ID, "")

    def metric(self, key: str) -> float | None:
        metric = self.metrics.get(key)
        return None if metric is None else metric.value

    def last_seen_ms(self) -> int:
        """The last time the run wrote anything we read (its end, else its newest metric)."""
        stamps = [m.timestamp_ms for m in self.metrics.values() if m.timestamp_ms]
        return self.end_ms or max([self.start_ms, *stamps])

    def duration_s(self, now_ms: int) -> float:
        end = self.end_ms if self.end_ms else (self.last_seen_ms() if self.state == STALE else now_ms)
        return max(0.0, (end - self.start_ms) / 1000)

    def cell_key(self) -> tuple[str, ...]:
        return tuple(self.tags.get(key, "") for key in CELL_KEY_TAGS)


@dataclass
class CellId:
    """What names a grid cell: model, asset, precision and seed (the ``CELL_KEY_TAGS`` of its run)."""

    model: str
    asset: str
    precision: str
    seed: str

    def key(self) -> tuple[str, ...]:
        return (self.model, self.asset, self.precision, self.seed)

    @property
    def name(self) -> str:
        return f"{self.model}-{self.asset}-{self.precision}"


@dataclass
class PlanCell(CellId):
    """A cell the launcher composed and validated before the job started."""

    steps: int  # planned training batches
    weight: float  # expected cost: steps x the model's cost per batch (jobs/cost.yaml)
    overrides: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "asset": self.asset, "precision": self.precision, "seed": self.seed,
            "steps": self.steps, "weight": self.weight, "overrides": self.overrides,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanCell:
        return cls(
            model=str(data["model"]), asset=str(data["asset"]), precision=str(data["precision"]),
            seed=str(data.get("seed", "")), steps=int(data.get("steps", 0)),
            weight=float(data.get("weight", 1.0)), overrides=list(data.get("overrides", [])),
        )  # fmt: skip


@dataclass
class SkippedCell(CellId):
    """A cell ``resume=true`` skipped: the earlier FINISHED run of the same config that holds its
    result (``run_id``, in whatever sweep or job ran it), with the metrics the job commands show."""

    run_id: str
    metrics: dict[str, float] = field(default_factory=dict)
    wall_s: float | None = None

    def tag(self) -> tuple[str, str]:
        """The parent-run tag (key, value) that records this skip."""
        metrics = {k: float(v) for k, v in self.metrics.items() if k in SKIPPED_METRICS and v == v}
        value = {**self.__dict__, "metrics": metrics}
        return f"{TAG_SKIPPED_PREFIX}{self.name}-s{self.seed}", json.dumps(value, sort_keys=True)

    @classmethod
    def from_tag(cls, value: str) -> SkippedCell | None:
        """The skip a tag records; None for a value this reader does not understand."""
        try:
            data = json.loads(value)
            return cls(
                model=str(data["model"]), asset=str(data["asset"]), precision=str(data["precision"]),
                seed=str(data["seed"]), run_id=str(data["run_id"]),
                metrics={str(k): float(v) for k, v in (data.get("metrics") or {}).items()},
                wall_s=None if data.get("wall_s") is None else float(data["wall_s"]),
            )  # fmt: skip
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def skipped_cells(tags: Mapping[str, str]) -> list[SkippedCell]:
    """The cells a parent run's tags record as skipped (see ``TAG_SKIPPED_PREFIX``)."""
    found = (SkippedCell.from_tag(v) for k, v in sorted(tags.items()) if k.startswith(TAG_SKIPPED_PREFIX))
    return [cell for cell in found if cell is not None]


@dataclass
class Cell:
    """One cell of a job: its plan (when the launcher made one), its run (once it started), or,
    without a run of its own, the earlier run ``resume=true`` skipped it for."""

    plan: PlanCell | None
    run: RunRecord | None
    skipped: SkippedCell | None = None

    @property
    def name(self) -> str:
        if self.run is not None:
            return self.run.name
        if self.plan is not None:
            return self.plan.name
        return self.skipped.name if self.skipped is not None else "?"

    @property
    def state(self) -> str:
        if self.run is not None:
            return self.run.state
        return SKIPPED if self.skipped is not None else PENDING

    @property
    def weight(self) -> float:
        return self.plan.weight if self.plan is not None and self.plan.weight > 0 else 1.0

    def metric(self, key: str) -> float | None:
        """The cell's metric: its run's, or (skipped) the earlier run's."""
        if self.run is not None:
            return self.run.metric(key)
        return self.skipped.metrics.get(key) if self.skipped is not None else None

    def duration_s(self, now_ms: int) -> float | None:
        if self.run is not None:
            return self.run.duration_s(now_ms)
        return self.skipped.wall_s if self.skipped is not None else None

    def fraction(self) -> float:
        """Training progress in [0, 1]; a FINISHED (or skipped) cell is done whatever its last
        report."""
        if self.run is None:
            return 1.0 if self.skipped is not None else 0.0
        if self.run.status == FINISHED:
            return 1.0
        value = self.run.metric(METRIC_PROGRESS)
        return 0.0 if value is None else min(1.0, max(0.0, value))

    def step(self) -> int | None:
        if self.run is None:
            return None
        metric = self.run.metrics.get(METRIC_PROGRESS)
        return None if metric is None else metric.step


@dataclass
class LaunchRecord:
    """What ``foxhunt train start`` wrote next to the job's log before the store knew the job.

    Read only while the job's parent run is not in the store yet (the moments after start), or
    when nothing ever reached it (a crash at import time): the store is the record otherwise.
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
    plan: list[PlanCell]
    experiment: str = ""  # where a job that dies before reaching the store is recorded
    artifact_location: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["plan"] = [cell.to_dict() for cell in self.plan]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchRecord:
        values = dict(data)
        values["plan"] = [PlanCell.from_dict(cell) for cell in data.get("plan", [])]
        return cls(**values)

    @classmethod
    def read(cls, path: Path) -> LaunchRecord:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        tmp.replace(path)


def job_tags(job_id: str, pid: int, command: Iterable[str], overrides: Iterable[str]) -> dict[str, str]:
    """The tags that make a parent run a job: id, process-group leader, host, command, overrides."""
    import shlex

    return {
        TAG_JOB_ID: job_id,
        TAG_PID: str(pid),
        TAG_HOST: socket.gethostname(),
        TAG_COMMAND: shlex.join(list(command)),
        TAG_OVERRIDES: json.dumps(list(overrides)),
    }


@dataclass
class Job:
    job_id: str
    parent: RunRecord | None
    runs: list[RunRecord]  # the cells' runs (nested in the parent, or tagged with the job id)
    plan: list[PlanCell]
    state: str
    record: LaunchRecord | None = None

    # -- what the tables show ------------------------------------------------------------
    @property
    def start_ms(self) -> int:
        starts = [r.start_ms for r in ([self.parent] if self.parent else []) + self.runs]
        if starts:
            return min(starts)
        return self.record.started_ms if self.record else 0

    def end_ms(self) -> int | None:
        if self.state not in TERMINAL and self.state != STALE:
            return None
        if self.parent is not None and self.parent.end_ms:
            return self.parent.end_ms
        ends = [r.last_seen_ms() for r in self.runs]
        return max(ends) if ends else None

    def duration_s(self, now_ms: int) -> float:
        end = self.end_ms() or now_ms
        return max(0.0, (end - self.start_ms) / 1000) if self.start_ms else 0.0

    @property
    def tags(self) -> dict[str, str]:
        return self.parent.tags if self.parent is not None else {}

    @property
    def overrides(self) -> list[str]:
        """The user's overrides: the launcher's list, else (a sweep started by hand) the sweep's
        own ``overrides`` tag split as a shell would, without ``resume=true``."""
        import shlex

        text = self.tags.get(TAG_OVERRIDES)
        if text:
            return list(json.loads(text))
        if self.record is not None:
            return list(self.record.overrides)
        text = self.tags.get(TAG_SWEEP_OVERRIDES, "")
        return [o for o in shlex.split(text) if o != RESUME_FLAG] if text else []

    @property
    def has_overrides(self) -> bool:
        """Whether the job's overrides are known (an empty list is a valid one)."""
        return TAG_OVERRIDES in self.tags or self.record is not None or TAG_SWEEP_OVERRIDES in self.tags

    @property
    def command(self) -> str:
        import shlex

        if self.tags.get(TAG_COMMAND):
            return self.tags[TAG_COMMAND]
        return shlex.join(self.record.command) if self.record else ""

    @property
    def pid(self) -> int | None:
        """The process-group leader of the job's latest launch: the launch record's (rewritten
        by every start and resume) when this machine has it, else the parent run's tag."""
        if self.record is not None and self.record.pid:
            return self.record.pid
        text = self.tags.get(TAG_PID, "")
        return int(text) if text.isdigit() else None

    @property
    def host(self) -> str:
        if self.record is not None and self.record.pid:
            return self.record.host
        return self.tags.get(TAG_HOST, "")

    @property
    def sweep_dir(self) -> str:
        """The sweep folder: the launcher's, else (a sweep started by hand) the sweep's own tag."""
        return (
            self.tags.get(TAG_SWEEP_DIR)
            or (self.record.sweep_dir if self.record else "")
            or self.tags.get(TAG_SWEEP_DIR_OF_PARENT, "")
        )

    @property
    def log(self) -> str:
        return self.tags.get(TAG_LOG) or (self.record.log if self.record else "")

    @property
    def error(self) -> str:
        return self.tags.get(TAG_ERROR, "")

    @property
    def skipped(self) -> list[SkippedCell]:
        """Cells resume=true skipped for an earlier run outside this job (parent-run tags)."""
        return skipped_cells(self.tags)

    @property
    def models(self) -> list[str]:
        names = [r.tags.get("model", "") for r in self.runs] + [c.model for c in [*self.plan, *self.skipped]]
        return sorted({n for n in names if n})

    @property
    def assets(self) -> list[str]:
        names = [r.tags.get("asset", "") for r in self.runs] + [c.asset for c in [*self.plan, *self.skipped]]
        return sorted({n for n in names if n})

    def best_sharpe(self) -> float | None:
        """The best ``val/sharpe`` of the job's cells (a skipped cell's from its earlier run)."""
        values = [r.metric(METRIC_SHARPE) for r in self.runs] + [s.metrics.get(METRIC_SHARPE) for s in self.skipped]
        values = [v for v in values if v is not None and v == v]
        return max(values) if values else None

    def cells(self) -> list[Cell]:
        """The plan's cells matched to their runs (model, asset, precision, seed), else to the
        earlier run resume=true skipped them for; then any run or skip the plan did not foresee.
        A job without a plan (launched by hand) is just its runs and skips."""
        unmatched = sorted(self.runs, key=lambda r: r.start_ms)
        skipped = {s.key(): s for s in self.skipped}
        cells: list[Cell] = []
        for planned in self.plan:
            match = next((r for r in unmatched if r.cell_key() == planned.key()), None)
            if match is not None:
                unmatched.remove(match)
            cells.append(Cell(planned, match, None if match is not None else skipped.get(planned.key())))
            skipped.pop(planned.key(), None)
        cells += [Cell(None, run) for run in unmatched]
        ran = {run.cell_key() for run in unmatched}
        cells += [Cell(None, None, skip) for key, skip in skipped.items() if key not in ran]
        return cells

    def fraction(self) -> float:
        """Overall progress: the cells' progress weighted by their expected cost."""
        cells = self.cells()
        total = sum(c.weight for c in cells)
        if self.state == FINISHED:
            return 1.0
        return sum(c.weight * c.fraction() for c in cells) / total if total else 0.0

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for cell in self.cells():
            counts[cell.state] = counts.get(cell.state, 0) + 1
        return counts


# --------------------------------------------------------------------------------------------
# Processes: is the process a RUNNING run names still there?
# --------------------------------------------------------------------------------------------
def process_alive(pid: int | None, since_ms: int | None = None) -> bool:
    """True if ``pid`` runs on this host and is no zombie. With ``since_ms`` (the last moment
    the run was seen working), a process created after it must be a foxhunt command: a pid
    reused by another program (after a reboot) does not keep a dead run alive, while a run that
    ``resume=true`` reopened (old start time, new process) still counts as alive."""
    import psutil

    if not pid or pid <= 0:
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        if since_ms is not None and process.create_time() > since_ms / 1000 + 1.0:
            return any("foxhunt" in part for part in process.cmdline())
        return True
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def run_state(run: RunRecord, host: str | None = None) -> str:
    """The run's MLflow status, or STALE when it is RUNNING on this host with its process gone.

    A run on another host cannot be checked from here and is shown as the store says.
    """
    if run.status != RUNNING:
        return run.status
    if run.tags.get(TAG_HOST, "") != (host or socket.gethostname()):
        return RUNNING
    pid = run.tags.get(TAG_PID, "")
    return RUNNING if pid.isdigit() and process_alive(int(pid), run.last_seen_ms()) else STALE


def job_state(parent: RunRecord | None, runs: list[RunRecord]) -> str:
    """The parent run's state when there is one (what the MLflow UI shows for the job), else the
    cells' together: any alive RUNNING -> RUNNING, else any STALE, FAILED, KILLED, in that order."""
    if parent is not None:
        return parent.state
    states = {r.state for r in runs}
    for state in (RUNNING, STALE, FAILED, KILLED):
        if state in states:
            return state
    return FINISHED if runs else STARTING


# --------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------
class SqliteReader:
    """Queries on MLflow's SQLite store (its tables, not its Python API: see above); no writes."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _connect(self) -> sqlite3.Connection:
        """Read-write mode but queries only (``query_only``): a read-only connection cannot
        roll back the hot journal a writer killed mid-transaction leaves (``kill -9``), and
        then fails with "attempt to write a readonly database"."""
        connection = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=rw", uri=True, timeout=10)
        connection.execute("PRAGMA query_only = ON")
        return connection

    def job_runs(self, job_id: str | None = None) -> list[RunRecord]:
        """Every run that belongs to a job (tagged ``job_id``, nested, or a parent: a sweep's
        parent run counts before its first cell starts), or, with ``job_id``, the runs of the
        jobs whose id starts with it."""
        try:
            return self._job_runs(job_id)
        except sqlite3.OperationalError as exc:  # a store whose tables are being created
            if "no such table" in str(exc):
                return []
            raise

    def _job_runs(self, job_id: str | None) -> list[RunRecord]:
        if not self.path.is_file():
            return []
        with self._connect() as db:
            if job_id is None:
                member = (
                    "SELECT run_uuid FROM tags WHERE (key = ? AND value != '') OR key = ? OR (key = ? AND value = ?) "
                    "UNION SELECT value FROM tags WHERE key = ?"
                )
                args: tuple = (TAG_JOB_ID, TAG_PARENT, TAG_RUN_KIND, RUN_KIND_SWEEP, TAG_PARENT)
            else:  # runs tagged with a matching job id, parents whose id matches; their kin
                member = (
                    "WITH a AS (SELECT run_uuid AS id FROM tags WHERE key = ? AND value LIKE ? ESCAPE '\\' "
                    "UNION SELECT value FROM tags WHERE key = ? AND value LIKE ? ESCAPE '\\' "
                    "UNION SELECT run_uuid FROM tags WHERE key = ? AND value = ? AND run_uuid LIKE ? ESCAPE '\\'), "
                    "p AS (SELECT value AS id FROM tags WHERE key = ? AND run_uuid IN (SELECT id FROM a)), "
                    "roots AS (SELECT id FROM a UNION SELECT id FROM p) "
                    "SELECT id FROM roots UNION "
                    "SELECT run_uuid FROM tags WHERE key = ? AND value IN (SELECT id FROM roots)"
                )
                like = _like_prefix(job_id)
                args = (TAG_JOB_ID, like, TAG_PARENT, like, TAG_RUN_KIND, RUN_KIND_SWEEP, like, TAG_PARENT, TAG_PARENT)
            runs = db.execute(
                "SELECT r.run_uuid, r.name, e.name, r.status, r.start_time, r.end_time "
                "FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id "
                f"WHERE r.lifecycle_stage = 'active' AND r.run_uuid IN ({member})",
                args,
            ).fetchall()
            ids = [row[0] for row in runs]
            tags = self._by_run(db, "SELECT run_uuid, key, value FROM tags", ids)
            metrics = self._by_run(db, "SELECT run_uuid, key, value, step, timestamp, is_nan FROM latest_metrics", ids)
            params = self._by_run(
                db, "SELECT run_uuid, key, value FROM params", ids, extra=("key", PARAM_CHECKPOINT_DIRS)
            )
        records = []
        for run_id, name, experiment, status, start, end in runs:
            run_tags = {k: v for k, v in tags.get(run_id, [])}
            run_metrics = {
                k: Metric(float("nan") if is_nan else float(v), step, ts)
                for k, v, step, ts, is_nan in metrics.get(run_id, [])
            }
            records.append(
                RunRecord(
                    run_id=run_id, name=name or run_tags.get(TAG_RUN_NAME, run_id[:8]), experiment=experiment,
                    status=status, start_ms=int(start or 0), end_ms=int(end) if end else None, tags=run_tags,
                    metrics=run_metrics, params={k: v for k, v in params.get(run_id, [])},
                )  # fmt: skip
            )
        return records

    def run_ids_with_tag(self, key: str, value: str) -> list[str]:
        """Active runs whose tag ``key`` is ``value``, newest first."""
        if not self.path.is_file() or _schema(self.path) != "known":
            return []
        with self._connect() as db:
            rows = db.execute(
                "SELECT r.run_uuid FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
                "WHERE r.lifecycle_stage = 'active' AND t.key = ? AND t.value = ? ORDER BY r.start_time DESC",
                (key, value),
            ).fetchall()
        return [row[0] for row in rows]

    @staticmethod
    def _by_run(db: sqlite3.Connection, select: str, ids: list[str], extra: tuple | None = None) -> dict:
        found: dict[str, list] = {}
        chunk = 500  # SQLite's default limit on host parameters is 999
        for start in range(0, len(ids), chunk):
            part = ids[start : start + chunk]
            query = f"{select} WHERE run_uuid IN ({','.join('?' * len(part))})"
            args = list(part)
            if extra is not None:
                column, values = extra
                query += f" AND {column} IN ({','.join('?' * len(values))})"
                args += list(values)
            for row in db.execute(query, args):
                found.setdefault(row[0], []).append(row[1:])
        return found


class ClientReader:
    """The same records through ``MlflowClient``: for a tracking server, or a SQLite schema the
    direct reader does not know."""

    def __init__(self, tracking_uri: str) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri)

    def run_ids_with_tag(self, key: str, value: str) -> list[str]:
        """Active runs whose tag ``key`` is ``value``, newest first."""
        from mlflow.entities import ViewType

        experiments = [e.experiment_id for e in self.client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
        if not experiments:
            return []
        quoted = value.replace("'", "\\'")
        runs = self.client.search_runs(
            experiments, filter_string=f"tags.`{key}` = '{quoted}'", order_by=["attributes.start_time DESC"]
        )
        return [run.info.run_id for run in runs]

    def job_runs(self, job_id: str | None = None) -> list[RunRecord]:
        from mlflow.entities import ViewType

        experiments = {e.experiment_id: e.name for e in self.client.search_experiments(view_type=ViewType.ACTIVE_ONLY)}
        if not experiments:
            return []
        runs = []
        token = None
        while True:
            page = self.client.search_runs(list(experiments), max_results=1000, page_token=token)
            runs += list(page)
            token = page.token
            if not token:
                break
        parents = {r.data.tags.get(TAG_PARENT) for r in runs}
        parents |= {r.info.run_id for r in runs if r.data.tags.get(TAG_RUN_KIND) == RUN_KIND_SWEEP}
        members = [
            r for r in runs
            if r.data.tags.get(TAG_JOB_ID) or r.data.tags.get(TAG_PARENT) or r.info.run_id in parents
        ]  # fmt: skip
        if job_id is not None:
            wanted = {r.info.run_id for r in members if r.data.tags.get(TAG_JOB_ID, "").startswith(job_id)}
            wanted |= {p for p in parents if p and p.startswith(job_id)}
            wanted |= {
                r.data.tags[TAG_PARENT] for r in members if r.info.run_id in wanted and r.data.tags.get(TAG_PARENT)
            }
            members = [r for r in members if r.info.run_id in wanted or r.data.tags.get(TAG_PARENT) in wanted]
        records = []
        for run in members:
            metrics = {}
            for key, value in run.data.metrics.items():
                step = timestamp = None
                if key == METRIC_PROGRESS:  # the step the cell is at
                    history = self.client.get_metric_history(run.info.run_id, key)
                    if history:
                        latest = max(history, key=lambda m: (m.step, m.timestamp))
                        step, timestamp = latest.step, latest.timestamp
                metrics[key] = Metric(float(value), step, timestamp)
            records.append(
                RunRecord(
                    run_id=run.info.run_id, name=run.info.run_name or run.info.run_id[:8],
                    experiment=experiments.get(run.info.experiment_id, ""), status=run.info.status,
                    start_ms=int(run.info.start_time or 0),
                    end_ms=int(run.info.end_time) if run.info.end_time else None,
                    tags=dict(run.data.tags), metrics=metrics,
                    params={k: v for k, v in run.data.params.items() if k in PARAM_CHECKPOINT_DIRS},
                )  # fmt: skip
            )
        return records


def open_reader(tracking_uri: str) -> SqliteReader | ClientReader:
    """The direct SQLite reader when the store is a SQLite file whose schema it knows (or that
    does not exist, or is being created: no jobs yet), else the client.

    The client is never opened on a store that is being created: opening it runs MLflow's
    migrations, which race with the sweep creating the same tables.
    """
    path = sqlite_path(tracking_uri)
    if path is not None and _schema(path) in ("known", "incomplete"):
        return SqliteReader(path)
    return ClientReader(tracking_uri)


_REQUIRED_COLUMNS = {
    "runs": {"run_uuid", "name", "status", "start_time", "end_time", "lifecycle_stage", "experiment_id"},
    "experiments": {"experiment_id", "name"},
    "tags": {"run_uuid", "key", "value"},
    "params": {"run_uuid", "key", "value"},
    "latest_metrics": {"run_uuid", "key", "value", "step", "timestamp", "is_nan"},
}


def _schema(path: Path) -> str:
    """``known``; ``incomplete`` (no file, or tables still missing: being created); ``unknown``
    (MLflow's tables changed: read through the client)."""
    if not path.is_file():
        return "incomplete"
    try:
        with SqliteReader(path)._connect() as db:
            for table, columns in _REQUIRED_COLUMNS.items():
                found = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                if not found:
                    return "incomplete"
                if not columns <= found:
                    return "unknown"
    except sqlite3.Error:
        return "incomplete"
    return "known"


def _like_prefix(prefix: str) -> str:
    return re.sub(r"([%_\\])", r"\\\1", prefix) + "%"


# --------------------------------------------------------------------------------------------
# Grouping runs into jobs
# --------------------------------------------------------------------------------------------
def group_jobs(runs: list[RunRecord], host: str | None = None) -> list[Job]:
    """Runs -> jobs. A run's job is its parent's job id, else its own ``job_id`` tag, else (a
    sweep started by hand with ``foxhunt-train -m``) its parent run's id. The job's parent is
    its newest run that nests others or carries the launcher's tags."""
    host = host or socket.gethostname()
    by_id = {r.run_id: r for r in runs}
    has_children = {r.parent_id for r in runs if r.parent_id}
    for run in runs:
        run.state = run_state(run, host)

    def is_root(run: RunRecord) -> bool:
        return not run.parent_id and (
            run.run_id in has_children or run.tags.get(TAG_RUN_KIND) == RUN_KIND_SWEEP or TAG_COMMAND in run.tags
        )

    # A parent's job id: its own tag (set by the supervisor), else its cells' (they carry it
    # from the start), else its run id (a sweep started by hand).
    child_ids: dict[str, str] = {}
    for run in runs:
        if run.parent_id and run.job_id:
            child_ids.setdefault(run.parent_id, run.job_id)

    def job_key(run: RunRecord) -> str:
        root = run if is_root(run) else by_id.get(run.parent_id) if run.parent_id else None
        if root is not None and is_root(root):
            return root.job_id or child_ids.get(root.run_id) or root.run_id
        return run.job_id or run.parent_id or run.run_id

    groups: dict[str, list[RunRecord]] = {}
    for run in runs:
        groups.setdefault(job_key(run), []).append(run)

    jobs = []
    for key, members in groups.items():
        roots = [r for r in members if is_root(r)]
        parent = max(roots, key=lambda r: r.start_ms) if roots else None
        root_ids = {r.run_id for r in roots}
        cells = _latest_per_cell([r for r in members if r.run_id not in root_ids])
        plan_text = parent.tags.get(TAG_PLAN) if parent is not None else None
        plan = [PlanCell.from_dict(c) for c in json.loads(plan_text)] if plan_text else []
        jobs.append(Job(key, parent, cells, plan, job_state(parent, cells)))
    return jobs


def _latest_per_cell(runs: list[RunRecord]) -> list[RunRecord]:
    """A cell run twice (a resume that opened a new run instead of continuing the old one) is
    shown once, as its newest run."""
    latest: dict[tuple, RunRecord] = {}
    keyless = []
    for run in sorted(runs, key=lambda r: r.start_ms):
        key = run.cell_key()
        if any(key):
            latest[key] = run
        else:
            keyless.append(run)
    return sorted([*latest.values(), *keyless], key=lambda r: r.start_ms)


def load_jobs(tracking_uri: str, host: str | None = None, root: Path | None = None) -> list[Job]:
    """Every job in the store; with ``root``, each with its launch record (see attach_record)."""
    jobs = group_jobs(open_reader(tracking_uri).job_runs(), host)
    if root is not None:
        records = _launch_records(root, "")
        for job in jobs:
            attach_record(job, records.get(job.job_id), host)
    return jobs


def find_job(tracking_uri: str, key: str, root: Path | None = None, host: str | None = None) -> Job:
    """The one job whose id (or parent run id) is ``key`` or starts with it.

    A job launched moments ago whose runs are not in the store yet is found through its launch
    record under ``<root>/outputs/jobs/`` (state STARTING, or FAILED if its process is gone).
    """
    key = key.strip()
    if not key:
        raise JobNotFound("empty job id")
    jobs = group_jobs(open_reader(tracking_uri).job_runs(key), host)
    exact = [j for j in jobs if j.job_id == key]
    matches = exact or [j for j in jobs if j.job_id.startswith(key) or (j.parent and j.parent.run_id.startswith(key))]
    records = _launch_records(root, key) if root is not None else {}
    if not matches:
        record_matches = [r for job_id, r in records.items() if job_id == key] or list(records.values())
        if len(record_matches) == 1:
            return _job_from_record(record_matches[0])
        if len(record_matches) > 1:
            raise JobNotFound(f"job id {key!r} is ambiguous: {', '.join(sorted(r.job_id for r in record_matches))}")
        raise JobNotFound(f"no job {key!r} in {tracking_uri} (foxhunt train list shows the jobs)")
    if len(matches) > 1:
        raise JobNotFound(f"job id {key!r} is ambiguous: {', '.join(sorted(j.job_id for j in matches))}")
    job = matches[0]
    attach_record(job, records.get(job.job_id), host)
    return job


def attach_record(job: Job, record: LaunchRecord | None, host: str | None = None) -> None:
    """Give a job its launch record: its plan if the store has none; STARTING while the latest
    launch's supervisor lives and the store still shows the previous launch's ending (a resume
    in its first seconds); STALE for a parent left RUNNING, untagged, by a dead launch."""
    job.record = record
    if record is None:
        return
    if not job.plan:
        job.plan = list(record.plan)
    here = record.host == (host or socket.gethostname())
    leader_alive = here and process_alive(record.pid, record.started_ms)
    if job.state == RUNNING and job.parent is not None and TAG_PID not in job.parent.tags and here and not leader_alive:
        job.state = job.parent.state = STALE  # killed before the supervisor could tag the parent
    end = job.end_ms()
    if job.state != RUNNING and leader_alive and (end is None or end < record.started_ms):
        job.state = STARTING  # what the store shows is the previous launch's ending


def _launch_records(root: Path, key: str) -> dict[str, LaunchRecord]:
    folder = jobs_dir(root)
    found = {}
    if folder.is_dir():
        for path in folder.glob(f"{glob_escape(key)}*.json"):
            try:
                record = LaunchRecord.read(path)
            except (ValueError, KeyError, TypeError, OSError):
                continue
            found[record.job_id] = record
    return found


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def _job_from_record(record: LaunchRecord) -> Job:
    alive = record.host == socket.gethostname() and process_alive(record.pid, record.started_ms)
    return Job(record.job_id, None, [], list(record.plan), STARTING if alive else FAILED, record)


def log_tail(path: str | os.PathLike, lines: int) -> str:
    """The last ``lines`` non-empty lines of a job's log (the error of a job that never reached
    the store)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])


def checkpoint_of(run: RunRecord) -> Path | None:
    """The newest checkpoint a cell wrote (``interrupted.ckpt`` after a stop), from the folders
    its resolved config names and its current output folder; None if none is on this machine."""
    folders = {run.params.get(key) for key in PARAM_CHECKPOINT_DIRS}
    if run.tags.get(TAG_OUTPUT_DIR):  # a resumed run's folder may differ from its first params
        folders.add(str(Path(run.tags[TAG_OUTPUT_DIR]) / "checkpoints"))
    found: list[Path] = []
    for folder in folders:
        if folder and Path(folder).is_dir():
            found += Path(folder).glob("*.ckpt")
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def iso_time(ms: int) -> str | None:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="seconds") if ms else None


def now_ms() -> int:
    return int(time.time() * 1000)
