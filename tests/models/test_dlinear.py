"""Tests of the DLinear forecaster: the decomposition's moving average against its definition,
ordered quantiles of the right shape at the config's size, a bad moving-average window's line,
and learning a planted AR(1) pattern (beating the zero forecast's loss and a coin's direction)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lightning import Trainer, seed_everything
from omegaconf import OmegaConf
from test_mamba2 import LEARN_HORIZON, LEARN_SEQ_LEN, REPO_ROOT, ar1_dataset

from foxhunt.config.schema import validate
from foxhunt.data.datamodules import ForecastDataModule
from foxhunt.errors import ConfigError
from foxhunt.models.dlinear import DLinearForecaster, moving_average
from foxhunt.models.forecaster import quantile_loss

CONFIG = REPO_ROOT / "conf" / "model" / "dlinear.yaml"


def _config_model(**changes) -> DLinearForecaster:
    cfg = OmegaConf.load(CONFIG)
    cfg.module.seq_len, cfg.module.horizon = cfg.window.seq_len, cfg.window.horizon
    for key, value in changes.items():
        cfg.module[key] = value
    return DLinearForecaster(**{k: v for k, v in OmegaConf.to_container(cfg.module).items() if k != "_target_"})


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 30), half=st.integers(0, 6), seed=st.integers(0, 2**16))
def test_moving_average_is_the_centred_mean_with_repeated_edges(length, half, seed):
    window = 2 * half + 1
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((2, length, 3)))
    padded = np.concatenate([np.repeat(x[:, :1].numpy(), half, 1), x.numpy(), np.repeat(x[:, -1:].numpy(), half, 1)], 1)
    expected = np.stack([padded[:, t : t + window].mean(axis=1) for t in range(length)], axis=1)
    np.testing.assert_allclose(moving_average(x, window).numpy(), expected, rtol=1e-12, atol=1e-12)


def test_config_size_gives_ordered_quantiles_for_every_window():
    model = _config_model().eval()
    batch = {"static": torch.randn(5, 4), "known": torch.randn(5, 60, 8), "observed": torch.randn(5, 50, 4)}
    forecast = model(batch)
    assert forecast.shape == (5, 10, 9)
    assert bool((forecast.diff(dim=-1) >= 0).all())
    assert sum(p.numel() for p in model.parameters()) < 5_000  # two 50 -> 10 maps and a 16 -> 9 head


@pytest.mark.parametrize("window", [24, 51])
def test_a_moving_average_that_is_even_or_longer_than_the_window_is_one_line(compose_cfg, window):
    line = rf"model.module.moving_average={window}: must be odd and <= model.module.seq_len \(50\)"
    with pytest.raises(ConfigError, match=line):
        validate(compose_cfg(["model=dlinear", f"model.module.moving_average={window}"]))
    with pytest.raises(ValueError, match=line):
        _config_model(moving_average=window)


@pytest.mark.parametrize("seed", [0, 1])
def test_learns_planted_ar1_pattern(seed):
    seed_everything(seed, verbose=False)
    datamodule = ForecastDataModule(ar1_dataset(seed), seq_len=LEARN_SEQ_LEN, horizon=LEARN_HORIZON, batch_size=64, eval_batch_size=64,
                                    seed=seed)  # fmt: skip
    model = DLinearForecaster(input_dim=16, seq_len=LEARN_SEQ_LEN, horizon=LEARN_HORIZON, moving_average=5, dropout=0.0,
                              quantiles=[0.1, 0.25, 0.5, 0.75, 0.9], learning_rate=1e-2, weight_decay=0.0,
                              position_threshold=0.0)  # fmt: skip
    trainer = Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0, limit_val_batches=0)  # fmt: skip
    trainer.fit(model, datamodule=datamodule)
    metrics = trainer.test(model, datamodule=datamodule, verbose=False)[0]
    windows = datamodule.windows("test")
    zero = torch.zeros(len(windows["target"]), LEARN_HORIZON, model.n_quantiles)
    assert metrics["test/loss"] < quantile_loss(zero, windows["target"], model.quantile_levels).item()
    assert metrics["test/direction_accuracy"] > 0.55  # AR(1) at 0.5: the last return says the next one's sign
