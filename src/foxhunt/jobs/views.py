"""Jobs as the store records them: runs grouped into jobs, and the state each is shown in.

A job is what ``foxhunt train start`` launched, or a sweep started by hand: a parent MLflow run
(the sweep's, tag ``foxhunt.run_kind=sweep``) whose cells are nested runs (tag
``mlflow.parentRunId``); its cells carry the tag ``job_id`` from the start, the parent from the
moment the job's supervisor tags it (a second or so later). The store is the only database:
nothing here writes to it, and a job's state is its parent run's state (its cells' when it has
no parent): the MLflow status, or STALE (:mod:`foxhunt.runs.liveness`). A cell that
``resume=true`` skipped, because an earlier run of the same config had FINISHED, has no run in
the job: its parent run's ``foxhunt.skipped.*`` tag names that earlier run, and the cell shows
as SKIPPED with that run's metrics. The launch file (:mod:`foxhunt.jobs.launch_file`)
stands in before the store knows a job. Reading goes through :func:`foxhunt.runs.store.open_reader`
(the SQLite fast path): this module imports neither torch, lightning nor mlflow.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from foxhunt.errors import ConfigError
from foxhunt.files import read_regular_file
from foxhunt.jobs.launch_file import LaunchFile, PlannedCell, jobs_dir
from foxhunt.runs.cell import CellKey, CellResult, skipped_cells
from foxhunt.runs.checkpoints import Checkpoint, resumable_checkpoint
from foxhunt.runs.liveness import process_alive, run_state
from foxhunt.runs.status import TERMINAL, Status
from foxhunt.runs.store import open_reader
from foxhunt.runs.stored import StoredRun
from foxhunt.runs.tags import ROLE_FOLD, RUN_KIND_SWEEP, Tag

# Metrics the job commands show.
METRIC_PROGRESS = "progress"
METRIC_LOSS = "train/loss"
METRIC_PEAK_MB = "memory/peak_mb"
METRIC_SHARPE = "val/sharpe"  # the sweep objective (train.OBJECTIVE): the list's --sort sharpe
RESUME_FLAG = "resume=true"
LOG_TAIL_BYTES = 1 << 16  # the end of a job's log read for its last lines (its error)


class JobNotFound(LookupError):
    """No job, or more than one, matches what the user typed; the message says which."""


@dataclass
class JobCell:
    """One cell of a job: its plan (when the launcher made one), its run (once it started), or,
    without a run of its own, the earlier run ``resume=true`` skipped it for."""

    plan: PlannedCell | None
    run: StoredRun | None
    skipped: CellResult | None = None

    @property
    def name(self) -> str:
        if self.run is not None:
            return self.run.name
        if self.plan is not None:
            return self.plan.name
        return self.skipped.cell if self.skipped is not None else "?"

    @property
    def state(self) -> str:
        if self.run is not None:
            return self.run.state
        return Status.SKIPPED if self.skipped is not None else Status.PENDING

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
        if self.run.status == Status.FINISHED:
            return 1.0
        value = self.run.metric(METRIC_PROGRESS)
        return 0.0 if value is None else min(1.0, max(0.0, value))

    def step(self) -> int | None:
        if self.run is None:
            return None
        metric = self.run.metrics.get(METRIC_PROGRESS)
        return None if metric is None else metric.step


@dataclass
class Job:
    job_id: str
    parent: StoredRun | None
    runs: list[StoredRun]  # the cells' runs (nested in the parent, or tagged with the job id)
    plan: list[PlannedCell]
    state: str
    launch_file: LaunchFile | None = None

    # -- what the tables show ------------------------------------------------------------
    @property
    def start_ms(self) -> int:
        starts = [r.start_ms for r in ([self.parent] if self.parent else []) + self.runs]
        if starts:
            return min(starts)
        return self.launch_file.started_ms if self.launch_file else 0

    def end_ms(self) -> int | None:
        if self.state not in TERMINAL and self.state != Status.STALE:
            return None
        if self.parent is not None and self.parent.end_ms:
            return self.parent.end_ms
        ends = [r.last_seen_ms() for r in self.runs]
        if not ends and self.launch_file is not None:  # known from its launch file only: it ended when its log stopped
            return self._log_end_ms(self.launch_file)  # (its duration grew for ever: found by a helper probing the jobs)
        return max(ends) if ends else None

    def _log_end_ms(self, launch_file: LaunchFile) -> int:
        """When the job's own log was last written (its start when the log is not its own or not there)."""
        own = jobs_dir(Path(launch_file.root)) / f"{self.job_id}.log"
        try:
            if Path(launch_file.log).resolve() == own.resolve():
                return max(launch_file.started_ms, own.stat().st_mtime_ns // 1_000_000)
        except (OSError, ValueError):  # not there, or a path that cannot be resolved
            pass
        return launch_file.started_ms

    def duration_s(self, now_ms: int) -> float:
        end = self.end_ms() or now_ms
        return max(0.0, (end - self.start_ms) / 1000) if self.start_ms else 0.0

    @property
    def tags(self) -> dict[str, str]:
        return self.parent.tags if self.parent is not None else {}

    @property
    def overrides(self) -> list[str]:
        """The user's overrides: the launcher's list, else (a sweep started by hand) the sweep's
        own ``overrides`` tag split as a shell would, without ``resume=true``. Read back from a
        store or a file: anything but a list of strings is :class:`ConfigError` (one line)."""
        text = self.tags.get(Tag.JOB_OVERRIDES)
        if text:
            try:
                found = json.loads(text)
            except ValueError:
                found = None
            return self._strings(found, f"its tag {Tag.JOB_OVERRIDES}")
        if self.launch_file is not None:
            return self._strings(self.launch_file.overrides, "its launch file's overrides")
        text = self.tags.get(Tag.OVERRIDES, "")
        try:
            return [o for o in shlex.split(text) if o != RESUME_FLAG] if text else []
        except ValueError:  # an unbalanced quote
            return self._strings(None, f"its tag {Tag.OVERRIDES}")

    def _strings(self, found, where: str) -> list[str]:
        if not isinstance(found, list) or not all(isinstance(item, str) for item in found):
            raise ConfigError(f"job {self.job_id}: {where} is not a list of overrides (foxhunt writes a JSON list of strings)")
        return list(found)

    @property
    def has_overrides(self) -> bool:
        """Whether the job's overrides are known (an empty list is a valid one)."""
        return Tag.JOB_OVERRIDES in self.tags or self.launch_file is not None or Tag.OVERRIDES in self.tags

    @property
    def command(self) -> str:
        if self.tags.get(Tag.COMMAND):
            return self.tags[Tag.COMMAND]
        return shlex.join(self.launch_file.command) if self.launch_file else ""

    @property
    def pid(self) -> int | None:
        """The process-group leader of the job's latest launch: the launch file's (rewritten
        by every start and resume) when this machine has it, else the parent run's tag."""
        if self.launch_file is not None and self.launch_file.pid:
            return self.launch_file.pid
        text = self.tags.get(Tag.PID, "")
        return int(text) if text.isdigit() else None

    @property
    def host(self) -> str:
        if self.launch_file is not None and self.launch_file.pid:
            return self.launch_file.host
        return self.tags.get(Tag.HOST, "")

    @property
    def sweep_dir(self) -> str:
        """The sweep folder: the launcher's, else (a sweep started by hand) the sweep's own tag."""
        return (
            self.tags.get(Tag.JOB_SWEEP_DIR)
            or (self.launch_file.sweep_dir if self.launch_file else "")
            or self.tags.get(Tag.SWEEP_DIR, "")
        )

    @property
    def log(self) -> str:
        return self.tags.get(Tag.JOB_LOG) or (self.launch_file.log if self.launch_file else "")

    @property
    def error(self) -> str:
        return self.tags.get(Tag.ERROR, "")

    @property
    def skipped(self) -> list[CellResult]:
        """Cells resume=true skipped for an earlier run outside this job (parent-run tags)."""
        return skipped_cells(self.tags)

    @property
    def models(self) -> list[str]:
        names = [r.tags.get(Tag.MODEL, "") for r in self.runs] + [key.model for key in self._cell_keys()]
        return sorted({n for n in names if n})

    @property
    def assets(self) -> list[str]:
        names = [r.tags.get(Tag.ASSET, "") for r in self.runs] + [key.asset for key in self._cell_keys()]
        return sorted({n for n in names if n})

    def _cell_keys(self) -> list[CellKey]:
        return [c.key for c in self.plan] + [c.key for c in self.skipped]

    def best_sharpe(self) -> float | None:
        """The best ``val/sharpe`` of the job's cells (a skipped cell's from its earlier run)."""
        values = [r.metric(METRIC_SHARPE) for r in self.runs] + [s.metrics.get(METRIC_SHARPE) for s in self.skipped]
        finite = [v for v in values if v is not None and v == v]
        return max(finite) if finite else None

    def cells(self) -> list[JobCell]:
        """The plan's cells matched to their runs (model, asset, precision, seed), else to the
        earlier run resume=true skipped them for; then any run or skip the plan did not foresee.
        A job without a plan (launched by hand) is just its runs and skips."""
        unmatched = sorted(self.runs, key=lambda r: r.start_ms)
        skipped = {s.key.grid: s for s in self.skipped}
        cells: list[JobCell] = []
        for planned in self.plan:
            grid = planned.key.grid
            match = next((r for r in unmatched if r.cell_key().grid == grid), None)
            if match is not None:
                unmatched.remove(match)
            cells.append(JobCell(planned, match, None if match is not None else skipped.get(grid)))
            skipped.pop(grid, None)
        cells += [JobCell(None, run) for run in unmatched]
        ran = {run.cell_key().grid for run in unmatched}
        cells += [JobCell(None, None, skip) for grid, skip in skipped.items() if grid not in ran]
        return cells

    def fraction(self) -> float:
        """Overall progress: the cells' progress weighted by their expected cost."""
        cells = self.cells()
        total = sum(c.weight for c in cells)
        if self.state == Status.FINISHED:
            return 1.0
        return sum(c.weight * c.fraction() for c in cells) / total if total else 0.0

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for cell in self.cells():
            counts[str(cell.state)] = counts.get(str(cell.state), 0) + 1
        return counts


def job_state(parent: StoredRun | None, runs: list[StoredRun]) -> str:
    """The parent run's state when there is one (what the MLflow UI shows for the job), else the
    cells' together: any alive RUNNING -> RUNNING, else any STALE, FAILED, KILLED, in that order.
    A parent STALE with a cell still training (its supervisor killed alone: training goes on in
    the job's group) is RUNNING: it was shown STALE, and ``stop`` answered 'nothing to stop'."""
    if parent is not None:
        if parent.state == Status.STALE and any(r.state == Status.RUNNING for r in runs):
            return Status.RUNNING
        return parent.state
    states = {r.state for r in runs}
    for state in (Status.RUNNING, Status.STALE, Status.FAILED, Status.KILLED):
        if state in states:
            return state
    return Status.FINISHED if runs else Status.STARTING


# --------------------------------------------------------------------------------------------
# Grouping runs into jobs
# --------------------------------------------------------------------------------------------
def group_jobs(runs: list[StoredRun], host: str | None = None) -> list[Job]:
    """Runs -> jobs. A run's job is its parent's job id, else its own ``job_id`` tag, else (a
    sweep started by hand with ``foxhunt-train -m``) its parent run's id. The job's parent is
    its newest run that nests others or carries the launcher's tags. A cell's walk-forward folds
    and seeds (``foxhunt.role=fold``, :mod:`foxhunt.training.folds`) are part of it: the cell's run
    stands for them."""
    host = host or socket.gethostname()
    runs = [r for r in runs if r.tags.get(Tag.ROLE) != ROLE_FOLD]
    by_id = {r.run_id: r for r in runs}
    has_children = {r.parent_id for r in runs if r.parent_id}
    for run in runs:
        run.state = run_state(run, host)

    def is_root(run: StoredRun) -> bool:
        return not run.parent_id and (
            run.run_id in has_children or run.tags.get(Tag.RUN_KIND) == RUN_KIND_SWEEP or Tag.COMMAND in run.tags
        )

    # A parent's job id: its own tag (set by the supervisor), else its cells' (they carry it
    # from the start), else its run id (a sweep started by hand).
    child_ids: dict[str, str] = {}
    for run in runs:
        if run.parent_id and run.job_id:
            child_ids.setdefault(run.parent_id, run.job_id)

    def job_key(run: StoredRun) -> str:
        root = run if is_root(run) else by_id.get(run.parent_id) if run.parent_id else None
        if root is not None and is_root(root):
            return root.job_id or child_ids.get(root.run_id) or root.run_id
        return run.job_id or run.parent_id or run.run_id

    groups: dict[str, list[StoredRun]] = {}
    for run in runs:
        groups.setdefault(job_key(run), []).append(run)

    jobs = []
    for key, members in groups.items():
        roots = [r for r in members if is_root(r)]
        parent = max(roots, key=lambda r: r.start_ms) if roots else None
        root_ids = {r.run_id for r in roots}
        cells = _latest_per_cell([r for r in members if r.run_id not in root_ids])
        plan = _stored_plan(parent.tags.get(Tag.JOB_PLAN)) if parent is not None else []
        jobs.append(Job(key, parent, cells, plan, job_state(parent, cells)))
    return jobs


def _stored_plan(text: str | None) -> list[PlannedCell]:
    """A parent run's ``job.plan`` tag, or no plan when it is not one foxhunt writes: one damaged
    tag stopped ``train list`` and ``status`` for every job ('cannot read the MLflow store')."""
    if not text:
        return []
    try:
        cells = json.loads(text)
        return [PlannedCell.from_dict(c) for c in cells] if isinstance(cells, list) else []
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return []


def _latest_per_cell(runs: list[StoredRun]) -> list[StoredRun]:
    """A cell run twice (a resume that opened a new run instead of continuing the old one) is
    shown once, as its newest run."""
    latest: dict[tuple, StoredRun] = {}
    keyless = []
    for run in sorted(runs, key=lambda r: r.start_ms):
        grid = run.cell_key().grid
        if any(grid):
            latest[grid] = run
        else:
            keyless.append(run)
    return sorted([*latest.values(), *keyless], key=lambda r: r.start_ms)


def load_jobs(tracking_uri: str, host: str | None = None, root: Path | None = None) -> list[Job]:
    """Every job in the store; with ``root``, each with its launch file (see attach_launch_file),
    and the jobs only a launch file knows (started moments ago, or killed before their first run
    reached the store: STARTING or FAILED, as ``status`` shows them)."""
    jobs = group_jobs(open_reader(tracking_uri).job_runs(), host)
    if root is not None:
        launch_files = _launch_files(root, "")
        for job in jobs:
            attach_launch_file(job, launch_files.get(job.job_id), host)
        known = {job.job_id for job in jobs}
        jobs += [_job_from_launch_file(found) for job_id, found in sorted(launch_files.items()) if job_id not in known]
    return jobs


def find_job(tracking_uri: str, key: str, root: Path | None = None, host: str | None = None) -> Job:
    """The one job whose id (or parent run id) is ``key`` or starts with it.

    A job launched moments ago whose runs are not in the store yet is found through its launch
    file under ``<root>/outputs/jobs/`` (state STARTING, or FAILED if its process is gone).
    """
    key = key.strip()
    if not key:
        raise JobNotFound("empty job id")
    jobs = group_jobs(open_reader(tracking_uri).job_runs(key), host)
    exact = [j for j in jobs if j.job_id == key]
    matches = exact or [j for j in jobs if j.job_id.startswith(key) or (j.parent and j.parent.run_id.startswith(key))]
    launch_files = _launch_files(root, key) if root is not None else {}
    if not matches:
        file_matches = [r for job_id, r in launch_files.items() if job_id == key] or list(launch_files.values())
        if len(file_matches) == 1:
            return _job_from_launch_file(file_matches[0])
        if len(file_matches) > 1:
            raise JobNotFound(f"job id {key!r} is ambiguous: {', '.join(sorted(r.job_id for r in file_matches))}")
        raise JobNotFound(f"no job {key!r} in {tracking_uri} (foxhunt train list shows the jobs)")
    if len(matches) > 1:
        raise JobNotFound(f"job id {key!r} is ambiguous: {', '.join(sorted(j.job_id for j in matches))}")
    job = matches[0]
    attach_launch_file(job, launch_files.get(job.job_id), host)
    return job


def attach_launch_file(job: Job, launch_file: LaunchFile | None, host: str | None = None) -> None:
    """Give a job its launch file: its plan if the store has none; STARTING while the latest
    launch's supervisor lives and the store still shows the previous launch's ending (a resume
    in its first seconds); STALE for a parent left RUNNING, untagged, by a dead launch."""
    job.launch_file = launch_file
    if launch_file is None:
        return
    if not job.plan:
        job.plan = list(launch_file.plan)
    here = launch_file.host == (host or socket.gethostname())
    leader_alive = here and process_alive(launch_file.pid, launch_file.started_ms)
    parent = job.parent
    untagged = parent is not None and Tag.PID not in parent.tags
    if parent is not None and job.state == Status.RUNNING and untagged and here and not leader_alive:
        job.state = parent.state = Status.STALE  # killed before the supervisor could tag the parent
    end = job.end_ms()
    if job.state != Status.RUNNING and leader_alive and (end is None or end < launch_file.started_ms):
        job.state = Status.STARTING  # what the store shows is the previous launch's ending


def _launch_files(root: Path, key: str) -> dict[str, LaunchFile]:
    folder = jobs_dir(root)
    found = {}
    if folder.is_dir():
        for path in folder.glob(f"{_glob_escape(key)}*.json"):
            try:
                launch_file = LaunchFile.read(path)
            except (ValueError, KeyError, TypeError, OSError):
                continue
            found[launch_file.job_id] = launch_file
    return found


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def _job_from_launch_file(launch_file: LaunchFile) -> Job:
    alive = launch_file.host == socket.gethostname() and process_alive(launch_file.pid, launch_file.started_ms)
    return Job(launch_file.job_id, None, [], list(launch_file.plan), Status.STARTING if alive else Status.FAILED, launch_file)


def resumable_checkpoint_of(cell: JobCell) -> Checkpoint | None:
    """The checkpoint ``resume=true`` continues a stopped, failed or stale cell from (the same
    rule, :mod:`foxhunt.runs.checkpoints`); copies logged to a remote artifact store are not
    listed here (that needs the MLflow client), resume still finds them."""
    run = cell.run
    if run is None or run.state not in (Status.KILLED, Status.STALE, Status.FAILED):
        return None
    return resumable_checkpoint(run)


def log_tail(path: str | os.PathLike, lines: int) -> str:
    """The last ``lines`` non-empty lines of a job's log (the error of a job that never reached
    the store)."""
    try:
        tail = read_regular_file(path, LOG_TAIL_BYTES, end=True)
    except OSError:
        return ""
    text = "" if tail is None else tail.decode(errors="replace")
    return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])


def iso_time(ms: int) -> str | None:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="seconds") if ms else None


def now_ms() -> int:
    return int(time.time() * 1000)
