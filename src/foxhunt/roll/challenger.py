"""A challenger: the champion's own training config on the moved window, trained through
:func:`foxhunt.training.cell.run_cell` like any cell, and made ready to register.

**Its config** (:func:`challenger_config`): the champion's stored config (its version's
``config.yaml``, checked before anything in it is read: :mod:`foxhunt.config.stored`) with

- ``data.source``: the window's CSV snapshot (:func:`foxhunt.roll.window.write_window`), read by
  ``conf/data/csv.yaml``'s source with bars labelled at their start; the features, the split and
  every model, trainer and precision setting stay the champion's, so the challenger is selected
  on its own validation block as the champion was on its;
- its folders moved into the roll's (:func:`foxhunt.training.reproduce.reproduction_config`, which
  moves every path under the champion's folder), the feature cache the ensemble's;
- ``roll.init=champion``: its weights start from the champion's (the version's verified
  ``weights.pt``, copied into the challenger's folder: ``callbacks.warm_start``,
  :mod:`foxhunt.training.warm_start`), its optimizer, loop and replay buffer fresh; ``scratch``:
  from its seed;
- its MLflow run in ``roll.experiment`` (``task`` too), nested under its family's child of the
  roll run: never counted by ``foxhunt ensemble register``'s choice or a leaderboard of the
  training experiment.

**Ready to register** (:func:`prepare_challenger`): the registry's own preparation
(:func:`foxhunt.ensemble.registry.prepare`: checkpoint stamped for its run, config valid, the
saved MLflow model loaded and answering its input example), before it is scored, so what is
scored is exactly what a promotion registers.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from foxhunt.config.compose import compose_config
from foxhunt.config.schema import resolved_config
from foxhunt.config.stored import TARGET
from foxhunt.ensemble.registry import SELECTION_PREFIXES, Choice, prepare
from foxhunt.runs.tags import Tag
from foxhunt.training.cell import run_cell
from foxhunt.training.reproduce import reproduction_config

WARM_START = "foxhunt.training.warm_start.WarmStart"  # conf/callbacks/default.yaml's warm_start
ROLE_TAG = "roll.role"  # run tag in roll.experiment: roll (a step's run), family (its child per family), challenger, rollback
ROLL_RUN_TAG = "roll.run_id"  # a challenger's and a registered version's tag: the roll run it came from


def challenger_config(
    stored: DictConfig, cfg: DictConfig, window_file: Path, out_dir: Path, champion_weights: Path
) -> DictConfig:
    """The champion's ``stored`` config training on ``window_file`` into ``out_dir``, its weights
    from ``champion_weights`` with ``roll.init=champion`` (module doc)."""
    logger = cfg.logger
    moved = reproduction_config(stored, out_dir, str(logger.tracking_uri), logger.artifact_location)
    csv = compose_config(["data=csv", "data.source.bar_label=start"], root_dir=str(cfg.paths.root_dir), output_dir=str(out_dir))
    plain = OmegaConf.to_container(moved, resolve=False)
    assert isinstance(plain, dict)  # a run's config is a mapping
    plain["data"]["source"] = OmegaConf.to_container(csv.data.source, resolve=True)
    plain["data"]["source"]["path"] = str(window_file)  # set, not an override: a folder holding '=' broke the grammar
    plain["data"]["cache_dir"] = str(cfg.data.cache_dir)
    plain["paths"].update({key: str(cfg.paths[key]) for key in ("root_dir", "mlruns_dir", "cache_dir")})
    plain["paths"]["output_dir"] = str(out_dir)
    experiment = str(cfg.roll.experiment)
    plain["task"] = experiment
    plain["logger"]["experiment"] = experiment
    plain["ckpt"] = None
    start = None
    if str(cfg.roll.init) == "champion":
        start = out_dir / "champion-weights.pt"  # the challenger's folder keeps what it started from
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(champion_weights, start)
    plain["callbacks"]["warm_start"] = {TARGET: WARM_START, "path": None if start is None else str(start)}
    challenger = OmegaConf.create(plain)
    resolved_config(challenger)  # its interpolations resolve (${paths.output_dir} ...) before anything trains
    return challenger


def train_challenger(cfg: DictConfig, family: str, asset: str, parent_run_id: str, roll_run_id: str):
    """Train one challenger (its :class:`~foxhunt.runs.cell.CellResult`)."""
    tags = {ROLE_TAG: "challenger", ROLL_RUN_TAG: roll_run_id}
    return run_cell(cfg, parent_run_id=parent_run_id, extra_tags=tags, run_name=f"challenger-{family}-{asset}")


def prepare_challenger(store, result, family: str, name: str, metric: str, workdir: Path, environment, example_decided: int):
    """The challenger's version, prepared and checked (module doc); None when its run has no value
    of the selection metric (nothing to register), with why."""
    run = store.get(result.run_id)
    value = run.metric(metric)
    if value is None:
        return None, f"its run {result.run_id} has no {metric}"
    selection = {k: v for k, v in run.metric_values().items() if k.startswith(SELECTION_PREFIXES)}
    choice = Choice(family=family, run_id=result.run_id, run_name=run.name, value=value, considered=1, without_metric=0,
                    start_ms=run.start_ms, selection=selection)  # fmt: skip
    return prepare(store, choice, name, metric, workdir, environment, example_decided), ""


def child_tags(family: str, asset: str) -> dict[str, str]:
    return {ROLE_TAG: "family", Tag.MODEL: family, Tag.ASSET: asset}
