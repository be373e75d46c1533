"""Search sweeps: a sweeper that picks each job's config (``hparams_search=<model>_optuna``).

Hydra's basic sweeper launches the cartesian product of the comma lists: a grid, every cell
known before the first starts. A search sweeper (foxhunt's Optuna sweeper,
:mod:`hydra_plugins.foxhunt_optuna_sweeper`; its study: :mod:`foxhunt.sweeps.study`, its
trials: :mod:`foxhunt.sweeps.trials`) asks its sampler for each trial's values, so trials are
only known as they start and several share a cell's model, asset and precision. What that
changes, and where:

- **Names.** Every job of a search sweep is a trial numbered by its Hydra job number, which
  the sweeper makes the trial's Optuna number (:func:`trial_number`; unique in the study, across
  launches): its MLflow run is ``<model>-<asset>-<precision>-trial<N>`` (tag ``trial``), its
  folder ``hydra.sweep.subdir`` must hold ``${hydra.job.num}`` (the ``hparams_search`` configs
  set ``<model>_<asset>_<precision>_trial<N>``; :func:`check_search_config` refuses a sweep
  whose trials would share a folder).
- **Packing** (``strategy=parallel``, :mod:`foxhunt.sweeps.packing`). The plan is made from
  the *largest* trial of the search space (:func:`planning_cells`): every searched key at its
  largest value (numbers at their maximum, an interval at its upper bound, lists of numbers
  such as ``hidden_sizes`` the one with the largest sum), keys whose values have no order
  (strings, booleans, config groups) at every value, as a grid; the largest estimate of those
  cells bounds every trial. ``n_jobs`` is then the number of such trials that fit together,
  at most ``hydra.sweeper.n_jobs`` (the trials that run at once) and the cores.
  When a trial starts it gets the same fail-fast check as a grid cell
  (:func:`foxhunt.sweeps.estimates.check_fits`): if the largest trial fits the budget every
  trial does; if not, the trial's own peak is estimated (same sources as a cell) and a trial
  over the budget fails before training, recorded FAILED while the study goes on.
- **Failures.** A job that fails returns ``None`` and writes FAILED in its ``cell.json``
  (:mod:`foxhunt.sweeps.sweep_cell`); the sweeper tells the study the trial FAILED (as it does
  for a value that is missing or not finite) and goes on, unless more than
  ``hydra.sweeper.max_failure_rate`` of the trials failed (the configs: 1.0, never gives up).
  The sweep then exits 1 naming the failed trials. A trial the pruner stopped is PRUNED, no
  failure (:mod:`foxhunt.sweeps.pruning`).
- **Result.** The summary lists the study's trials, every launch's (:mod:`foxhunt.sweeps.summary`):
  each one's state and the value(s) told to the study, with its ``cell.json`` metrics;
  :func:`best_trial` picks the best by the study's direction as Optuna does (finite values of
  the trials that finished; the first of equal values), and the callback prints it and tags the
  parent run (``best_trial``, ``best_trial.value``, ``best_trial.overrides``,
  ``best_trial.run_id``). A study of several objectives has a Pareto front instead
  (:func:`describe_pareto`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, cast

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Transformer
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from foxhunt.errors import ConfigError, one_line_error
from foxhunt.runs.cell import CellResult
from foxhunt.runs.status import OK_RESULTS
from foxhunt.sweeps.grid import expand_grid
from foxhunt.sweeps.space import distributions
from foxhunt.sweeps.study import StudyFile, settings_from

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
JOB_NUM = "hydra.job.num"  # what a trial's folder name must hold
MAXIMIZE, MINIMIZE = "maximize", "minimize"


class SearchConfigError(ConfigError):
    """A search sweep that cannot run as configured (one line naming the key)."""


def is_search(config: DictConfig) -> bool:
    """True when ``config``'s sweeper picks the jobs' configs (not Hydra's basic grid sweeper)."""
    sweeper = config.hydra.get("sweeper")
    return sweeper is not None and str(sweeper.get("_target_", BASIC_SWEEPER)) != BASIC_SWEEPER


def trial_number() -> int | None:
    """The running job's trial number in a search sweep (its Hydra job number), else None."""
    if not HydraConfig.initialized():
        return None
    hydra_cfg = cast(DictConfig, HydraConfig.get())  # typed as the HydraConf dataclass; it is its DictConfig
    if str(hydra_cfg.sweeper.get("_target_", BASIC_SWEEPER)) == BASIC_SWEEPER or hydra_cfg.job.get("num") is None:
        return None
    return int(hydra_cfg.job.num)


def trial_study() -> str | None:
    """The running trial's study, as its sweep's ``study.json`` names it (the job's own
    ``study_name`` may resolve otherwise: ``${model.name}-${asset.name}`` under a searched asset), else None."""
    if trial_number() is None:
        return None
    found = StudyFile.read(Path(str(HydraConfig.get().sweep.dir)))
    return None if found is None else found.study_name


def job_overrides() -> list[str]:
    """The running job's task overrides (command line and what the sweeper chose)."""
    return task_overrides(HydraConfig.get().overrides.task)


def task_overrides(task: Any) -> list[str]:
    """Hydra's ``overrides.task`` (a list of override strings) as plain strings."""
    plain = OmegaConf.to_container(task, resolve=False)
    assert isinstance(plain, list), type(plain)  # Hydra keeps the overrides as a list
    return [str(o) for o in plain]


def override_key(text: str) -> str:
    return text.split("=", 1)[0].lstrip("+~")


def study_name(config: DictConfig) -> str | None:
    name = config.hydra.sweeper.get("study_name")
    return None if name is None else str(name)


def direction(config: DictConfig) -> str | None:
    """``maximize`` or ``minimize``; None for a multi-objective study (several directions)."""
    value = config.hydra.sweeper.get("direction", MINIMIZE)
    if OmegaConf.is_list(value) or isinstance(value, (list, tuple)):
        if len(value) != 1:
            return None
        value = value[0]
    return str(value).rsplit(".", 1)[-1].lower()  # also an optuna-sweeper Direction enum


def search_arguments(config: DictConfig) -> tuple[list[str], dict[str, str]]:
    """(fixed command-line overrides, searched key -> its override text), as the Optuna
    sweeper reads them: ``hydra.sweeper.params`` first, then the command line, whose plain
    value fixes a searched key and whose sweep (comma list, ``interval(...)``) searches one."""
    params = config.hydra.sweeper.get("params") or {}
    space: dict[str, str] = {}
    for key, value in params.items():
        if not isinstance(value, str):
            raise SearchConfigError(
                f"hydra.sweeper.params.{key}={value}: packing plans search spaces written as Hydra override "
                f"strings (choice(...), interval(...)); set strategy.n_jobs to a number"
            )
        space[str(key)] = value
    fixed = []
    parser = OverridesParser.create()
    for text in task_overrides(config.hydra.overrides.task):
        override = parser.parse_override(str(text))
        key = override.get_key_element()
        if override.is_sweep_override():
            space[key] = str(text).split("=", 1)[1]
        else:
            space.pop(key, None)
            fixed.append(str(text))
    return fixed, space


def search_keys(config: DictConfig) -> list[str]:
    """The keys the sweep searches (see :func:`_search_arguments`)."""
    try:
        return list(search_arguments(config)[1])
    except SearchConfigError:
        return [str(k) for k in (config.hydra.sweeper.get("params") or {})]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def largest_value(override) -> Any | None:
    """The memory-largest value of one searched key, or None when its values have no order.

    Numbers: the maximum (an interval: its upper bound); lists of numbers: the largest sum,
    then the longest (``hidden_sizes``); anything else (strings, booleans, groups): None."""
    if override.is_interval_sweep():
        return override.value().end
    values = list(override.sweep_iterator(transformer=Transformer.identity))
    if values and all(_is_number(v) for v in values):
        return max(values)
    if values and all(isinstance(v, list) and v and all(_is_number(x) for x in v) for v in values):
        return max(values, key=lambda v: (sum(v), len(v)))
    return None


def planning_arguments(config: DictConfig) -> tuple[list[str], dict[str, str]]:
    """The overrides of the largest trial (see the module doc): a grid whose cells bound every
    trial, and what each searched key was planned at (for ``packing.json``)."""
    fixed, space = search_arguments(config)
    parser = OverridesParser.create()
    arguments, planned = list(fixed), {}
    for key, text in space.items():
        value = largest_value(parser.parse_override(f"{key}={text}"))
        if value is None:  # no order: every value, as grid cells
            arguments.append(f"{key}={text}")
            planned[key] = f"every value of {text}"
        else:
            arguments.append(f"{key}={Transformer.str(value)}")
            planned[key] = Transformer.str(value)
    return arguments, planned


def planning_cells(config: DictConfig, config_loader=None) -> tuple[list[list[str]], dict[str, str]]:
    """The override lists the packing estimates for a search sweep, and the planned values."""
    arguments, planned = planning_arguments(config)
    return expand_grid(arguments, config_loader), planned


def concurrent_trials(config: DictConfig) -> int:
    """How many trials a search sweep launches at once: ``hydra.sweeper.n_jobs`` (Optuna's
    batch), at most ``n_trials``."""
    sweeper = config.hydra.sweeper
    batch = int(sweeper.get("n_jobs") or 1)
    trials = sweeper.get("n_trials")
    return max(1, min(batch, int(trials)) if trials is not None else batch)


def check_search_config(config: DictConfig) -> None:
    """Refuse, in one line naming the key, a search sweep that cannot run as configured: trials
    that would share a folder, a study setting out of its range (:func:`foxhunt.sweeps.study.settings_from`),
    a searched key that is no search."""
    sweep = OmegaConf.to_container(config.hydra.sweep, resolve=False)
    assert isinstance(sweep, dict)  # hydra.sweep is a mapping
    subdir = str(sweep.get("subdir"))
    if JOB_NUM not in subdir:
        raise SearchConfigError(
            f"hydra.sweep.subdir={subdir}: the trials of a search sweep share model, asset and precision, "
            f"so their folder needs ${{{JOB_NUM}}} (the hparams_search configs set it)"
        )
    settings_from(config)
    searched = search_arguments(config)[1]
    distributions(searched)
    _check_searched_keys(config, searched)
    _check_sampler(config)


def _check_searched_keys(config: DictConfig, searched: dict[str, str]) -> None:
    """Each searched key names a setting of the config (``+key`` adds one): an unknown key was
    trial 0's failure after the study and the parent run were made, counted in n_trials for good."""
    missing = object()
    for key in searched:
        if key.startswith(("+", "~")) or key.startswith("hydra."):
            continue
        if OmegaConf.select(config, key, default=missing, throw_on_missing=False) is missing:
            raise SearchConfigError(f"{key}={searched[key]}: {key} is no setting of the config (a searched key must "
                                    f"exist; +{key}=... adds one)")  # fmt: skip


def _check_sampler(config: DictConfig) -> None:
    """``hydra.sweeper.sampler`` made once before anything else: a class that does not exist or a
    bad argument was a traceback after the parent run was made."""
    node = config.hydra.sweeper.get("sampler")
    if node is None:
        return
    try:
        instantiate(node)
    except Exception as exc:  # Hydra's InstantiationException around the sampler's own error
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise SearchConfigError(f"hydra.sweeper.sampler: cannot make the sampler ({one_line_error(cause, limit=300)})") from None


def trials(results: Iterable[CellResult]) -> list[CellResult]:
    numbered = [(r.trial, r) for r in results if r.trial is not None]
    return [r for _, r in sorted(numbered, key=lambda nr: nr[0])]


def has_value(result: CellResult) -> bool:
    return result.status in OK_RESULTS and result.objective is not None and math.isfinite(result.objective)


def best_trial(results: Iterable[CellResult], goal: str | None) -> CellResult | None:
    """The best trial by ``goal`` (``maximize`` / ``minimize``), as Optuna's ``best_trial``:
    among trials with a finite value, the first of the best values; None when there is none
    or the study has several objectives (``goal`` None)."""
    scored = [r for r in trials(results) if has_value(r)]
    if not scored or goal not in (MAXIMIZE, MINIMIZE):
        return None
    sign = 1.0 if goal == MAXIMIZE else -1.0
    return max(scored, key=lambda r: sign * objective_of(r))  # max keeps the first of equal values


def objective_of(result: CellResult) -> float:
    """The objective of a result that has a value (:func:`has_value`)."""
    assert result.objective is not None, result.cell
    return result.objective


def searched_overrides(result: CellResult, keys: Sequence[str]) -> list[str]:
    """The overrides of ``result`` that set a searched key: what the sampler chose."""
    wanted = set(keys)
    return [o for o in result.overrides or [] if override_key(o) in wanted]


def describe_best(best: CellResult | None, goal: str | None, keys: Sequence[str], count: int) -> str:
    """The lines printed at the end of a search sweep."""
    if goal is None:
        return "best trial: several objectives; the sweeper's optimization_results.yaml holds the Pareto front"
    if best is None:
        return f"best trial: none of {count} trials returned a finite value"
    overrides = " ".join(searched_overrides(best, keys)) or "(no searched key)"
    return f"best trial: {best.cell} ({goal}: {best.objective:.6g}), run {best.run_id or '-'}\n  overrides: {overrides}"


def describe_pareto(results: Sequence[CellResult], pareto: Sequence[int], values: dict[int, tuple[float, ...]],
                    objectives: Sequence[str], directions: Sequence[str], keys: Sequence[str]) -> str:  # fmt: skip
    """The lines printed at the end of a search of several objectives: its Pareto front, each
    trial with its values, run and searched overrides."""
    goals = ", ".join(f"{o} ({d})" for o, d in zip(objectives, directions))
    if not pareto:
        return f"Pareto front of {goals}: no trial finished"
    by_number = {r.trial: r for r in results}
    lines = [f"Pareto front of {goals}: {len(pareto)} trial{'s' if len(pareto) != 1 else ''}"]
    for number in pareto:
        result = by_number.get(number)
        name = result.cell if result is not None else f"trial{number}"
        told = ", ".join(f"{v:.6g}" for v in values.get(number, ()))
        overrides = " ".join(searched_overrides(result, keys)) if result is not None else ""
        lines.append(
            f"  {name} ({told}), run {(result.run_id if result is not None else None) or '-'}: {overrides or '(no searched key)'}"
        )
    return "\n".join(lines)
