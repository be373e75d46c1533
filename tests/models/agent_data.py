"""Helpers for the RL agent tests: hand-built market datasets, configs and a short fit.

The planted dataset makes the 1-bar return predictable: price changes in ticks follow an AR(1)
process ``r[t] = ar * r[t-1] + noise`` and the observed ``log_return`` feature of bar ``t`` is
``r[t]`` (standardized), so holding ``sign(feature)`` from bar t to t + 1 earns about
``ar * E|r|`` ticks per step before costs. The other features are noise or constants.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from foxhunt.assets import AssetSpec
from foxhunt.data.datamodules import EnvDataModule
from foxhunt.data.dataset import MarketDataset, SplitArrays, feature_groups
from foxhunt.data.features import FEATURE_NAMES, FeatureConfig

# the feature settings of conf/data/pipeline/default.yaml (the future calendar reads them)
DEFAULT_FEATURES = FeatureConfig(momentum_bars=15, volatility_bars=30, volume_bars=60)

REPO_ROOT = Path(__file__).resolve().parents[2]
RETURN_COLUMN = FEATURE_NAMES.index("log_return")
# Costs of conf/train.yaml's execution node (per contract, per side).
COMMISSION_USD = 2.50
SLIPPAGE_TICKS = 0.5


def es_asset() -> AssetSpec:
    spec = OmegaConf.to_container(OmegaConf.load(REPO_ROOT / "conf/asset/es.yaml"))
    return AssetSpec(**{k: v for k, v in spec.items() if k != "_target_"})


def planted_dataset(
    seed: int,
    split_bars: tuple[int, int, int] = (6000, 2000, 2000),
    ar: float = 0.5,
    noise_ticks: float = 4.0,
) -> MarketDataset:
    """A MarketDataset whose return feature predicts the next bar's move (see module doc)."""
    asset = es_asset()
    rng = np.random.default_rng(seed)
    total = sum(split_bars)
    noise = rng.normal(0.0, noise_ticks, total)
    moves = np.zeros(total)  # moves[t] = (close[t] - close[t-1]) / tick_size
    for t in range(1, total):
        moves[t] = ar * moves[t - 1] + noise[t]
    moves = np.round(moves)  # prices stay on the tick grid
    close = asset.price_level + np.cumsum(moves) * asset.tick_size
    groups = feature_groups()
    features = np.zeros((total, len(FEATURE_NAMES)), dtype=np.float32)
    features[:, groups["static"]] = [0.5, 1.1, 1.0, 0.96]
    features[:, groups["known"]] = rng.uniform(-1.0, 1.0, (total, len(groups["known"])))
    features[:, groups["observed"]] = rng.normal(0.0, 1.0, (total, len(groups["observed"])))
    features[:, RETURN_COLUMN] = moves / moves.std()
    timestamps = np.datetime64("2024-01-02T00:00", "ns") + np.arange(total) * np.timedelta64(60, "s")
    splits, start = {}, 0
    for name, bars in zip(("train", "val", "test"), split_bars):
        part = slice(start, start + bars)
        splits[name] = SplitArrays(timestamps[part], features[part], close[part])
        start += bars
    return MarketDataset(
        asset=asset,
        feature_names=list(FEATURE_NAMES),
        groups=groups,
        splits=splits,
        target_scale=float(np.std(np.diff(np.log(close)))),
        feature_config=DEFAULT_FEATURES,
    )


def random_dataset(seed: int, split_bars: tuple[int, int, int] = (400, 150, 150)) -> MarketDataset:
    """A small dataset of random features and a random walk close (no pattern)."""
    return planted_dataset(seed, split_bars, ar=0.0)


def model_config(name: str, seed: int, env: dict | None = None, **module_overrides) -> DictConfig:
    """``conf/model/<name>.yaml`` under a root with ``seed``, with ``model.env`` and
    ``model.module`` overrides, interpolations resolved."""
    model = OmegaConf.load(REPO_ROOT / f"conf/model/{name}.yaml")
    root = OmegaConf.create({"seed": seed, "model": model})
    for key, value in (env or {}).items():
        OmegaConf.update(root, f"model.env.{key}", value)
    for key, value in module_overrides.items():
        OmegaConf.update(root, f"model.module.{key}", value)
    OmegaConf.resolve(root)
    return root.model


def env_datamodule(dataset: MarketDataset, cfg: DictConfig) -> EnvDataModule:
    env = OmegaConf.to_container(cfg.env)
    return EnvDataModule(
        dataset,
        num_envs=env["num_envs"],
        episode_len=env["episode_len"],
        steps_per_epoch=env["steps_per_epoch"],
        commission_usd=COMMISSION_USD,
        slippage_ticks=SLIPPAGE_TICKS,
    )


def cpu_trainer(max_steps: int, **kwargs) -> L.Trainer:
    warnings.filterwarnings("ignore", message=".*training_step. returned .None.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    options = dict(
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    options.update(kwargs)
    return L.Trainer(**options)


def build_agent(cfg: DictConfig):
    return instantiate(cfg.module)


@pytest.fixture(autouse=True)
def single_torch_thread():
    """Tiny networks on a shared 2-core machine: one intra-op thread is faster than two."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
