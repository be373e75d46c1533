"""Starting, resuming and stopping jobs: process control around ``foxhunt-train -m``.

``start`` composes and validates every cell of the grid first (a bad override fails at once,
with the config's own one-line error), then launches :mod:`foxhunt.jobs.supervisor` as the
leader of a new session (``start_new_session``: no controlling terminal, so closing the
terminal sends it nothing) with stdout and stderr in ``<root>/outputs/jobs/<job_id>.log``. The
supervisor runs ``foxhunt-train -m <overrides>`` (always a multirun, so even one cell has a
parent run), tags the job's parent run, and after training exits settles any run the training
process could not (see supervisor.py). The job id reaches every run through the environment
(``FOXHUNT_JOB_ID``, read by TrackedRun).

``stop`` sends SIGTERM to the job's process group: Lightning raises at the next step boundary,
the GracefulStop callback saves ``interrupted.ckpt``, the run ends KILLED, and the supervisor
marks the parent KILLED. ``--force`` sends SIGKILL to the group after the timeout, and this
module then marks the job's RUNNING runs KILLED itself (nobody else is left to).

``resume`` re-launches a stopped, failed or stale job with its stored overrides plus
``resume=true``, the same job id and the same sweep folder, so the sweep finds the cells'
checkpoints and continues them in the same runs. One launch of a job at a time: ``start`` and
``resume`` hold the job's lock (:mod:`foxhunt.jobs.job_lock`) and hand it to the supervisor;
``resume`` takes it before it reads the job's state for the last time, so a second resume while
the first is starting or running is refused naming the holder. What ``resume`` reads back (the
job's overrides, from its parent run's tags or its launch file, its sweep folder and its id)
comes from a store others may write: the overrides and the folder are checked by
:func:`foxhunt.config.stored.check_stored_overrides` and the id must be a plain name before
anything is composed, written or launched.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from foxhunt.config.stored import check_stored_overrides
from foxhunt.errors import ConfigError, one_line_error
from foxhunt.jobs.job_lock import LOCK_FD_FLAG, JobLock, JobLockHeld
from foxhunt.jobs.launch_file import JOB_ID_PATTERN, LaunchFile, PlannedCell, jobs_dir, open_log
from foxhunt.jobs.views import RESUME_FLAG, Job, find_job, group_jobs
from foxhunt.printable import visible
from foxhunt.runs.cell import CellKey
from foxhunt.runs.config_hash import config_hash
from foxhunt.runs.environment import JOB_ID_ENV, ROOT_ENV
from foxhunt.runs.liveness import process_alive, run_state
from foxhunt.runs.status import OK_RESULTS, Status
from foxhunt.runs.store import RunStore, open_reader
from foxhunt.runs.tags import Tag

# Lazy imports: (c) Hydra, the schema (pydantic), the grid in plan_cells: foxhunt train stop imports this module too

SWEEP_DIR_KEY = "hydra.sweep.dir"
SWEEP_SUBDIR_KEY = "hydra.sweep.subdir"  # a cell's folder under it: a stored one stays inside
#: The command lines a job's process runs (:func:`_runs_the_job`): its supervisor, or foxhunt-train.
SUPERVISOR_MODULE = "foxhunt.jobs.supervisor"
TRAIN_PROGRAM, TRAIN_MODULE = "foxhunt-train", "foxhunt.train"
MULTIRUN_FLAGS = ("-m", "--multirun")
LAUNCH_SLACK_S = 60.0  # a job's process is created within this of its launch file's time


class LaunchError(RuntimeError):
    """A job that cannot be started, resumed or stopped; the message is one line saying why."""


class NotTheJobsProcess(LaunchError):
    """The pid a job names (its launch file's, its run's tag) is another program's: not signalled."""


# --------------------------------------------------------------------------------------------
# Planning: compose and validate every cell before anything starts
# --------------------------------------------------------------------------------------------
def planned_batches(cfg) -> int:
    """Training batches the cell will run: epochs x batches per epoch, capped by max_steps.

    Agents run ``model.env.steps_per_epoch`` batches an epoch (``trainer.limit_train_batches``
    caps it); forecasters run ``limit_train_batches`` when it is a count. A fraction of an
    epoch of windows cannot be counted before the data is built: the config's
    ``jobs.batches_per_epoch_if_unknown`` stands in for it.
    """
    trainer = cfg.trainer
    limit = trainer.get("limit_train_batches")
    if cfg.model.kind == "agent":
        per_epoch = int(cfg.model.env.steps_per_epoch)
        if isinstance(limit, int) and not isinstance(limit, bool):
            per_epoch = min(per_epoch, limit)
        elif isinstance(limit, float):
            per_epoch = max(1, int(per_epoch * limit))
    elif isinstance(limit, int) and not isinstance(limit, bool):
        per_epoch = limit
    else:
        per_epoch = int(cfg.jobs.batches_per_epoch_if_unknown)
    epochs = trainer.get("max_epochs")
    max_steps = trainer.get("max_steps") or -1
    total = per_epoch * epochs if epochs is not None and epochs > 0 else None
    if max_steps > 0:
        total = min(total, max_steps) if total is not None else max_steps
    return max(1, total if total is not None else per_epoch)


def plan_cells(overrides: list[str], root: Path) -> tuple[list[PlannedCell], dict[str, str]]:
    """Compose and validate each cell; return the plan and the store settings of the job.

    A cell's weight is its planned batches x its model's ``model.expected_seconds_per_batch``
    (``conf/model/<family>.yaml``; a family that sets none: ``jobs.expected_seconds_per_batch_if_unset``).

    Raises :class:`LaunchError` with the first failing cell's overrides and the one-line error.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from foxhunt.config.compose import compose_config
    from foxhunt.config.schema import validate
    from foxhunt.sweeps.grid import expand_grid

    try:
        cells = expand_grid(overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise LaunchError(f"overrides {visible(' '.join(overrides))}: {_first_line(exc)}") from None
    plan: list[PlannedCell] = []
    store: dict[str, Any] = {}
    for cell in cells:
        try:
            cfg = compose_config(cell, root_dir=root)
            checked = validate(cfg)
            if checked.jobs is None:
                raise ConfigError("jobs: missing (a job's plan needs it: conf/train.yaml)")
        except (ConfigError, HydraException, OmegaConfBaseException, ValueError) as exc:
            label = " ".join(cell) or "(defaults)"
            raise LaunchError(f"config error in cell [{label}]: {_first_line(exc)}") from None
        steps = planned_batches(cfg)
        per_batch = checked.model.expected_seconds_per_batch
        if per_batch is None:
            per_batch = checked.jobs.expected_seconds_per_batch_if_unset
        key = CellKey.from_config(cfg, config_hash(cfg))
        plan.append(PlannedCell(key, steps=steps, weight=round(steps * per_batch, 6), overrides=list(cell)))
        if not store:
            _check_search(cfg, cell)
            store = {
                "tracking_uri": str(cfg.logger.tracking_uri),
                "experiment": str(cfg.logger.experiment),
                "artifact_location": str(cfg.logger.artifact_location or ""),
            }
    return plan, store


def _check_search(cfg, cell: list[str]) -> None:
    """A search's own settings (hydra.sweeper: n_trials, the pruner, the sampler, the searched
    keys), checked as foxhunt-train -m checks them before its parent run: a bad one was reported
    started, exit 0, and failed in the background (found by a helper probing the job CLI)."""
    from foxhunt.sweeps.search import check_search_config, is_search

    if not is_search(cfg):
        return
    try:
        check_search_config(cfg)
    except (ConfigError, ValueError) as exc:
        label = " ".join(cell) or "(defaults)"
        raise LaunchError(f"config error in cell [{label}]: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return one_line_error(exc, with_type=False, first_line=True)


# --------------------------------------------------------------------------------------------
# Start and resume
# --------------------------------------------------------------------------------------------
@dataclass
class Launched:
    job_id: str
    pid: int
    log: Path
    tracking_uri: str
    cells: int


def new_job_id() -> str:
    """Eight hex digits: short enough to type, 4 billion of them."""
    return secrets.token_hex(4)


def train_command() -> list[str]:
    """``foxhunt-train`` next to this interpreter (the installed entry point), else the module."""
    script = Path(sys.executable).with_name("foxhunt-train")
    if script.is_file():
        return [str(script)]
    found = shutil.which("foxhunt-train")
    return [found] if found else [sys.executable, "-m", "foxhunt.train"]


def start(
    overrides: list[str],
    root: Path,
    job_id: str | None = None,
    sweep_dir: str | None = None,
    resume: bool = False,
    lock: JobLock | None = None,
) -> Launched:
    """Validate the grid, then launch it in the background; return at once. The job's ``lock``
    (taken here when not given) goes to the supervisor: it is held until the launch's last
    process exits."""
    root = Path(root).resolve()
    overrides, asked = _without_resume([o for o in overrides if o not in MULTIRUN_FLAGS])
    resume = resume or asked
    plan, store = plan_cells(overrides, root)
    job_id = job_id or new_job_id()
    if lock is None:
        lock = _lock(root, job_id, "foxhunt train start")
    with lock:
        return _launch(overrides, root, job_id, sweep_dir, resume, lock, plan, store)


def _without_resume(overrides: list[str]) -> tuple[list[str], bool]:
    """The overrides without ``resume=true|false`` (any case; the launch adds it itself), and
    whether it asked for resume: ``train start ... resume=true`` was dropped unless written just
    so, and the cell trained again beside its finished run (found by a helper probing the job CLI)."""
    kept, asked = [], False
    for override in overrides:
        key, _, value = override.partition("=")
        if key == "resume" and value.strip().lower() in ("true", "false"):
            asked = asked or value.strip().lower() == "true"
            continue
        kept.append(override)
    return kept, asked


def _lock(root: Path, job_id: str, what: str) -> JobLock:
    try:
        return JobLock.acquire(root, job_id, what)
    except JobLockHeld as exc:
        raise LaunchError(str(exc)) from None


def _launch(overrides, root: Path, job_id: str, sweep_dir, resume: bool, lock: JobLock, plan, store) -> Launched:
    folder = jobs_dir(root)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"{job_id}.log"
    user_sweep_dir = next((o.split("=", 1)[1] for o in overrides if o.startswith(f"{SWEEP_DIR_KEY}=")), None)
    sweep_dir = user_sweep_dir or sweep_dir or str(root / "outputs" / "sweeps" / f"{datetime.now():%Y-%m-%d_%H-%M-%S}_{job_id}")
    _check_sweep_folder_free(root, job_id, sweep_dir)
    command = [*train_command(), "-m", *overrides]
    if not user_sweep_dir:  # one folder per job, kept on resume (two jobs may start in one second)
        command.append(f"{SWEEP_DIR_KEY}={sweep_dir}")
    if resume:
        command.append(RESUME_FLAG)
    launch_file = LaunchFile(
        job_id=job_id, pid=0, host=socket.gethostname(), command=command, overrides=overrides, log=str(log),
        tracking_uri=store["tracking_uri"], root=str(root), sweep_dir=sweep_dir,
        started_ms=int(time.time() * 1000), plan=plan, experiment=store["experiment"],
        artifact_location=store["artifact_location"],
    )  # fmt: skip
    launch_path = folder / f"{job_id}.json"
    try:  # before the launch file: a refusal leaves nothing behind
        out = open_log(log)
    except OSError as exc:
        raise LaunchError(f"job {job_id}: its log {log} cannot be opened ({exc.strerror}; a symbolic link is refused)") from None
    launch_file.write(launch_path)
    env = {**os.environ, JOB_ID_ENV: job_id, ROOT_ENV: str(root), "PYTHONUNBUFFERED": "1"}
    with out:
        out.write(f"=== {'resume' if resume else 'start'} {datetime.now().isoformat(timespec='seconds')}: "
                  f"{' '.join(command)}\n")  # fmt: skip
        out.flush()
        process = subprocess.Popen(
            [sys.executable, "-m", SUPERVISOR_MODULE, str(launch_path), LOCK_FD_FLAG, str(lock.fd), "--", *command],
            cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, pass_fds=(lock.fd,),
        )  # fmt: skip
    lock.name_holder(process.pid, "the job's supervisor")
    launch_file.pid = process.pid
    launch_file.write(launch_path)
    return Launched(job_id, process.pid, log, store["tracking_uri"], len(plan))


def _check_sweep_folder_free(root: Path, job_id: str, sweep_dir: str) -> None:
    """Refuse a sweep folder another live job of this root writes: two jobs given one
    ``hydra.sweep.dir`` wrote their cells into the same folders (a cell's checkpoints beside the
    other's, a resume loading the other job's), and the second job's parent run took the
    first's (found by a helper probing the job CLI)."""
    wanted = Path(sweep_dir).expanduser().resolve()
    here = socket.gethostname()
    for path in sorted(jobs_dir(root).glob("*.json")):
        try:
            other = LaunchFile.read(path)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if other.job_id == job_id or other.host != here or not other.sweep_dir:
            continue
        if Path(other.sweep_dir).expanduser().resolve() == wanted and process_alive(other.pid, other.started_ms):
            raise LaunchError(f"job {job_id}: its sweep folder {str(wanted)[:120]} is job {other.job_id}'s, which is "
                              f"running: name another hydra.sweep.dir, or stop it (foxhunt train stop {other.job_id})")  # fmt: skip


def resume(job: Job, root: Path, tracking_uri: str) -> Launched:
    """Continue a stopped, failed or stale job from its checkpoints, into the same runs.

    Under the job's lock, the job is read again (another launch may have started it since
    ``job`` was read) and what the store gave back is checked (module doc): a refusal is one
    line, :class:`LaunchError` or (an override that could name code)
    :class:`~foxhunt.errors.ConfigError`, and nothing has been composed, ended or launched.
    Runs the store still shows RUNNING with their process gone (STALE) are then ended KILLED
    (tag ``stop_reason=stale``): the sweep resumes them like any interrupted cell."""
    root = Path(root).resolve()
    _check_resumable(job, root)
    with _lock(root, job.job_id, "foxhunt train start --resume") as lock:
        job = _refind(job, tracking_uri, root)
        _check_resumable(job, root)
        _check_sweep_folder_owner(job, tracking_uri)
        if job.state == Status.STALE or any(r.state == Status.STALE for r in job.runs):
            settle(job, Status.KILLED, "stale", tracking_uri=tracking_uri, only_dead=True)
        return start(job.overrides, root, job_id=job.job_id, sweep_dir=job.sweep_dir or None, resume=True, lock=lock)


def _check_resumable(job: Job, root: Path) -> None:
    """Refuse (one line) a job that runs, has nothing left to do, or whose stored id, overrides
    or sweep folder are not what foxhunt would have written (module doc)."""
    if not JOB_ID_PATTERN.fullmatch(job.job_id):
        raise LaunchError(f"job id {job.job_id[:80]!r} read back from the store is not a job id (letters, digits, "
                          "'_' and '-'): refused")  # fmt: skip
    if job.state in (Status.RUNNING, Status.STARTING):
        raise LaunchError(f"job {job.job_id} is {job.state}: stop it first (foxhunt train stop {job.job_id})")
    cells = job.cells()
    if job.state == Status.FINISHED and cells and all(c.state in OK_RESULTS for c in cells):
        raise LaunchError(f"job {job.job_id} is FINISHED with every cell FINISHED: nothing to resume")
    if not job.has_overrides:
        raise LaunchError(f"job {job.job_id} has no stored overrides: start it again with foxhunt train start")
    folder = [f"{SWEEP_DIR_KEY}={job.sweep_dir}"] if job.sweep_dir else []
    check_stored_overrides([*job.overrides, *folder], origin=f"job {job.job_id}")
    for override in [*job.overrides, *folder]:
        key, _, value = override.partition("=")
        key = key.lstrip("+~")  # ++hydra.sweep.dir=... sets it as well
        if key == SWEEP_DIR_KEY:
            _check_sweep_folder(job.job_id, Path(value), root)
        elif key == SWEEP_SUBDIR_KEY and (Path(value).is_absolute() or ".." in Path(value).parts):
            raise LaunchError(f"job {job.job_id}: its stored {SWEEP_SUBDIR_KEY}={value[:120]!r} leaves the sweep folder "
                              "(absolute, or '..'): refused; start the grid again with foxhunt train start")  # fmt: skip


def _check_sweep_folder_owner(job: Job, tracking_uri: str) -> None:
    """Refuse a stored sweep folder that another job's sweep wrote (its parent run names it): a
    job whose job.sweep_dir tag was edited to another job's folder reopened that job's parent run
    and rewrote its records and summary (found by a helper probing the job CLI)."""
    if not job.sweep_dir:
        return
    wanted = Path(job.sweep_dir).expanduser().resolve()
    for other in group_jobs(open_reader(tracking_uri).job_runs()):
        if other.job_id == job.job_id or other.parent is None:
            continue
        theirs = other.parent.tags.get(Tag.SWEEP_DIR) or ""
        if theirs and Path(theirs).expanduser().resolve() == wanted:
            raise LaunchError(f"job {job.job_id}: its stored sweep folder {str(wanted)[:120]} is job {other.job_id}'s "
                              "(its parent run names it): refused; start the grid again with foxhunt train start")  # fmt: skip


def _check_sweep_folder(job_id: str, folder: Path, root: Path) -> None:
    """A sweep folder read back from the store is one the job may write: inside the root folder,
    or one a sweep already wrote (its Hydra ``multirun.yaml``: the folder a user chose outside
    the root when starting the job); a record planted to have a resume write elsewhere is refused."""
    resolved, inside = folder.expanduser().resolve(), Path(root).resolve()
    if resolved.is_relative_to(inside) or (resolved / "multirun.yaml").is_file():
        return
    raise LaunchError(f"job {job_id}: its stored sweep folder {str(folder)[:120]!r} is outside {inside} and holds no sweep "
                      "(multirun.yaml): refused; start the grid again with foxhunt train start")  # fmt: skip


# --------------------------------------------------------------------------------------------
# Stop
# --------------------------------------------------------------------------------------------
@dataclass
class StopResult:
    job_id: str
    exited: bool
    forced: bool
    waited_s: float


def check_stoppable(job: Job) -> int:
    """The job's process id; :class:`LaunchError` unless the job runs, on this host, with a live process."""
    if job.state not in (Status.RUNNING, Status.STARTING):
        raise LaunchError(f"job {job.job_id} is {job.state}: nothing to stop")
    if job.host and job.host != socket.gethostname():
        raise LaunchError(f"job {job.job_id} runs on host {job.host}: stop it there")
    pid = job.pid
    launched = job.launch_file is not None and bool(job.launch_file.pid)  # the pid is a launch file's, not a run tag's
    if pid is None or not process_alive(pid, job.launch_file.started_ms if job.launch_file else None):
        if pid is not None and _orphans(pid, job.job_id, launched):  # its supervisor killed alone: training runs on
            return pid
        raise LaunchError(f"job {job.job_id}: its process (pid {pid}) is gone: it is stale, resume it")
    problem = _not_the_jobs_process(
        pid, job.launch_file.started_ms if job.launch_file is not None and job.launch_file.pid else None, job.job_id
    )
    if problem:
        raise NotTheJobsProcess(f"job {job.job_id}: pid {pid} is not the job's process ({problem}): not signalled")
    return pid


def _orphans(leader: int, job_id: str, launched: bool = False) -> list[psutil.Process]:
    """The live processes of the process group ``leader`` led, once ``leader`` is gone, where one
    of them runs job ``job_id`` (:func:`_runs_the_job`): a job whose supervisor was killed alone
    (``kill -9`` of one pid) still trains in the group :func:`start` began; nothing otherwise.
    ``launched`` (the leader is a launch file's): one must carry the job's id in its environment."""
    members = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if process.pid != leader and os.getpgid(process.pid) == leader and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process)
        except (ProcessLookupError, psutil.Error):
            continue
    owners = (job_id,) if launched else (None, job_id)
    ours = [p for p in members if _runs_the_job(p.info["cmdline"] or [], job_id) and _job_of(p) in owners]
    return members if ours else []


def _group_alive(pid: int, job_id: str) -> bool:
    """The job's leader, or what its group still runs without it (:func:`_orphans`)."""
    return process_alive(pid) or bool(_orphans(pid, job_id))


def _not_the_jobs_process(pid: int, started_ms: int | None, job_id: str) -> str:
    """Why process ``pid`` is not job ``job_id``'s (empty when it is): it must be that job's
    supervisor or a ``foxhunt-train`` sweep (:func:`_runs_the_job`) and, for a pid from a launch
    file, created within :data:`LAUNCH_SLACK_S` of the launch."""
    try:
        process = psutil.Process(pid)
        argv = process.cmdline()
        created_ms = process.create_time() * 1000
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return "it is gone"
    except psutil.AccessDenied:
        return "its command line cannot be read"
    if not _runs_the_job(argv, job_id):
        return f"it runs {' '.join(argv)[:80]!r}"
    other = _job_of(process)
    if other is not None and other != job_id:  # a planted launch file naming another job's training
        return f"it trains job {other[:64]!r}"
    if other is None and started_ms is not None:  # a launch file's pid: start gave its process the job's id; a
        # planted file naming a colleague's foxhunt-train (no job id) had it stopped (found by a helper probing jobs)
        return f"its environment names no job ({JOB_ID_ENV}): not a process foxhunt train start launched"
    if started_ms is not None and abs(created_ms - started_ms) > LAUNCH_SLACK_S * 1000:
        when = datetime.fromtimestamp(created_ms / 1000).isoformat(timespec="seconds")
        return f"it started at {when}, not when the job was launched"
    return ""


def _job_of(process: psutil.Process) -> str | None:
    """The job a process was launched for (``FOXHUNT_JOB_ID`` in its environment, which
    :func:`start` sets for the supervisor and everything it starts); None when it has none (a
    sweep started by hand) or it cannot be read."""
    try:
        return process.environ().get(JOB_ID_ENV)
    except psutil.Error:
        return None


def _runs_the_job(argv: list[str], job_id: str) -> bool:
    """Whether a command line is one a job runs as: its supervisor (``python -m
    foxhunt.jobs.supervisor <root>/outputs/jobs/<job_id>.json``, as :func:`start` launches it) or
    ``foxhunt-train`` (a sweep started by hand, whose parent run names its process). The words
    alone, not a substring of the line: ``foxhunt ui``, ``foxhunt ensemble serve`` or a ``tail -f
    foxhunt-notes.txt`` a record names is not signalled."""
    if any(Path(part).name == TRAIN_PROGRAM for part in argv[:2]):
        return True
    supervised = any(a == "-m" and b in (SUPERVISOR_MODULE, TRAIN_MODULE) for a, b in zip(argv, argv[1:]))
    if supervised and SUPERVISOR_MODULE in argv:
        return any(Path(part).name == f"{job_id}.json" for part in argv)
    return supervised


def stop(job: Job, tracking_uri: str, timeout_s: float, force: bool, poll_s: float) -> StopResult:
    """SIGTERM to the job's process group, wait for it to exit; SIGKILL after ``timeout_s``
    with ``force``. Runs left RUNNING by a killed or unsupervised process are marked KILLED."""
    pid = check_stoppable(job)
    started = time.monotonic()
    _signal(pid, signal.SIGTERM)
    forced = False
    while _group_alive(pid, job.job_id) and time.monotonic() - started < timeout_s:
        time.sleep(poll_s)
    if _group_alive(pid, job.job_id) and force:
        _signal(pid, signal.SIGKILL)
        forced = True
        deadline = time.monotonic() + timeout_s
        while _group_alive(pid, job.job_id) and time.monotonic() < deadline:
            time.sleep(poll_s)
    exited = not _group_alive(pid, job.job_id)
    if exited:  # whatever the supervisor could not settle (it was killed, or there was none)
        fresh = _refind(job, tracking_uri)
        settle(fresh, Status.KILLED, "SIGKILL" if forced else "SIGTERM", tracking_uri=tracking_uri, only_dead=True)
    return StopResult(job.job_id, exited, forced, time.monotonic() - started)


def _signal(pid: int, signum: int) -> None:
    """Signal the process group the job leads; if it leads none (a sweep started by hand shares
    its shell's group, which is not ours to signal), the process and its descendants: the
    parallel strategy's worker processes train the cells, and each must get the signal to save
    its ``interrupted.ckpt`` (descendants first, so none is orphaned before it is signalled)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
            return
    except ProcessLookupError:  # the leader is gone: its group, where what it started runs on (check_stoppable)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signum)
        return

    try:
        leader = psutil.Process(pid)
        processes = [*reversed(leader.children(recursive=True)), leader]
    except psutil.NoSuchProcess:
        return
    for process in processes:
        try:
            process.send_signal(signum)
        except psutil.NoSuchProcess:
            pass


def _refind(job: Job, tracking_uri: str, root: Path | None = None) -> Job:
    """The job as the store (and its launch file under ``root``, else the one it was launched
    from) shows it now; ``job`` itself when it cannot be found again."""
    if root is None and job.launch_file is not None:
        root = Path(job.launch_file.root)
    try:
        return find_job(tracking_uri, job.job_id, root=root)
    except LookupError:
        return job


def settle(job: Job, status: str, reason: str, tracking_uri: str | None, only_dead: bool) -> list[str]:
    """End the job's RUNNING runs (parent and cells) with ``status``; with ``only_dead``, only
    those whose process is gone. Returns the run ids changed."""
    runs = [r for r in ([job.parent] if job.parent else []) + job.runs if r.status == Status.RUNNING]
    if only_dead:  # as the views show them: a RUNNING run of another host is not ours to end
        runs = [r for r in runs if run_state(r) == Status.STALE]
    if not runs:
        return []
    uri = tracking_uri or (job.launch_file.tracking_uri if job.launch_file else None)
    if uri is None:
        raise LaunchError(f"job {job.job_id}: no tracking URI to settle its runs")
    store = RunStore(uri)
    for run in runs:
        store.end(run.run_id, status, {Tag.STOP_REASON: reason})
    return [r.run_id for r in runs]
