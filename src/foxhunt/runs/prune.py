"""``foxhunt runs prune``: the stored checkpoints of the runs that lost, removed from the store.

A store fills with checkpoints nobody will deploy (a default-size TFT's ``best.ckpt`` weighs over a hundred MB). Prune
removes the artifact folder ``checkpoints/`` of each FINISHED run of one experiment that is

- not registered: no model version points at it, whatever its alias (its run, its ``runs:/``
  source, the logged model it was made from, foxhunt's version tags:
  :meth:`~foxhunt.runs.store.RunStore.registered_run_ids`);
- not among the best ``keep`` runs of its cell: the leaderboard's groups, by ``metric`` in its
  direction (:func:`foxhunt.runs.leaderboard.top`, asked again with each round's winners left
  out: the ranks are the leaderboard's own, whatever it groups by);
- for a fold or seed child: its cell run is removed (a child goes with its cell), and the child
  is not registered itself.

Every other run keeps its files: a run the leaderboard does not rank (no value of the metric, not
a cell), and every run that is not FINISHED (a RUNNING one trains; a FAILED, KILLED or stale one
resumes from its checkpoints with ``resume=true``). Only the checkpoints go: the run's record,
params, metrics, ``config.yaml``, provenance and plots stay (the leaderboard still ranks it), and
the run is tagged ``artifacts.pruned`` (when, how many files and bytes).

Safety:

- :func:`plan_prune` only reads and measures (the bytes of each regular file; links are not
  followed); :func:`apply_prune` removes. Before each run's removal, under the store's registry
  lock (the one ``foxhunt ensemble register`` holds while it chooses and registers), the run is
  read again: it must still be FINISHED and not registered, and its folder where it was, else it
  is left and said (a run reopened or registered meanwhile keeps its files).
- only inside the store's folder (the SQLite file's folder, ``mlruns/``): a run whose artifact
  folder lies elsewhere (its URI leads out, through ``..`` or a symbolic link) is named and left;
  the folder is removed without following links (``shutil.rmtree``: a link inside is removed,
  never what it points at).
- a local store only: a server's artifacts are not files here (one line).
"""

from __future__ import annotations

import itertools
import os
import shutil
import stat
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from foxhunt.ensemble.registry import REGISTRY_LOCK
from foxhunt.errors import UserError
from foxhunt.runs import leaderboard as lb
from foxhunt.runs.checkpoints import CHECKPOINT_ARTIFACTS, checkpoint_folder
from foxhunt.runs.environment import sqlite_path
from foxhunt.runs.sqlite_reader import not_a_store
from foxhunt.runs.status import Status
from foxhunt.runs.store import RunStore
from foxhunt.runs.stored import StoredRun
from foxhunt.runs.tags import ROLE_FOLD, Tag

PRUNE_CONFIG = Path(__file__).resolve().parents[1] / "conf" / "prune.yaml"
KEEP_KEY = "keep_top"
# Why a FINISHED run keeps its files (Plan.kept's keys).
REGISTERED, TOP, NOT_RANKED, CELL_KEPT = "registered", "among the best of its cell", "not ranked", "its cell run kept"


class PruneError(UserError):
    """A prune that cannot be asked (a server store, a bad --keep or conf value, no experiment): one line."""

    kind = "input"


def default_keep() -> int:
    """``keep_top`` of ``conf/prune.yaml``: how many runs of each cell keep their checkpoints."""
    try:
        value = (yaml.safe_load(PRUNE_CONFIG.read_text()) or {}).get(KEEP_KEY)
    except (OSError, yaml.YAMLError) as exc:
        raise PruneError(f"{PRUNE_CONFIG}: cannot be read ({type(exc).__name__})") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PruneError(f"{PRUNE_CONFIG}: {KEEP_KEY}={value!r}: must be an integer >= 1")
    return value


@dataclass(frozen=True)
class Removal:
    """A run whose stored checkpoints go: its folder, what it holds, and why it lost."""

    run: StoredRun
    folder: Path
    files: int
    bytes: int
    why: str


@dataclass
class Plan:
    experiment: str
    metric: str
    keep: int
    removals: list[Removal] = field(default_factory=list)
    kept: Counter = field(default_factory=Counter)  # why -> FINISHED runs kept (with files or not)
    refused: list[tuple[StoredRun, str]] = field(default_factory=list)  # an artifact folder outside the store
    unfinished: int = 0  # runs that are not FINISHED: never touched
    bare: int = 0  # runs that lost with no stored checkpoints (pruned before, or none logged)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.removals)


@dataclass
class Outcome:
    removed: list[Removal] = field(default_factory=list)
    left: list[tuple[Removal, str]] = field(default_factory=list)  # found not prunable at the last check

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.removed)


def store_folder(tracking_uri: str) -> Path:
    """The folder of the store's SQLite file: nothing outside it is ever removed."""
    database = sqlite_path(tracking_uri)
    if database is None:
        raise PruneError(f"{tracking_uri}: prune removes the files of a local SQLite store (sqlite:///<file>); "
                         "a server's artifacts are not files here")  # fmt: skip
    if not database.is_file():
        raise PruneError(f"no MLflow store at {database}: run foxhunt-train first (or pass --root)")
    problem = not_a_store(database)
    if problem:
        raise PruneError(f"cannot read the MLflow store {database}: {problem}")
    return database.parent


class _Unranked:
    """The leaderboard's source over runs already read, less those ranked in earlier rounds."""

    def __init__(self, experiment: str, runs: Sequence[StoredRun]) -> None:
        self.experiment = experiment
        self.runs = list(runs)
        self.ranked: set[str] = set()

    def experiment_exists(self, name: str) -> bool:
        return name == self.experiment

    def experiment_names(self) -> list[str]:
        return [self.experiment]

    def finished_runs(self, experiment: str, tag_keys: Sequence[str], metric_keys: Sequence[str]) -> list[StoredRun]:
        return [run for run in self.runs if run.run_id not in self.ranked]

    def run_metrics(self, run_ids: Sequence[str], keys: Sequence[str], prefix: str) -> dict[str, dict[str, float]]:
        return {}  # the rows' intervals, baselines and DSR: not what ranks them


def cell_ranks(experiment: str, finished: Sequence[StoredRun], metric: str) -> dict[str, tuple[int, str]]:
    """Each ranked run's place in its cell (1: the leaderboard's winner) and the cell's name:
    the leaderboard asked again and again, each round's winners left out."""
    source = _Unranked(experiment, finished)
    query = lb.Query(experiment=experiment, metric=metric)
    ranks: dict[str, tuple[int, str]] = {}
    for rank in itertools.count(1):
        rows = lb.top(source, query).rows
        if not rows:
            return ranks
        for row in rows:
            ranks[row.run_id] = (
                rank,
                " ".join([*(f"{key}={value}" for key, value in row.group.items()), f"data={lb.data_label(row.data)}"]),
            )
            source.ranked.add(row.run_id)
    return ranks  # unreachable: itertools.count never ends


def measure(folder: Path) -> tuple[int, int]:
    """(regular files, their bytes) under ``folder``; links are not followed nor counted."""
    files = size = 0
    for parent, _, names in os.walk(folder, followlinks=False):
        for name in names:
            info = os.lstat(os.path.join(parent, name))
            if stat.S_ISREG(info.st_mode):
                files, size = files + 1, size + info.st_size
    return files, size


def check_keep(keep: int) -> None:
    """``--keep`` (or ``keep_top``): the best runs of each cell that keep their checkpoints, at least one."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise PruneError(f"--keep {keep!r}: must be an integer >= 1 (the best runs of each cell that keep their checkpoints)")


def plan_prune(store: RunStore, experiment: str, metric: str, keep: int) -> Plan:
    """What a prune of ``experiment`` would remove (module doc); reads and measures only."""
    check_keep(keep)
    lb.metric_parts(metric)  # a metric without a split or a direction: one line
    root = store_folder(store.tracking_uri)
    if store.experiment_id(experiment) is None:
        known = ", ".join(sorted(e.name for e in store.client.search_experiments())) or "none"
        raise PruneError(f"experiment {experiment!r} (task): not in the store (experiments: {known})")
    runs = store.search(experiment)
    finished = [run for run in runs if run.status == Status.FINISHED]
    plan = Plan(experiment, metric, keep, unfinished=len(runs) - len(finished))
    ranks = cell_ranks(experiment, finished, metric)
    registered = store.registered_run_ids()
    lost = {
        run_id: f"rank {rank} in {cell}" for run_id, (rank, cell) in ranks.items() if rank > keep and run_id not in registered
    }
    for run in finished:
        parent = run.parent_id
        if run.run_id in registered:
            plan.kept[REGISTERED] += 1
            continue
        if run.run_id in lost:
            why = lost[run.run_id]
        elif run.tags.get(Tag.ROLE) == ROLE_FOLD and parent in lost:
            why = f"a child of run {parent} ({lost[parent]})"
        else:
            plan.kept[TOP if run.run_id in ranks else CELL_KEPT if run.tags.get(Tag.ROLE) == ROLE_FOLD else NOT_RANKED] += 1
            continue
        folder, problem = checkpoint_folder(run, root)
        if problem is not None:
            plan.refused.append((run, problem))
        elif folder is not None and folder.is_dir():
            files, size = measure(folder)
            plan.removals.append(Removal(run, folder, files, size, why))
        else:
            plan.bare += 1
    return plan


def apply_prune(store: RunStore, plan: Plan, lock: str | None = None) -> Outcome:
    """Remove what ``plan`` found, each run checked again first under the registry ``lock``
    (default: ``foxhunt ensemble register``'s), then tagged ``artifacts.pruned``."""
    if lock is None:
        lock = REGISTRY_LOCK
    root = store_folder(store.tracking_uri)
    outcome = Outcome()
    for removal in plan.removals:
        with store.exclusive(lock):
            run = store.get(removal.run.run_id)
            folder, problem = checkpoint_folder(run, root)
            if run.status != Status.FINISHED:
                outcome.left.append((removal, f"now {run.status}"))
            elif run.run_id in store.registered_run_ids():
                outcome.left.append((removal, "registered since the plan"))
            elif problem is not None or folder != removal.folder:
                outcome.left.append((removal, problem or f"its checkpoints moved to {folder}"))
            elif folder.is_dir():
                files, size = measure(folder)
                shutil.rmtree(folder)
                when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                store.tag(run.run_id, {Tag.ARTIFACTS_PRUNED: f"{when}: {CHECKPOINT_ARTIFACTS}/ removed ({files} files, "
                                                             f"{size} bytes; {removal.why})"})  # fmt: skip
                outcome.removed.append(replace(removal, files=files, bytes=size))
    return outcome
