"""Building a run's parts from a composed config: one place for every entry point.

``foxhunt-train`` and the ``foxhunt memory`` commands (which build models to measure them)
compose the same ``conf/train.yaml`` and build data, model and precision the same way, so a
figure measured by a command describes the run ``foxhunt-train`` would make.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig


def compose_config(overrides: list[str], root_dir: str | os.PathLike | None = None, output_dir: str | None = None) -> DictConfig:
    """Compose ``conf/train.yaml`` with Hydra overrides outside ``@hydra.main``.

    ``paths.root_dir`` defaults to ``$FOXHUNT_ROOT`` or the current folder, as for
    ``foxhunt-train``; ``output_dir`` defaults to ``<root>/outputs/commands``. Raises Hydra's own
    error for an unknown group option or a malformed override.
    """
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from foxhunt.runs.environment import root_dir as default_root

    root = Path(root_dir).resolve() if root_dir else default_root()
    out = output_dir or str(root / "outputs" / "commands")
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="foxhunt.conf", version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[f"paths.root_dir={root}", f"paths.output_dir={out}", *overrides],
            return_hydra_config=True,
        )
    HydraConfig.instance().set_config(cfg)
    return cfg


@dataclass
class RunParts:
    asset: Any  # foxhunt.assets.AssetSpec
    dataset: Any  # foxhunt.data.dataset.MarketDataset
    datamodule: Any  # ForecastDataModule | EnvDataModule
    model: Any  # the LightningModule
    precision: Any  # foxhunt.precision.PrecisionPolicy


def build_datamodule(cfg: DictConfig, dataset):
    """The datamodule a model family reads: env settings for agents, windows for forecasters."""
    from foxhunt.data.datamodules import EnvDataModule, ForecastDataModule

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
    )


def build_model(cfg: DictConfig):
    """The LightningModule of ``cfg.model.module`` (plain lists, so checkpoints load with
    ``torch.load(weights_only=True)``)."""
    from hydra.utils import instantiate

    return instantiate(cfg.model.module, _convert_="all")


def build_parts(cfg: DictConfig) -> RunParts:
    """Asset, cached market dataset, datamodule, model and precision policy of a validated config."""
    from hydra.utils import instantiate

    from foxhunt.data.dataset import load_market_dataset

    asset = instantiate(cfg.asset)
    source = instantiate(cfg.data.source)
    precision = instantiate(cfg.precision)
    dataset = load_market_dataset(source, asset, cfg.data.features, cfg.data.split, cfg.data.cache_dir)
    datamodule = build_datamodule(cfg, dataset)
    model = build_model(cfg)
    return RunParts(asset=asset, dataset=dataset, datamodule=datamodule, model=model, precision=precision)
