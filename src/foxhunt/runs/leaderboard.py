"""The best FINISHED cell per group of runs (``foxhunt runs top``), and every metric's direction.

**Metric directions.** :data:`METRIC_DIRECTIONS` is the one table of which way each known
metric is better (``max`` or ``min``), by the metric's name after its split (``val/sharpe``:
``sharpe``; ``val/baseline/flat/pnl``: ``pnl``). :mod:`foxhunt.ensemble.registry` selects its
champions with it; it lives here so that read-only commands use it without importing the
ensemble (torch, mlflow).

**The leaderboard.** The runs of one experiment (``task``) that are FINISHED and active, minus
the children of a cell (tag ``foxhunt.role=fold``: a walk-forward fold or a seed is part of its
cell, which competes with its aggregate metrics), minus the runs without one of the grouping
tags (a sweep's or a job's parent run is no cell), filtered by tags (``asset=es,nq``: any of
those values), are grouped by the ``--by`` tags (default model and asset) and the data's identity:
the run's ``data.digest`` tag (:data:`DATA_TAG`, the SHA-256 of every file read and of each split's
bars, :mod:`foxhunt.runs.provenance`), so runs on other bars (a synthetic set of another seed, a
cell keeping a lockbox and one without, ES and NQ under ``--by model``) are never ranked or counted
as trials together. A walk-forward or multi-seed cell's run records no digest of its own (each
fold and seed child records its bars'): its identity is :func:`data_identity` of its FINISHED
children's digests. Runs with neither (older runs) are one group of their own (``data`` None,
shown as such). In each group the
best run by the metric, in its direction, wins; a tie goes to the newest run, then to the
smallest run id (the rule of :func:`foxhunt.ensemble.registry.choose_champions` without an
incumbent, made independent of the order the store returns runs in).
A run whose metric is missing or NaN is counted in its group (``runs``) but not ranked
(``scored``); a group with no scored run has no row. Rows are ordered best first.

Per row, on the metric's split (``val`` for ``val/...``):

- the interval: ``<metric>_ci_low`` / ``<metric>_ci_high`` where the run logged them (the block
  bootstrap of :mod:`foxhunt.evaluation.scoring`: ``sharpe`` and ``mean_pnl``);
- the best baseline: of ``<split>/baseline/<name>/<metric name>`` when the run's baselines
  logged that name (``sharpe``, ``pnl``), in the metric's direction, else of the baselines'
  ``sharpe`` (highest);
- the deflated Sharpe ratio of the winner against its group's runs as the trials (the best of
  the group's N runs would look good by chance alone; a search's trials count every trial of
  their study in the cell, pruned and failed ones too: :func:`dsr_trial_count`), from ``<split>/sharpe_per_step``,
  ``/steps``, ``/pnl_skew``, ``/pnl_kurtosis``, by
  :func:`foxhunt.evaluation.deflated.deflated_sharpe_ratio` (Bailey and Lopez de Prado 2014;
  standard library only: ``foxhunt.evaluation.stats`` imports numpy and scipy, more than a second of start-up).

A ``test/`` (or ``holdout/``) metric may rank the rows: this is a report, no selection; what
selects (sweeps, searches, ``foxhunt ensemble register``) uses ``val/`` metrics only, which the
command says in a note line when ranking by another split.

The runs come from the read-only SQLite reader (:class:`SqliteSource`: the tags and metrics the
leaderboard needs, by key, with MLflow's primary-key indexes) or, for a server or a schema the
reader does not know, from the client (:class:`ClientSource`); the tests check both answer the
same. This module imports neither torch, lightning nor mlflow (the client source imports mlflow
when used).
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from foxhunt.errors import UserError
from foxhunt.runs.stored import StoredRun
from foxhunt.runs.tags import ROLE_FOLD, Tag

# Lazy imports: (c) mlflow (the client source) and evaluation.deflated (its package loads numpy and pandas): runs top

#: Direction of each known metric name (the part after the split, ``val/<name>``).
METRIC_DIRECTIONS = {
    "sharpe": "max", "pnl": "max", "env_pnl_usd": "max", "mean_pnl": "max", "mean_reward": "max", "hit_rate": "max",
    "direction_accuracy": "max", "loss": "min", "max_drawdown": "min",
}  # fmt: skip
MAX, MIN = "max", "min"
#: The splits a leaderboard metric may come from; only SELECTION_SPLIT's metrics select anything.
METRIC_SPLITS = ("val", "test", "holdout")
SELECTION_SPLIT = "val"
DEFAULT_METRIC = "val/sharpe"
#: Tags a leaderboard groups by or filters on (each is also an override key: ``asset=es``).
GROUP_TAGS = (Tag.MODEL, Tag.ASSET, Tag.PRECISION, Tag.SEED, Tag.STRATEGY, Tag.DATA_SOURCE, Tag.SWEEP_ID, Tag.JOB_ID)
DEFAULT_BY = (Tag.MODEL, Tag.ASSET)
TASK_KEY = "task"  # the override that picks the experiment, as foxhunt-train's task=
CI_LOW_SUFFIX, CI_HIGH_SUFFIX = "_ci_low", "_ci_high"
BASELINE_SEGMENT = "baseline"
BASELINE_FALLBACK = "sharpe"  # what baselines are compared by when they did not log the metric's name
DSR_INPUTS = ("sharpe_per_step", "steps", "pnl_skew", "pnl_kurtosis")
#: The tag of a search's finished trial run: how many trials of its study its cell counts (finished,
#: pruned and failed; written by the sweep's summary, foxhunt.sweeps.callback). Read here; it belongs
#: with the store's other names in foxhunt.runs.tags.Tag (this module is not that file's owner).
SEARCH_TRIALS_TAG = "search.trials"
#: The data's identity every group is also keyed by (module doc); a run without it: None.
DATA_TAG = Tag.DATA_DIGEST
DATA_DIGITS = 12  # hex digits of a group's data digest shown (a table, a cell's name; the JSON has it whole)
NO_DATA = "no digest (old run)"  # the group of runs that did not record their data's identity
CELL_KEY_TAGS = (Tag.MODEL, Tag.ASSET, Tag.PRECISION, Tag.SEED)
TRAIN_CONFIG = Path(__file__).resolve().parents[1] / "conf" / "train.yaml"  # foxhunt-train's root config


def data_label(data: str | None) -> str:
    """A group's data set in a few characters: its digest's first :data:`DATA_DIGITS`, or :data:`NO_DATA`."""
    return NO_DATA if data is None else data[:DATA_DIGITS]


class LeaderboardError(UserError):
    """A leaderboard that cannot be asked (bad metric, override or tag) or answered (no
    experiment): one line."""

    kind = "input"


def metric_parts(metric: str) -> tuple[str, str]:
    """``(split, name)`` of ``<split>/.../<name>``; a metric without a known split or with a
    name of unknown direction is refused (one line)."""
    split, _, rest = metric.partition("/")
    if not rest or split not in METRIC_SPLITS:
        raise LeaderboardError(f"--metric {metric}: expected <split>/<name> with split {', '.join(METRIC_SPLITS)} "
                               f"(e.g. {DEFAULT_METRIC})")  # fmt: skip
    name = rest.rsplit("/", 1)[-1]
    if name not in METRIC_DIRECTIONS:
        raise LeaderboardError(
            f"--metric {metric}: unknown direction for {name!r} (known: {', '.join(sorted(METRIC_DIRECTIONS))})"
        )
    return split, name


def direction_of(metric: str) -> str:
    return METRIC_DIRECTIONS[metric_parts(metric)[1]]


def default_experiment() -> str:
    """``task`` of foxhunt-train's root config: the experiment a run goes to unless told."""
    return str(yaml.safe_load(TRAIN_CONFIG.read_text())[TASK_KEY])


def parse_by(text: str) -> tuple[str, ...]:
    """``model,asset`` -> its tags, in order, each once; an unknown tag is refused."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise LeaderboardError(f"--by {text!r}: expected a comma list of tags ({', '.join(GROUP_TAGS)})")
    unknown = [name for name in names if name not in GROUP_TAGS]
    if unknown:
        raise LeaderboardError(f"--by {','.join(unknown)}: unknown tag (expected {', '.join(GROUP_TAGS)})")
    return tuple(dict.fromkeys(names))


def parse_overrides(overrides: Iterable[str]) -> tuple[str | None, dict[str, tuple[str, ...]]]:
    """Hydra-style filters ``key=value[,value...]`` -> (the ``task`` given, or None; the tag
    filters). A malformed override, an unknown key or a key given twice is refused."""
    task, filters = None, {}
    allowed = (TASK_KEY, *GROUP_TAGS)
    for override in overrides:
        key, sep, value = override.partition("=")
        key = key.strip()
        values = tuple(part.strip() for part in value.split(","))
        if not sep or not key or not all(values):
            raise LeaderboardError(f"override {override!r}: expected key=value (e.g. asset=es or model=dqn,ppo)")
        if key not in allowed:
            raise LeaderboardError(f"override {override!r}: unknown key {key!r} (expected {', '.join(allowed)})")
        if key == TASK_KEY and (task is not None or len(values) > 1):
            raise LeaderboardError(f"override {override!r}: task takes one experiment, given once")
        if key in filters:
            raise LeaderboardError(f"override {override!r}: {key} given twice (use a comma list: {key}=a,b)")
        if key == TASK_KEY:
            task = values[0]
        else:
            filters[key] = values
    return task, filters


@dataclass(frozen=True)
class Query:
    experiment: str
    metric: str = DEFAULT_METRIC
    by: tuple[str, ...] = DEFAULT_BY
    filters: dict[str, tuple[str, ...]] = field(default_factory=dict)
    limit: int | None = None

    @property
    def split(self) -> str:
        return metric_parts(self.metric)[0]

    def split_key(self, name: str) -> str:
        return f"{self.split}/{name}"


@dataclass(frozen=True)
class Baseline:
    name: str
    metric: str
    value: float


@dataclass(frozen=True)
class Row:
    """One group's best run, with its interval, best baseline and deflated Sharpe ratio."""

    group: dict[str, str]
    data: str | None  # the data's identity (DATA_TAG) of the group's runs; None: runs that did not record it
    metric: str
    value: float
    ci_low: float | None
    ci_high: float | None
    baseline: Baseline | None
    dsr: float | None
    dsr_trials: int
    runs: int
    scored: int
    run_id: str
    run_name: str
    start_ms: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every non-finite number is None (JSON's null)."""
        baseline = None
        if self.baseline is not None:
            baseline = {"name": self.baseline.name, "metric": self.baseline.metric, "value": finite_metric(self.baseline.value)}
        return {
            "group": dict(self.group), "data": self.data, "metric": self.metric, "value": finite_metric(self.value),
            "ci_low": finite_metric(self.ci_low), "ci_high": finite_metric(self.ci_high), "baseline": baseline,
            "dsr": finite_metric(self.dsr), "dsr_trials": self.dsr_trials, "runs": self.runs, "scored": self.scored,
            "run_id": self.run_id, "run_name": self.run_name, "start_ms": self.start_ms,
        }  # fmt: skip


@dataclass(frozen=True)
class Leaderboard:
    query: Query
    direction: str
    rows: list[Row]
    groups: int  # groups with a run, scored or not
    unscored_groups: int  # groups without a value of the metric: no row
    considered: int  # FINISHED cell runs after the filters


class Source(Protocol):
    """Where the runs come from (:class:`SqliteSource`, :class:`ClientSource`)."""

    def experiment_exists(self, name: str) -> bool: ...

    def experiment_names(self) -> list[str]: ...

    def finished_runs(self, experiment: str, tag_keys: Sequence[str], metric_keys: Sequence[str]) -> list[StoredRun]: ...

    def run_metrics(self, run_ids: Sequence[str], keys: Sequence[str], prefix: str) -> dict[str, dict[str, float]]: ...


class SqliteSource:
    """The project's SQLite store through :class:`foxhunt.runs.sqlite_reader.SqliteReader`."""

    def __init__(self, reader) -> None:
        self.reader = reader

    def experiment_exists(self, name: str) -> bool:
        return bool(self.reader.experiment_ids(name))

    def experiment_names(self) -> list[str]:
        return self.reader.experiment_names()

    def finished_runs(self, experiment: str, tag_keys: Sequence[str], metric_keys: Sequence[str]) -> list[StoredRun]:
        return self.reader.finished_runs(self.reader.experiment_ids(experiment), tag_keys, metric_keys)

    def run_metrics(self, run_ids: Sequence[str], keys: Sequence[str], prefix: str) -> dict[str, dict[str, float]]:
        found = self.reader.latest_metrics(run_ids, keys, prefix)
        return {run_id: {k: m.value for k, m in metrics.items()} for run_id, metrics in found.items()}


class ClientSource:
    """Any store through :class:`foxhunt.runs.store.RunStore` (``MlflowClient.search_runs``)."""

    def __init__(self, store) -> None:
        self.store = store
        self._runs: dict[str, StoredRun] = {}

    def experiment_exists(self, name: str) -> bool:
        return self.store.experiment_id(name) is not None

    def experiment_names(self) -> list[str]:
        from mlflow.entities import ViewType

        return sorted(e.name for e in self.store.client.search_experiments(view_type=ViewType.ACTIVE_ONLY))

    def finished_runs(self, experiment: str, tag_keys: Sequence[str], metric_keys: Sequence[str]) -> list[StoredRun]:
        runs = self.store.search_finished_runs(experiment)
        self._runs = {r.run_id: r for r in runs}
        return runs

    def run_metrics(self, run_ids: Sequence[str], keys: Sequence[str], prefix: str) -> dict[str, dict[str, float]]:
        wanted = set(keys)
        return {
            run_id: {k: v for k, v in self._runs[run_id].metric_values().items() if k in wanted or k.startswith(prefix)}
            for run_id in run_ids if run_id in self._runs
        }  # fmt: skip


def top(source: Source, query: Query) -> Leaderboard:
    """The leaderboard of ``query`` over ``source`` (module doc)."""
    direction = direction_of(query.metric)
    if not source.experiment_exists(query.experiment):
        known = ", ".join(source.experiment_names()) or "none"
        raise LeaderboardError(f"experiment {query.experiment!r} (task): not in the store (experiments: {known})")
    trial_key = query.split_key(DSR_INPUTS[0])
    tag_keys = tuple(dict.fromkeys((Tag.ROLE, *query.by, *query.filters, Tag.STUDY, SEARCH_TRIALS_TAG, *CELL_KEY_TAGS,
                                    DATA_TAG, Tag.PARENT)))  # fmt: skip
    runs = source.finished_runs(query.experiment, tag_keys, (query.metric, trial_key))
    cells = [
        r for r in runs
        if r.tags.get(Tag.ROLE) != ROLE_FOLD
        and all(r.tags.get(key) for key in query.by)
        and all(r.tags.get(key) in values for key, values in query.filters.items())
    ]  # fmt: skip
    children: dict[str, list[str]] = {}
    for r in runs:
        if r.tags.get(Tag.ROLE) == ROLE_FOLD and r.tags.get(Tag.PARENT) and r.tags.get(DATA_TAG):
            children.setdefault(r.tags[Tag.PARENT], []).append(r.tags[DATA_TAG])
    groups: dict[tuple[str, ...], list[StoredRun]] = {}
    for run in cells:
        data = run.tags.get(DATA_TAG) or data_identity(children.get(run.run_id, ()))
        groups.setdefault((*(run.tags[key] for key in query.by), data), []).append(run)
    sign = 1.0 if direction == MAX else -1.0
    winners = []
    for key, members in groups.items():
        scored = [(r, v) for r in members if (v := finite_metric(r.metric(query.metric))) is not None]
        if not scored:
            continue
        best, value = min(scored, key=lambda rv: (-sign * rv[1], -rv[0].start_ms, rv[0].run_id))
        trials = [v for r in members if (v := finite_metric(r.metric(trial_key))) is not None]
        winners.append((key, best, value, len(members), len(scored), trials, dsr_trial_count(members, trial_key)))
    winners.sort(key=lambda w: (-sign * w[2], w[0]))
    if query.limit is not None:
        winners = winners[: query.limit]
    ci_keys = (query.metric + CI_LOW_SUFFIX, query.metric + CI_HIGH_SUFFIX)
    baseline_prefix = query.split_key(BASELINE_SEGMENT + "/")
    details = source.run_metrics([w[1].run_id for w in winners],
                                 (*ci_keys, *(query.split_key(n) for n in DSR_INPUTS)), baseline_prefix)  # fmt: skip
    rows = []
    for key, best, value, n_runs, n_scored, trials, n_trials in winners:
        metrics = details.get(best.run_id, {})
        rows.append(Row(
            group=dict(zip(query.by, key[:-1])), data=key[-1] or None, metric=query.metric, value=value,
            ci_low=finite_metric(metrics.get(ci_keys[0])), ci_high=finite_metric(metrics.get(ci_keys[1])),
            baseline=best_baseline(metrics, baseline_prefix, metric_parts(query.metric)[1], direction),
            dsr=_winner_dsr(metrics, query, trials, n_trials), dsr_trials=n_trials, runs=n_runs, scored=n_scored,
            run_id=best.run_id, run_name=best.name, start_ms=best.start_ms,
        ))  # fmt: skip
    unscored = len(groups) - sum(1 for members in groups.values()
                                 if any(finite_metric(r.metric(query.metric)) is not None for r in members))  # fmt: skip
    return Leaderboard(query=query, direction=direction, rows=rows, groups=len(groups), unscored_groups=unscored,
                       considered=len(cells))  # fmt: skip


def data_identity(child_digests: Iterable[str]) -> str:
    """The data identity of a cell whose run records no digest: its children's digests (a fold's
    bars, a seed's), each once, sorted, hashed as one (SHA-256 hex); "" without any."""
    found = sorted(set(child_digests))
    return hashlib.sha256(",".join(found).encode()).hexdigest() if found else ""


def best_baseline(metrics: dict[str, float], prefix: str, name: str, direction: str) -> Baseline | None:
    """The best of ``<prefix><baseline>/<name>`` in ``direction``; when no baseline logged
    ``name``, the best of their ``sharpe``."""
    for quantity, way in ((name, direction), (BASELINE_FALLBACK, METRIC_DIRECTIONS[BASELINE_FALLBACK])):
        found = []
        for key, value in metrics.items():
            parts = key[len(prefix) :].split("/") if key.startswith(prefix) else []
            if len(parts) == 2 and parts[1] == quantity and finite_metric(value) is not None:
                found.append(Baseline(parts[0], key, value))
        if found:
            sign = 1.0 if way == MAX else -1.0
            return min(found, key=lambda b: (-sign * b.value, b.name))
    return None


def dsr_trial_count(members: Sequence[StoredRun], trial_key: str) -> int:
    """N of a group's deflated Sharpe ratio: each run with ``trial_key`` (its Sharpe per step)
    counts once, except a search's trials: those of one study and cell (tag ``study``, the cell
    tags) count as the study's trials in that cell (:data:`SEARCH_TRIALS_TAG`, the largest
    written), pruned and failed ones included, which have no run to count here."""
    plain = 0
    searches: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for run in members:
        scored = finite_metric(run.metric(trial_key)) is not None
        study, count = run.tags.get(Tag.STUDY), str(run.tags.get(SEARCH_TRIALS_TAG) or "")
        if study and count.isdigit():
            seen = searches.setdefault((study, tuple(run.tags.get(k, "") for k in CELL_KEY_TAGS)), [0, 0])
            seen[0], seen[1] = max(seen[0], int(count)), seen[1] + int(scored)
        elif scored:
            plain += 1
    return plain + sum(max(count, scored) for count, scored in searches.values())


def _winner_dsr(metrics: dict[str, float], query: Query, trials: list[float], n_trials: int | None = None) -> float | None:
    sr, steps, skew, kurtosis = (finite_metric(metrics.get(query.split_key(name))) for name in DSR_INPUTS)
    if sr is None or steps is None or skew is None or kurtosis is None or not trials:
        return None
    return deflated_sharpe(sr, trials, int(steps), skew, kurtosis, n_trials)


def deflated_sharpe(sr: float, trial_srs: Sequence[float], n_obs: int, skew: float, kurtosis: float,
                    n_trials: int | None = None) -> float | None:  # fmt: skip
    """:func:`foxhunt.evaluation.deflated.deflated_sharpe_ratio` (standard library only), None
    where it refuses its inputs (too few observations, kurtosis below 1, moments whose variance
    term is not positive, no trials)."""
    from foxhunt.evaluation.deflated import deflated_sharpe_ratio

    try:
        return deflated_sharpe_ratio(sr, list(trial_srs), n_obs, skew, kurtosis, max(n_trials or 0, len(trial_srs)) or None)
    except ValueError:
        return None


def finite_metric(value: float | None) -> float | None:
    """A stored metric value as a number to rank by, or None: NaN, infinite, or MLflow's stand-in
    for an infinite one (its SQL store keeps +-inf as +-the largest float) rank nowhere. The one
    rule for the leaderboard and registration's choice of champions."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) and abs(value) < sys.float_info.max else None
