"""Building a run's parts from a composed config: one place for every entry point.

``foxhunt-train`` and the ``foxhunt memory`` commands (which build models to measure them)
compose the same ``conf/train.yaml`` (commands through :func:`foxhunt.config.compose.compose_config`)
and build data, model and precision the same way, so a figure measured by a command describes the
run ``foxhunt-train`` would make.

A measuring fit (:mod:`foxhunt.memory.training_run`, :mod:`foxhunt.memory.predict`: they know
no model, job or command line) gets what it builds from :class:`MeasuringRuns`: the run's
parts, its callbacks but those that only write files or print, and the batch key a model's
activations scale with. Model memory does not depend on the amount of data (forecasters read
batches of the configured size; the agents' environments and their feature arrays stay on the
host), so :func:`measuring_config` cuts the synthetic source to :data:`MEASURE_DATA_DAYS`
calendar days unless ``data.source.days`` is overridden; another source is read as configured.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from foxhunt.config.compose import compose_config
from foxhunt.config.schema import validate
from foxhunt.data.datamodules import EnvDataModule, ForecastDataModule
from foxhunt.data.dataset import load_market_dataset
from foxhunt.data.splits import FoldSplit, SplitConfig, WalkForwardConfig
from foxhunt.precision.plugin import precision_plugin

#: Calendar days of synthetic bars for a measuring fit: enough for every model to reach a
#: step with gradients (agents' episodes, forecasters' windows) and build in about a second.
MEASURE_DATA_DAYS = 7
#: Callbacks of ``conf/callbacks`` that a measuring fit leaves out: they write checkpoints,
#: report progress or print, and hold no tensor of the run; the memory callback is replaced by
#: the measuring one. Any other configured callback runs, as in ``foxhunt-train``.
SKIPPED_CALLBACKS = frozenset(
    {
        "lightning.pytorch.callbacks.ModelCheckpoint",
        "lightning.pytorch.callbacks.TQDMProgressBar",
        "lightning.pytorch.callbacks.RichProgressBar",
        "foxhunt.training.graceful_stop.GracefulStop",
        "foxhunt.training.resume_point.ResumePoint",
        "foxhunt.training.progress.ProgressReporter",
        "foxhunt.memory.callback.MemoryBudgetCallback",
    }
)
#: The config key holding the batch that a model's activations scale with: forecasters read
#: ``model.window.batch_size`` windows per step; each agent's own update batch is listed here.
AGENT_BATCH_KEYS = {
    "foxhunt.models.dqn.DQNAgent": "model.module.batch_size",
    "foxhunt.models.ppo.PPOAgent": "model.module.minibatch_size",
}
FORECASTER_BATCH_KEY = "model.window.batch_size"


@dataclass
class RunParts:
    asset: Any  # foxhunt.assets.AssetSpec
    source: Any  # the bar source (foxhunt.data.sources)
    dataset: Any  # foxhunt.data.dataset.MarketDataset
    datamodule: Any  # ForecastDataModule | EnvDataModule
    model: Any  # the LightningModule
    precision: Any  # the Trainer's precision plugin, holding the run's policy (foxhunt.precision.plugin)


def build_datamodule(cfg: DictConfig, dataset):
    """The datamodule a model family reads: env settings for agents, windows for forecasters."""
    if cfg.model.kind == "agent":
        return EnvDataModule(
            dataset=dataset,
            episode_len=cfg.model.env.episode_len,
            num_envs=cfg.model.env.num_envs,
            steps_per_epoch=cfg.model.env.steps_per_epoch,
            commission_usd=cfg.execution.commission_usd,
            slippage_ticks=cfg.execution.slippage_ticks,
        )
    return ForecastDataModule(
        dataset=dataset,
        seq_len=cfg.model.window.seq_len,
        horizon=cfg.model.window.horizon,
        batch_size=cfg.model.window.batch_size,
        eval_batch_size=cfg.model.window.eval_batch_size,
        seed=cfg.seed,
    )


def build_model(cfg: DictConfig):
    """The LightningModule of ``cfg.model.module`` (plain lists, so checkpoints load with
    ``torch.load(weights_only=True)``)."""
    return instantiate(cfg.model.module, _convert_="all")


def run_split(cfg: DictConfig, open_holdout: bool = False):
    """The split a run trains and scores on: ``data.split``, or its walk-forward fold
    (``evaluation.fold``, set on each fold's run by :mod:`foxhunt.training.folds`), with the lockbox
    ``evaluation.holdout`` cut off the end (``open_holdout``: held as the split ``holdout``,
    for the one recorded report of ``foxhunt ensemble register --holdout`` only)."""
    holdout = float(cfg.evaluation.get("holdout") or 0.0)
    fold = cfg.evaluation.get("fold")
    if cfg.evaluation.protocol != "walk_forward" or fold is None:
        return dataclasses.replace(SplitConfig.from_config(cfg.data.split), holdout=holdout, open_holdout=open_holdout)
    return FoldSplit(WalkForwardConfig.from_config(cfg.evaluation.walk_forward), int(fold), holdout, open_holdout)


def build_precision(cfg: DictConfig, accelerator: str | None = None):
    """The Trainer's precision plugin of ``cfg`` (:func:`foxhunt.precision.plugin.precision_plugin`):
    the run's policy, built once, on ``accelerator`` (default: the Trainer's). One per Trainer."""
    return precision_plugin(instantiate(cfg.precision), accelerator or cfg.trainer.get("accelerator", "auto"))


def build_dataset(cfg: DictConfig, asset=None, source=None, open_holdout: bool = False, cached: bool = True):
    """The market dataset of a validated config, the one every command and run reads: its bars
    (``source``, default ``cfg.data.source``) for ``asset`` (default ``cfg.asset``), its features,
    and the split it trains and scores on (:func:`run_split`: ``data.split`` or the run's
    walk-forward fold, the lockbox cut off unless ``open_holdout``); cached in
    ``data.cache_dir`` unless ``cached`` is false (the lockbox, opened once, leaves no cache)."""
    asset = instantiate(cfg.asset) if asset is None else asset
    source = instantiate(cfg.data.source) if source is None else source
    cache = cfg.data.cache_dir if cached else None
    return load_market_dataset(source, asset, cfg.data.features, run_split(cfg, open_holdout=open_holdout), cache)


def build_parts(cfg: DictConfig) -> RunParts:
    """Asset, cached market dataset, datamodule, model and precision plugin of a validated config."""
    asset = instantiate(cfg.asset)
    source = instantiate(cfg.data.source)
    precision = build_precision(cfg)
    dataset = build_dataset(cfg, asset, source)
    datamodule = build_datamodule(cfg, dataset)
    model = build_model(cfg)
    return RunParts(asset=asset, source=source, dataset=dataset, datamodule=datamodule, model=model, precision=precision)


def measuring_config(
    model: str,
    overrides: Sequence[str] = (),
    root_dir: str | os.PathLike | None = None,
    output_dir: str | os.PathLike | None = None,
) -> DictConfig:
    """``conf/train.yaml`` composed with ``model=<model>`` and ``overrides``, as
    ``foxhunt-train`` would compose it, with the synthetic data cut to
    :data:`MEASURE_DATA_DAYS` days unless ``overrides`` set ``data.source.days``.

    Raises Hydra's error for a bad override and :class:`foxhunt.config.schema.ConfigError` for
    a bad value (both carry the key)."""
    cfg = compose_config(
        [f"model={model}", *overrides], root_dir=root_dir, output_dir=None if output_dir is None else str(output_dir)
    )
    user_days = any(item.split("=", 1)[0].lstrip("+~") == "data.source.days" for item in overrides)
    if "days" in cfg.data.source and not user_days:
        OmegaConf.update(cfg, "data.source.days", MEASURE_DATA_DAYS, merge=False)
    validate(cfg)
    return cfg


class MeasuringRuns:
    """What a measuring fit builds from (:class:`foxhunt.memory.training_run.RunFactory`)."""

    def parts(self, cfg: DictConfig) -> RunParts:
        return build_parts(cfg)

    def model(self, cfg: DictConfig):
        return build_model(cfg)

    def callbacks(self, cfg: DictConfig) -> list:
        nodes = (cfg.get("callbacks") or {}).values()
        return [instantiate(n) for n in nodes if n is not None and str(n.get("_target_", "")) not in SKIPPED_CALLBACKS]

    def batch_key(self, cfg: DictConfig) -> str | None:
        if cfg.model.kind == "forecaster":
            return FORECASTER_BATCH_KEY
        return AGENT_BATCH_KEYS.get(str(cfg.model.module.get("_target_", "")))


MEASURING_RUNS = MeasuringRuns()
