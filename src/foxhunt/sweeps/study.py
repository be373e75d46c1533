"""The study of a search sweep: its settings, its database, and how a search continues it.

A search sweep (``hparams_search=<model>_optuna``, the sweeper of
:mod:`hydra_plugins.foxhunt_optuna_sweeper`) keeps its Optuna study in a database, never in
memory, so that a search outlives the process that runs it:

- **Where.** ``hydra.sweeper.storage`` (a SQLAlchemy URL); null, the default, puts it beside
  the MLflow store: ``sqlite:///<folder of mlflow.db>/optuna.db`` (:data:`STUDY_DB`). It cannot
  be MLflow's own database: Optuna and MLflow both keep their schema version in a table named
  ``alembic_version``. With an MLflow server (``logger.tracking_uri=http://...``) the study's
  database must be named (e.g. ``postgresql://user@host/optuna``, a database of its own on the
  server's PostgreSQL): every worker reports to it, and a SQLite file on a shared disk breaks
  under concurrent writers. ``optuna-dashboard <storage>`` shows the study.
- **Continuing.** A search opens its study by name (``hydra.sweeper.study_name``) and goes on
  where it stopped: rerunning the same command, with or without ``resume=true``, continues the
  same study; no trial that ended is run again, and trial numbers go on from the last.
  ``hydra.sweeper.n_trials`` is the size of the study, not of one launch: a launch asks for
  trials until the study holds that many that ended (:func:`counted`: finished, pruned, or
  failed, except a failure that was retried), so a search that already has them launches none.
- **Launches at once.** Two launches on one study (two terminals, a SLURM array) each count the
  trials the study holds and ask for the rest, and the first to touch a fresh database creates
  its tables. :func:`study_lock` makes each of these one step per study database on a host (an
  exclusive ``flock`` on ``<database>.lock`` beside a SQLite study): two launches racing for
  the last slot cannot both take it (both did: the study ended with ``n_trials + 1``), and the
  second launch on a fresh database waits for the first's tables (it failed on their version
  row). A server database (PostgreSQL) has no file to lock: with an MLflow server store the lock
  is held there, for launches on every host (:mod:`foxhunt.runs.server_lock`).
- **Trials left RUNNING** by a process that died (``kill -9``, out of memory, a rebooted host)
  are settled when the next launch opens the study (:func:`settle_stale`). A trial is stale when
  the sweep process that asked for it is gone from this host (its ``host``, ``pid`` and process
  creation time, kept in the trial's system attributes), or, asked on another host, when that
  process's heartbeat (written every ``hydra.sweeper.heartbeat_s`` while the trial runs) is older
  than ``hydra.sweeper.grace_s``. A stale trial whose job had finished (its ``cell.json`` in the
  sweep folder says FINISHED) is told with its values: nothing that finished is lost. Any
  other stale trial, and a trial whose job a stop request ended, is told FAILED (user attribute
  ``fail_reason``) and **retried by this rule**: its parameters are enqueued as a new trial
  (user attribute ``retry_of``), at most ``hydra.sweeper.max_retries`` times along one chain of
  retries. With ``resume=true`` the retry has the same config hash as the trial it retries, so
  its run continues the interrupted MLflow run from its last checkpoint (:mod:`foxhunt.runs.resume`).
  A failure that was retried does not count towards ``n_trials`` (its retry does).
- **Honest counting.** Every trial that ended counts in the deflated Sharpe ratio's number of
  trials (:func:`trial_counts`): finished, pruned and failed alike (a retried failure is the
  same configuration tried again: it counts once, through its retry).

Each trial's job finds its study through ``study.json`` in the sweep folder
(:class:`StudyFile`: the storage, the study's name and the pruner), which the sweeper writes
before the first trial starts, and its trial by its Hydra job number, which the sweeper makes
the trial's Optuna number (:mod:`foxhunt.sweeps.pruning`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import optuna
import psutil
from omegaconf import DictConfig, OmegaConf
from optuna.trial import TrialState

from foxhunt.errors import ConfigError, UserError, one_line_error
from foxhunt.runs.cell import CELL_RESULT_FILE, CellResult
from foxhunt.runs.environment import sqlite_path
from foxhunt.runs.leaderboard import METRIC_DIRECTIONS
from foxhunt.runs.status import OK_RESULTS, Status
from foxhunt.runs.store import RunStore
from foxhunt.runs.tags import Tag

log = logging.getLogger(__name__)

STUDY_DB = "optuna.db"  # the study's SQLite file, beside the MLflow store's mlflow.db
STUDY_FILE = "study.json"  # in the sweep folder: what each trial's job reads to find its study
PRUNERS = ("none", "median", "hyperband")
MAXIMIZE, MINIMIZE = "maximize", "minimize"
SELECTION_PREFIX = "val/"  # objectives are validation metrics: the test split never reaches a search
FOLD_MEAN_SUFFIX = "_fold_mean"  # a walk-forward cell's mean across folds (foxhunt.training.folds)
WALK_FORWARD = "walk_forward"
SQLITE_TIMEOUT_S = 60  # a write waits this long for another process's lock on a SQLite study

# What a trial records (user attributes: shown by optuna-dashboard; system attributes: bookkeeping).
OWNER = "foxhunt.owner"  # system: {"host", "pid", "created"} of the sweep process that asked for the trial
HEARTBEAT = "foxhunt.heartbeat"  # system: time.time() of that process's last sign of life for the trial
SWEEP_DIR = "foxhunt.sweep_dir"  # system: the sweep folder of the launch that asked for the trial (its cell.json)
FAIL_REASON = "fail_reason"  # user: why a trial FAILED
RETRY_OF = "retry_of"  # user: the number of the trial this one retries (same parameters)
PRUNED_AT = "pruned_at"  # user: the validation step at which the pruner stopped the trial (set by its job)
RUN_ID = "run_id"  # user: the trial's MLflow run
CELL = "cell"  # user: model-asset-precision-seed of the trial's config
OUTPUT_DIR = "output_dir"  # user: the trial's folder (its cell.json)
# A trial's state in the summary besides a run's status (foxhunt.runs.status): the study's pruner
# stopped it; it failed (its process died, or a stop ended it) and a later trial retried it.
# Neither is a failure of the sweep; RUNNING there is a trial another live process runs.
PRUNED, RETRIED = "PRUNED", "RETRIED"


class StudyError(UserError):
    """A study database that cannot be opened, or a study that does not match the search."""

    kind = "store"


@dataclass(frozen=True)
class PrunerSpec:
    """``hydra.sweeper.pruner`` and ``hydra.sweeper.pruning``: which pruner stops hopeless trials."""

    name: str = "none"  # none | median | hyperband
    startup_trials: int = 5  # median: trials that must end before any is pruned
    warmup_steps: int = 1  # median: validations of a trial before it may be pruned; hyperband: min_resource
    reduction_factor: int = 3  # hyperband

    def build(self):
        """The Optuna pruner (``NopPruner`` for none)."""
        if self.name == "median":
            return optuna.pruners.MedianPruner(n_startup_trials=self.startup_trials, n_warmup_steps=self.warmup_steps)
        if self.name == "hyperband":
            return optuna.pruners.HyperbandPruner(min_resource=max(1, self.warmup_steps), reduction_factor=self.reduction_factor)
        return optuna.pruners.NopPruner()


@dataclass(frozen=True)
class StudySettings:
    """A search's study, as ``hydra.sweeper`` configures it (checked by :func:`settings_from`)."""

    name: str
    storage: str
    objectives: tuple[str, ...]
    directions: tuple[str, ...]
    n_trials: int
    n_jobs: int
    max_failure_rate: float
    max_retries: int
    pruner: PrunerSpec
    barrier: bool = False
    heartbeat_s: float = 30.0
    grace_s: float = 300.0
    walk_forward: bool = False
    server: str | None = None  # the MLflow server store (logger.tracking_uri) that holds a server study's lock

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1


def _key_error(key: str, value: Any, rule: str) -> ConfigError:
    return ConfigError(f"hydra.sweeper.{key}={value}: {rule}")


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _direction_name(value: Any) -> str:
    name = getattr(value, "name", None)  # an Optuna StudyDirection
    return (name if isinstance(name, str) else str(value)).rsplit(".", 1)[-1].lower()


def storage_url(config: DictConfig) -> str:
    """The study's database (module doc): ``hydra.sweeper.storage``, else beside the MLflow store."""
    given = config.hydra.sweeper.get("storage")
    if given is not None and str(given).strip():
        url = str(given).strip()
        if "://" not in url:
            raise _key_error("storage", url, "expected a database URL, e.g. sqlite:///mlruns/optuna.db or "
                                             "postgresql://user@host/optuna (null: mlruns/optuna.db beside the MLflow store)")  # fmt: skip
        if url.endswith("/mlflow.db"):
            raise _key_error("storage", url, "not MLflow's own database (both keep an alembic_version table); "
                                             f"use a file of its own, e.g. {url[: -len('mlflow.db')]}{STUDY_DB}")  # fmt: skip
        return url
    logger = config.logger
    if not logger.enabled:
        return f"sqlite:///{Path(str(config.paths.mlruns_dir)).resolve() / STUDY_DB}"
    database = sqlite_path(str(logger.tracking_uri))
    if database is None:
        raise _key_error("storage", "null", f"the MLflow store {logger.tracking_uri} is a server: name the study's database, "
                                            "e.g. hydra.sweeper.storage=postgresql://user@host/optuna (a database of its own)")  # fmt: skip
    return f"sqlite:///{database.resolve().parent / STUDY_DB}"


def _int_setting(sweeper, key: str, default: int, low: int) -> int:
    value = sweeper.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _key_error(key, value, f"must be an integer >= {low}")
    return int(value)


def _number_setting(sweeper, key: str, default: float, low: float, high: float | None = None) -> float:
    value = sweeper.get(key, default)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= low
    if not ok or (high is not None and value > high):
        allowed = f"a number in [{low}, {high}]" if high is not None else f"a number >= {low}"
        raise _key_error(key, value, f"must be {allowed}")
    return float(value)


def pruner_spec(sweeper) -> PrunerSpec:
    name = sweeper.get("pruner") or "none"
    if str(name) not in PRUNERS:
        raise _key_error("pruner", name, f"must be one of {', '.join(PRUNERS)}")
    pruning = sweeper.get("pruning") or {}
    values = {}
    for key, low in (("startup_trials", 0), ("warmup_steps", 0), ("reduction_factor", 2)):
        value = pruning.get(key, getattr(PrunerSpec, key))
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise _key_error(f"pruning.{key}", value, f"must be an integer >= {low}")
        values[key] = int(value)
    return PrunerSpec(str(name), **values)


def settings_from(config: DictConfig) -> StudySettings:
    """The search's study settings, each checked; a bad one is a :class:`ConfigError` naming its key."""
    sweeper = config.hydra.sweeper
    name = sweeper.get("study_name")
    if name is None or not str(name).strip():
        raise _key_error("study_name", name, "a search needs a study name (the study in its database goes on under it)")
    objectives = [str(o) for o in _as_list(sweeper.get("objectives") or ["val/sharpe"])]
    directions = [_direction_name(d) for d in _as_list(sweeper.get("direction"))]
    if len(directions) != len(objectives):
        raise _key_error(
            "direction", directions, f"needs one direction per objective ({len(objectives)}: {', '.join(objectives)})"
        )
    for objective, goal in zip(objectives, directions):
        if not objective.startswith(SELECTION_PREFIX):
            raise _key_error("objectives", objectives, f"{objective}: a search optimizes validation metrics ({SELECTION_PREFIX}...); "
                                                       "the test split never selects anything")  # fmt: skip
        if goal not in (MAXIMIZE, MINIMIZE):
            raise _key_error("direction", directions, "each direction must be maximize or minimize")
        known = METRIC_DIRECTIONS.get(objective.rsplit("/", 1)[-1])
        if known is not None and (known == "max") != (goal == MAXIMIZE):
            raise _key_error("direction", directions, f"{objective} is better {'higher' if known == 'max' else 'lower'}: "
                                                      f"{'maximize' if known == 'max' else 'minimize'} it")  # fmt: skip
    if len(set(objectives)) != len(objectives):
        raise _key_error("objectives", objectives, "each objective once")
    pruner = pruner_spec(sweeper)
    if pruner.name != "none" and len(objectives) > 1:
        raise _key_error("pruner", pruner.name, "Optuna prunes single-objective studies only; with several objectives use none")
    walk_forward = str(OmegaConf.select(config, "evaluation.protocol", default="single")) == WALK_FORWARD
    if walk_forward and any(o != "val/sharpe" for o in objectives):
        raise _key_error("objectives", objectives, "under evaluation.protocol=walk_forward a search optimizes the mean across "
                                                   "folds, which the cell logs for val/sharpe only (val/sharpe_fold_mean)")  # fmt: skip
    logger = config.logger
    server = str(logger.tracking_uri) if logger.enabled and sqlite_path(str(logger.tracking_uri)) is None else None
    settings = StudySettings(
        server=server,
        name=str(name).strip(),
        storage=storage_url(config),
        objectives=tuple(objectives),
        directions=tuple(directions),
        n_trials=_int_setting(sweeper, "n_trials", 20, 1),
        n_jobs=_int_setting(sweeper, "n_jobs", 1, 1),
        max_failure_rate=_number_setting(sweeper, "max_failure_rate", 0.0, 0.0, 1.0),
        max_retries=_int_setting(sweeper, "max_retries", 1, 0),
        pruner=pruner,
        barrier=bool(sweeper.get("barrier", False)),
        heartbeat_s=_number_setting(sweeper, "heartbeat_s", 30.0, 0.1),
        grace_s=_number_setting(sweeper, "grace_s", 300.0, 1.0),
        walk_forward=walk_forward,
    )
    if settings.grace_s <= settings.heartbeat_s:
        raise _key_error("grace_s", settings.grace_s, f"must be longer than hydra.sweeper.heartbeat_s ({settings.heartbeat_s})")
    return settings


# -- the database ----------------------------------------------------------------------------
LOCK_SUFFIX = ".lock"


@contextmanager
def study_lock(url: str, server: str | None = None) -> Iterator[None]:
    """One step at a time among the launches on the study database ``url`` (module doc:
    Launches at once): held while a launch creates the database or the study, and while it counts
    the trials it wants and asks for them. Not reentrant. A SQLite study's is an ``flock`` the
    kernel drops when its holder exits, ``kill -9`` included, so it cannot go stale; a server
    study's is held on the MLflow server store ``server`` for every host
    (:mod:`foxhunt.runs.server_lock`: one a holder killed left lapses after its lease), named
    by a digest of the URL (which may carry a password); without one, none."""
    if not url.startswith("sqlite:///"):
        if server is None:
            yield
            return
        with RunStore(server).exclusive("study-" + hashlib.sha256(url.encode()).hexdigest()[:16]):
            yield
        return
    path = Path(url[len("sqlite:///") :] + LOCK_SUFFIX)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError:  # a folder this process may only read: nothing it does there needs the lock
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the flock


def open_storage(url: str, heartbeat: bool = False, server: str | None = None):
    """Optuna's RDB storage at ``url`` (its SQLite file's folder made; a write waits for another
    process's lock up to :data:`SQLITE_TIMEOUT_S`); a database that cannot be opened is one line.
    ``server``: :func:`study_lock`'s."""
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :])
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StudyError(f"hydra.sweeper.storage={url}: cannot make {path.parent}: {exc.strerror or exc}") from None
        engine_kwargs = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    with study_lock(url, server):  # a fresh database's tables made by one launch, not two at once
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
        except Exception as exc:  # a driver that is missing, a server that refuses, a file that is no database
            raise StudyError(
                f"hydra.sweeper.storage={url}: cannot open the study's database: {one_line_error(exc, limit=300)}"
            ) from None


#: optuna's direction literals by name (settings_from checked each is one)
_DIRECTIONS: dict[str, Literal["minimize", "maximize"]] = {"minimize": "minimize", "maximize": "maximize"}


def open_study(settings: StudySettings, sampler=None, pruner=None, storage=None):
    """The study ``settings.name`` in its database, created on first use, else continued; a
    study of that name with other directions is refused in one line."""
    storage = storage if storage is not None else open_storage(settings.storage, server=settings.server)
    try:
        with study_lock(settings.storage, settings.server):
            study = optuna.create_study(storage=storage, study_name=settings.name, directions=[_DIRECTIONS[d] for d in settings.directions],
                                        sampler=sampler, pruner=pruner if pruner is not None else settings.pruner.build(),
                                        load_if_exists=True)  # fmt: skip
    except Exception as exc:  # a database of other tables, a damaged file: optuna's and SQLAlchemy's errors
        if not type(exc).__module__.startswith(("optuna", "sqlalchemy", "sqlite3")):
            raise
        raise StudyError(f"hydra.sweeper.storage={settings.storage}: not a study database optuna can use "
                         f"({one_line_error(exc, first_line=True, limit=200)})") from None  # fmt: skip
    found = tuple(_direction_name(d) for d in study.directions)
    if found != settings.directions:
        raise StudyError(f"hydra.sweeper.study_name={settings.name}: the study in {settings.storage} has direction "
                         f"{', '.join(found)}, this search {', '.join(settings.directions)} (name another study)")  # fmt: skip
    return study


@dataclass(frozen=True)
class StudyFile:
    """``study.json`` in the sweep folder: how a trial's job finds its study (module doc)."""

    storage: str
    study_name: str
    pruner: dict = field(default_factory=dict)
    multi_objective: bool = False

    @classmethod
    def of(cls, settings: StudySettings) -> StudyFile:
        return cls(settings.storage, settings.name, asdict(settings.pruner), settings.multi_objective)

    def write(self, sweep_dir: Path) -> Path:
        path = Path(sweep_dir) / STUDY_FILE
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True))
        return path

    @classmethod
    def read(cls, sweep_dir: Path) -> StudyFile | None:
        """The file the sweeper wrote; None without one (a grid sweep, or a job outside a sweep).
        A file that is not one is an error naming it (trust nothing foxhunt did not just write)."""
        path = Path(sweep_dir) / STUDY_FILE
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
            return cls(str(data["storage"]), str(data["study_name"]), dict(data.get("pruner") or {}),
                       bool(data.get("multi_objective", False)))  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise StudyError(f"{path}: not a study file the sweeper wrote ({one_line_error(exc, limit=200)})") from None

    def pruner_spec(self) -> PrunerSpec:
        return PrunerSpec(**{k: v for k, v in self.pruner.items() if k in PrunerSpec.__dataclass_fields__})


# -- the process that owns a running trial ---------------------------------------------------
def process_identity() -> dict[str, Any]:
    """This process, as a trial's owner: host, pid and creation time (a reused pid is another process)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "created": round(psutil.Process().create_time(), 3)}


def owner_alive(owner: Mapping[str, Any]) -> bool | None:
    """Whether the process ``owner`` names still runs: True / False on this host, None elsewhere
    (it cannot be checked from here: its heartbeat decides)."""
    if owner.get("host") != socket.gethostname():
        return None
    try:
        process = psutil.Process(int(owner.get("pid") or 0))
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(process.create_time() - float(owner.get("created") or 0)) < 1.0
    except (psutil.NoSuchProcess, psutil.ZombieProcess, ValueError):
        return False
    except psutil.AccessDenied:
        return True


def claim(study, trial_id: int, owner: Mapping[str, Any], sweep_dir: Path) -> None:
    """Record the process that runs trial ``trial_id`` and the sweep folder its result goes to."""
    storage = study._storage
    storage.set_trial_system_attr(trial_id, OWNER, dict(owner))
    storage.set_trial_system_attr(trial_id, SWEEP_DIR, str(Path(sweep_dir).resolve()))
    storage.set_trial_system_attr(trial_id, HEARTBEAT, time.time())


def beat(study, trial_ids: Iterable[int]) -> None:
    """A heartbeat for each running trial of this process."""
    now = time.time()
    for trial_id in trial_ids:
        try:
            study._storage.set_trial_system_attr(trial_id, HEARTBEAT, now)
        except Exception:  # the trial ended meanwhile (an attribute of a finished trial is refused)
            log.debug("no heartbeat for trial %s", trial_id, exc_info=True)


def is_stale(
    trial, grace_s: float, alive: Callable[[Mapping[str, Any]], bool | None] = owner_alive, now: float | None = None
) -> bool:
    """A RUNNING trial whose owner is gone (module doc). A trial without an owner is stale once
    it is older than ``grace_s``: a search claims each trial it asks within milliseconds, so an
    owner missing that long means its process died between the two (left RUNNING for good
    before, and told as a phantom to the sampler's constant liar ever after)."""
    owner = trial.system_attrs.get(OWNER)
    if not isinstance(owner, Mapping):
        started = trial.datetime_start.timestamp() if trial.datetime_start is not None else None
        return started is not None and (now or time.time()) - started > grace_s
    verdict = alive(owner)
    if verdict is not None:
        return not verdict
    last = trial.system_attrs.get(HEARTBEAT)
    if isinstance(last, bool) or not isinstance(last, (int, float)) or not math.isfinite(last):
        return True
    age = (now or time.time()) - float(last)
    # a heartbeat more than grace_s ahead of this clock is no heartbeat (an edited record, 1e18 or NaN, kept a dead
    # trial RUNNING for good: found by a helper probing searches); clocks of two hosts differ by far less
    return age > grace_s or age < -grace_s


# -- counting ------------------------------------------------------------------------------
def retried_numbers(trials: Sequence) -> set[int]:
    """Numbers of the trials that another trial retries."""
    found = set()
    for trial in trials:
        value = trial.user_attrs.get(RETRY_OF)
        if isinstance(value, int) and not isinstance(value, bool):
            found.add(value)
    return found


def counted(trials: Sequence) -> list:
    """The trials that count towards ``n_trials`` and in the deflated Sharpe ratio: every trial
    that ended (COMPLETE, PRUNED, FAIL), except a failure that a later trial retries."""
    retried = retried_numbers(trials)
    ended = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return [t for t in trials if t.state in ended and not (t.state == TrialState.FAIL and t.number in retried)]


@dataclass(frozen=True)
class TrialCounts:
    finished: int
    pruned: int
    failed: int

    @property
    def total(self) -> int:
        return self.finished + self.pruned + self.failed

    def describe(self) -> str:
        return f"{self.total} trials ({self.finished} finished, {self.pruned} pruned, {self.failed} failed)"


def trial_counts(trials: Sequence) -> TrialCounts:
    kept = counted(trials)
    return TrialCounts(*(sum(1 for t in kept if t.state == s) for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)))


def retry_depth(trials_by_number: Mapping[int, Any], trial) -> int:
    """How many retries lead to ``trial`` (0: an original trial)."""
    depth, seen = 0, {trial.number}
    while isinstance(origin := trial.user_attrs.get(RETRY_OF), int) and origin in trials_by_number and origin not in seen:
        depth, trial = depth + 1, trials_by_number[origin]
        seen.add(origin)
    return depth


def check_space(study, settings: StudySettings, space: Mapping[str, Any], fixed: Iterable[str] = ()) -> None:
    """The study continued is this search's: each parameter its trials hold is searched here, with
    a distribution of the same kind, or fixed on the command line (``fixed``: keys). A PPO search given a DQN study's name ran its trials into
    it, and a trial of other parameters became the study's best (found by a helper)."""
    held: dict[str, Any] = {}
    for trial in study.get_trials(deepcopy=False):
        held.update(trial.distributions)
    foreign = sorted(set(held) - set(space) - set(fixed))
    where = f"hydra.sweeper.study_name={settings.name}: the study in {settings.storage}"
    if foreign:
        raise StudyError(f"{where} holds trials of another search (parameters {', '.join(foreign)} are not searched here: "
                         f"{', '.join(sorted(space))}); name another study")  # fmt: skip
    for name, distribution in held.items():
        if name not in space:
            continue
        try:
            optuna.distributions.check_distribution_compatibility(distribution, space[name])
        except ValueError as exc:
            raise StudyError(f"{where} searched {name} as {distribution}, this search as {space[name]} ({exc}); "
                             "name another study") from None  # fmt: skip


OPTUNA_FIXED_PARAMS = "fixed_params"  # where study.enqueue_trial keeps a waiting trial's values (Optuna's system attr)


def fail_enqueued_outside(study, space: Mapping[str, Any]) -> list[str]:
    """Each trial waiting in the study (``study.enqueue_trial``) with a value outside this search's
    space is failed with its reason before it is asked, one line each: Optuna only warned, and the
    trial trained on the value (found by a helper probing searches). Call under the study lock."""
    lines = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        fixed = trial.system_attrs.get(OPTUNA_FIXED_PARAMS) or {}
        outside = []
        for name, value in fixed.items():
            distribution = space.get(name)
            if distribution is None:
                continue
            try:
                inside = distribution._contains(distribution.to_internal_repr(value))
            except (ValueError, TypeError):  # not even of the distribution's kind
                inside = False
            if not inside:
                outside.append(f"{name}={value!r} outside {distribution}")
        if outside:
            reason = f"enqueued with {'; '.join(outside)}: not trained"
            study._storage.set_trial_user_attr(trial._trial_id, FAIL_REASON, reason)
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            lines.append(f"trial {trial.number}: {reason}")
    return lines


def fail_and_retry(study, trial, reason: str, max_retries: int) -> int | None:
    """Tell ``trial`` FAILED with ``reason`` and, within ``max_retries`` along its chain, enqueue
    its parameters as a new trial (module doc), once: a retry already enqueued is the retry.
    Returns the retry's number, or None."""
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    study._storage.set_trial_user_attr(trial._trial_id, FAIL_REASON, reason)
    # a retry enqueued already (a process killed between the enqueue and the tell below): that one, not a
    # second (both ran, same parameters, counted twice; found by a helper probing searches)
    retry = next((t.number for t in trials.values() if t.user_attrs.get(RETRY_OF) == trial.number), None)
    if retry is None and retry_depth(trials, trial) < max_retries and trial.params:
        study.enqueue_trial(dict(trial.params), user_attrs={RETRY_OF: trial.number})
        waiting = [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            if t.user_attrs.get(RETRY_OF) == trial.number
        ]
        retry = waiting[-1].number if waiting else None
    study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
    log.warning("trial %d FAILED (%s)%s", trial.number, reason, f"; retried as trial {retry}" if retry is not None else "")
    return retry


# -- a trial's result ----------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """What a trial's job came to, told to the study: COMPLETE with ``values``, PRUNED, or FAIL."""

    state: str  # "complete" | "pruned" | "fail"
    values: tuple[float, ...] = ()
    reason: str | None = None
    result: CellResult | None = None
    output_dir: str | None = None
    retry: bool = False  # a failure that is no verdict on the parameters (a stop): retried by the rule


def _objective_key(objective: str, result: CellResult, settings: StudySettings) -> str:
    """The metric an objective is read from: under walk-forward its mean across folds."""
    if settings.walk_forward or f"{objective}{FOLD_MEAN_SUFFIX}" in result.metrics:
        return objective + FOLD_MEAN_SUFFIX
    return objective


def objective_values(result: CellResult, settings: StudySettings) -> tuple[tuple[float, ...] | None, str | None]:
    """The trial's objective values from its result (its metrics): under walk-forward the mean
    across folds (``<metric>_fold_mean``); (None, why) when one is missing or not finite."""
    values = []
    for objective in settings.objectives:
        key = _objective_key(objective, result, settings)
        value = result.metrics.get(key)
        if value is None or not math.isfinite(value):
            return None, f"{key} is {'missing' if value is None else value}"
        values.append(float(value))
    return tuple(values), None


def outcome_of(result: CellResult | None, pruned: bool, settings: StudySettings, output_dir: str | None = None) -> Outcome:
    """How a trial whose job ended with ``result`` (its ``cell.json``; None: none was written) is told."""
    if pruned:  # the pruner stopped it (its job may have died before writing cell.json): retraining it would prune it again
        return Outcome("pruned", result=result, output_dir=output_dir)
    if result is None:
        return Outcome("fail", reason="its job wrote no result (cell.json)", output_dir=output_dir)
    if result.status not in OK_RESULTS:
        return Outcome("fail", reason=result.error or result.note or str(result.status), result=result, output_dir=output_dir)
    values, why = objective_values(result, settings)
    if values is None:
        return Outcome("fail", reason=why, result=result, output_dir=output_dir)
    return Outcome("complete", values, result=result, output_dir=output_dir)


def tell(study, trial, outcome: Outcome, max_retries: int) -> None:
    """Record ``outcome`` on the trial (its run, cell, folder) and tell the study."""
    storage = study._storage
    if outcome.result is not None:
        key = outcome.result.key
        if outcome.result.run_id:
            storage.set_trial_user_attr(trial._trial_id, RUN_ID, outcome.result.run_id)
        storage.set_trial_user_attr(trial._trial_id, CELL, f"{key.model}-{key.asset}-{key.precision}-{key.seed}")
    if outcome.output_dir:
        storage.set_trial_user_attr(trial._trial_id, OUTPUT_DIR, outcome.output_dir)
    if outcome.state == "complete":
        study.tell(trial.number, list(outcome.values))
    elif outcome.state == "pruned":
        study.tell(trial.number, state=TrialState.PRUNED)
    elif outcome.retry:
        fail_and_retry(study, trial, outcome.reason or "stopped", max_retries)
    else:
        storage.set_trial_user_attr(trial._trial_id, FAIL_REASON, outcome.reason or "failed")
        study.tell(trial.number, state=TrialState.FAIL)


def is_study_folder(sweep_dir: Path | str | None, settings: StudySettings) -> bool:
    """Whether ``sweep_dir`` is a sweep folder of this study: its ``study.json`` names the study
    and its database. A folder the study's records name (``foxhunt.sweep_dir``, ``output_dir``) is
    read only then: an edited record named ``/`` and the search scanned the whole file system,
    then told a stray ``cell.json``'s metrics to the study (found by a helper probing searches)."""
    if sweep_dir is None or not Path(sweep_dir).is_dir():
        return False
    try:
        found = StudyFile.read(Path(sweep_dir))
    except StudyError:
        return False
    return found is not None and (found.study_name, found.storage) == (settings.name, settings.storage)


def find_result(sweep_dir: Path | None, number: int, settings: StudySettings) -> tuple[CellResult | None, str | None]:
    """The ``cell.json`` of trial ``number`` in ``sweep_dir`` (and its folder), if its job wrote
    one and the folder is this study's (:func:`is_study_folder`)."""
    if not is_study_folder(sweep_dir, settings):
        return None, None
    assert sweep_dir is not None  # a study folder
    for path in sorted(Path(sweep_dir).rglob(CELL_RESULT_FILE)):
        try:
            result = CellResult.read(path)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if result.trial == number:
            return result, str(path.parent)
    return None, None


def run_disagrees(tracking_uri: str, result: CellResult, number: int, values: tuple[float, ...],
                  settings: StudySettings) -> str | None:  # fmt: skip
    """Why the tracking store does not back a dead process's ``cell.json`` for trial ``number``
    (None when it does): its run must be in the store, FINISHED, this trial's (unless resume
    reused it), and hold each objective value told. A ``cell.json`` planted in the sweep folder
    was told COMPLETE and became the search's best trial (found by a helper probing the job CLI)."""
    if not result.run_id:
        return "its cell.json names no run"
    try:
        run = RunStore(tracking_uri).get(result.run_id)
    except Exception:  # noqa: BLE001 (no such run, or a store that cannot say: nothing backs it)
        return f"its run {result.run_id[:40]!r} is not in the store"
    if run.status != Status.FINISHED:
        return f"its run {run.run_id} is {run.status}"
    if result.status == Status.FINISHED and run.tags.get(Tag.TRIAL) != str(number):
        return f"its run {run.run_id} is not trial {number}'s"
    for objective, value in zip(settings.objectives, values):
        key = _objective_key(objective, result, settings)
        stored = run.metric(key)
        if stored is None or not math.isclose(stored, value, rel_tol=1e-12, abs_tol=0.0):
            return f"its run {run.run_id} has {key}={stored}, its cell.json {value}"
    return None


def settle_stale(study, settings: StudySettings, alive: Callable[[Mapping[str, Any]], bool | None] = owner_alive,
                 tracking_uri: str | None = None) -> list[str]:  # fmt: skip
    """Settle the trials left RUNNING by a process that is gone (module doc); returns what was
    done, one line per trial. With ``tracking_uri`` a result the dead process's job left is told
    only if its run backs it (:func:`run_disagrees`); otherwise the trial is failed and retried."""
    done = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not is_stale(trial, settings.grace_s, alive):
            continue
        owner = trial.system_attrs.get(OWNER)
        gone = (f"its sweep process {owner.get('pid')} on {owner.get('host')} is gone" if isinstance(owner, Mapping)
                else f"never claimed by a sweep process in {settings.grace_s:g} s (hydra.sweeper.grace_s)")  # fmt: skip
        sweep_dir = trial.system_attrs.get(SWEEP_DIR)
        result, folder = find_result(Path(sweep_dir) if sweep_dir else None, trial.number, settings)
        outcome = outcome_of(result, bool(trial.user_attrs.get(PRUNED_AT) is not None), settings, folder)
        why = None
        if outcome.state == "complete" and tracking_uri is not None and result is not None:
            why = run_disagrees(tracking_uri, result, trial.number, outcome.values, settings)
        if why is not None:
            gone = f"{gone}; its cell.json is not what the store holds ({why})"
        elif outcome.state != "fail":  # its job had ended, or the pruner had stopped it
            tell(study, trial, outcome, settings.max_retries)
            done.append(f"trial {trial.number}: {gone}; its job had ended: told {outcome.state.upper()}")
            continue
        retry = fail_and_retry(study, trial, gone, settings.max_retries)
        done.append(f"trial {trial.number}: {gone}: FAILED" + (f", retried as trial {retry}" if retry is not None else
                                                              f" (not retried: {settings.max_retries} retries along its chain)"))  # fmt: skip
    return done


# -- the study as the sweep's summary sees it ---------------------------------------------------
@dataclass
class StudyView:
    """Every trial of the study (every launch's) as a result row, with what the study says."""

    settings: StudySettings
    results: list[CellResult]
    counts: TrialCounts
    values: dict[int, tuple[float, ...]]  # a finished trial's values, as told
    pareto: list[int]  # the Pareto front's trial numbers (several objectives)
    cells: dict[int, str]  # trial number -> model-asset-precision-seed ("" unknown)


def cell_of(result: CellResult | None, trial) -> str:
    if result is not None and result.key.model:
        key = result.key
        return f"{key.model}-{key.asset}-{key.precision}-{key.seed}"
    return str(trial.user_attrs.get(CELL) or "")


def study_view(config: DictConfig, default_key) -> StudyView | None:
    """The study of this search, None when its database has no such study (module doc)."""
    settings = settings_from(config)
    storage = open_storage(settings.storage, server=settings.server)
    try:
        study = optuna.load_study(study_name=settings.name, storage=storage)
    except KeyError:
        return None
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    results: list[CellResult] = []
    values: dict[int, tuple[float, ...]] = {}
    cells: dict[int, str] = {}
    for trial in trials:
        if trial.state == TrialState.WAITING:
            continue
        result = None
        folder = trial.user_attrs.get(OUTPUT_DIR)
        if folder and is_study_folder(Path(str(folder)).parent, settings) and (Path(folder) / CELL_RESULT_FILE).is_file():
            try:
                result = CellResult.read(Path(folder) / CELL_RESULT_FILE)
            except (OSError, ValueError, KeyError, TypeError):
                result = None
        if result is None:
            sweep_dir = trial.system_attrs.get(SWEEP_DIR)
            result, _ = find_result(Path(sweep_dir) if sweep_dir else None, trial.number, settings)
        synthesized = result is None  # its job wrote no result (it died first, or never started)
        if result is None:
            result = CellResult(default_key, "FAILED")
        result.trial = trial.number
        cells[trial.number] = cell_of(None if synthesized else result, trial)
        if trial.state == TrialState.COMPLETE:
            values[trial.number] = tuple(float(v) for v in trial.values)
            result.objective = values[trial.number][0]
            if synthesized:  # finished, its folder gone since (moved, cleaned): the study's word, not FAILED
                result.status, result.run_id = "FINISHED", trial.user_attrs.get(RUN_ID) or result.run_id
                result.note = "its folder is gone: the value the study was told"
        elif trial.state == TrialState.PRUNED:
            result.status, result.objective = PRUNED, None
            result.note = result.note or f"pruned at validation {trial.user_attrs.get(PRUNED_AT)}"
        elif trial.state == TrialState.FAIL:
            result.objective = None
            reason = trial.user_attrs.get(FAIL_REASON)
            if trial.number in retried:
                retry = next((t.number for t in trials if t.user_attrs.get(RETRY_OF) == trial.number), None)
                result.status, result.note = RETRIED, f"{reason}; retried as trial {retry}"
            else:
                result.status = "FAILED" if str(result.status) in ("FINISHED", "SKIPPED", "RUNNING") else result.status
                result.error = result.error or reason
        else:  # RUNNING: another process's (a live sweep elsewhere)
            result.status, result.objective = "RUNNING", None
        results.append(result)
    pareto = [t.number for t in study.best_trials] if settings.multi_objective and values else []
    return StudyView(settings, results, trial_counts(trials), values, pareto, cells)


def _cell_of(view: StudyView, result: CellResult) -> str | None:
    return None if result.trial is None else view.cells.get(result.trial)


def per_cell_counts(view: StudyView) -> dict[str, int]:
    """For each cell of the study, the trials that count in its deflated Sharpe ratio: its own
    and those of unknown cell (a trial whose process died before its cell was known)."""
    counted_results = [r for r in view.results if r.status not in (RETRIED, "RUNNING")]
    unknown = sum(1 for r in counted_results if not _cell_of(view, r))
    totals: dict[str, int] = {}
    for result in counted_results:
        cell = _cell_of(view, result)
        if cell:
            totals[cell] = totals.get(cell, 0) + 1
    return {cell: count + unknown for cell, count in totals.items()}
