"""Datamodules: forecast windows (hand-checked slices, targets, shapes, order) and env plumbing."""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from market_bars import load_asset, make_bars

from foxhunt.data.datamodules import EnvDataModule, ForecastDataModule
from foxhunt.data.dataset import build_market_dataset
from foxhunt.data.features import (
    FEATURE_GROUPS,
    compute_features,
    future_known_features,
)
from foxhunt.data.splits import SplitError
from foxhunt.trading.env import TradingEnv

ES = load_asset("es")
FEATURES_CFG = {
    "momentum_bars": 5,
    "volatility_bars": 10,
    "volume_bars": 20,
    "rth_open": "09:30",
    "rth_close": "16:00",
    "rth_tz": "America/New_York",
}
SPLIT_CFG = {"train": 0.6, "val": 0.2, "test": 0.2, "gap_bars": 5}
SEQ_LEN, HORIZON = 50, 10
STATIC, KNOWN, OBSERVED = list(range(4)), list(range(4, 12)), list(range(12, 16))


@pytest.fixture(scope="module")
def dataset():
    # 619 bars - 19 warm-up = 600; usable 590: train 354, val 118, test 118
    return build_market_dataset(make_bars(ES, 619, seed=2), ES, FEATURES_CFG, SPLIT_CFG)


@pytest.fixture(scope="module")
def forecast(dataset):
    return ForecastDataModule(dataset, seq_len=SEQ_LEN, horizon=HORIZON, batch_size=7, eval_batch_size=7, seed=0)


def test_window_counts(dataset, forecast):
    assert {k: len(v) for k, v in dataset.splits.items()} == {"train": 354, "val": 118, "test": 118}
    for split, arrays in dataset.splits.items():
        assert len(forecast.split_dataset(split)) == len(arrays) - SEQ_LEN - HORIZON + 1
    assert len(forecast.split_dataset("val")) == 59
    assert forecast.group_dims == {"static": 4, "known": 8, "observed": 4}


def test_hand_checked_window(dataset, forecast):
    val = dataset.splits["val"]
    window = forecast.split_dataset("val")[3]  # last bar i = 49 + 3 = 52
    features = torch.from_numpy(val.features)
    assert torch.equal(window["observed"], features[3:53, OBSERVED])
    assert torch.equal(window["known"][:SEQ_LEN], features[3:53, KNOWN])
    # the future part is the calendar of the 10 clock minutes after bar 52, not of bars 53..62
    future = future_known_features(val.timestamps[52:53], HORIZON, ES, FEATURES_CFG)[0]
    assert torch.equal(window["known"][SEQ_LEN:], torch.from_numpy(future))
    assert torch.equal(window["static"], features[52, STATIC])
    close = val.close
    expected = [np.log(close[52 + k] / close[52 + k - 1]) / dataset.target_scale for k in range(1, HORIZON + 1)]
    np.testing.assert_allclose(window["target"].numpy(), expected, rtol=1e-5)
    assert all(t.dtype == torch.float32 for t in window.values())
    # the last window reaches the last bar of the split with its horizon
    last = forecast.split_dataset("val")[-1]
    assert last["target"][-1].item() == pytest.approx(np.log(close[-1] / close[-2]) / dataset.target_scale, rel=1e-5)
    with pytest.raises(IndexError, match="window 59: out of range"):
        forecast.split_dataset("val")[59]


def test_batch_shapes(forecast):
    batch = next(iter(forecast.val_dataloader()))
    assert batch["static"].shape == (7, 4)
    assert batch["known"].shape == (7, SEQ_LEN + HORIZON, 8)
    assert batch["observed"].shape == (7, SEQ_LEN, 4)
    assert batch["target"].shape == (7, HORIZON)
    assert {t.dtype for t in batch.values()} == {torch.float32}


def test_windows_match_items_in_order(forecast, dataset):
    for split in ("train", "test"):
        windows = forecast.windows(split)
        items = forecast.split_dataset(split)
        n = len(items)
        assert torch.equal(windows["bar_index"], torch.arange(SEQ_LEN - 1, SEQ_LEN - 1 + n))
        assert windows["bar_index"].dtype == torch.long
        assert int(windows["bar_index"][-1]) == len(dataset.splits[split]) - HORIZON - 1
        for key in ("static", "known", "observed", "target"):
            stacked = torch.stack([items[j][key] for j in range(n)])
            assert windows[key].shape == stacked.shape
            assert torch.equal(windows[key], stacked), (split, key)
    # the eval loader walks the windows in the same order
    val = forecast.windows("val")
    batches = list(forecast.val_dataloader())
    assert torch.equal(torch.cat([b["target"] for b in batches]), val["target"])


def test_the_future_calendar_is_that_of_the_next_clock_minutes(dataset):
    import pandas as pd

    stamps = dataset.splits["test"].timestamps[:7]
    future = future_known_features(stamps, HORIZON, ES, FEATURES_CFG)
    for row, stamp in enumerate(stamps):  # the batch pipeline's calendar of those minutes as bars
        minutes = pd.date_range(pd.Timestamp(stamp, tz="UTC") + pd.Timedelta(minutes=1), periods=HORIZON, freq="min")
        bars = pd.DataFrame({c: 1.0 for c in ("open", "high", "low", "close", "volume")}, index=minutes)
        known = compute_features(bars, ES, FEATURES_CFG)[list(FEATURE_GROUPS["known"])].to_numpy(np.float32)
        np.testing.assert_array_equal(future[row], known)


def test_input_windows_decide_at_every_bar_with_a_full_past(forecast, dataset):
    for split in ("val", "test"):
        inputs = forecast.input_windows(split)
        bars = len(dataset.splits[split])
        assert torch.equal(inputs["bar_index"], torch.arange(SEQ_LEN - 1, bars))  # the last horizon bars too
        training = forecast.windows(split)
        n = len(training["bar_index"])
        for key in ("static", "known", "observed"):  # where both exist they are the same windows
            assert torch.equal(inputs[key][:n], training[key]), (split, key)
        assert "target" not in inputs


def test_train_loader_shuffles_all_windows(forecast):
    torch.manual_seed(0)
    targets = torch.cat([b["target"] for b in forecast.train_dataloader()])
    ordered = forecast.windows("train")["target"]
    assert targets.shape == ordered.shape
    assert not torch.equal(targets, ordered)
    assert torch.equal(targets.sum(dim=1).sort().values, ordered.sum(dim=1).sort().values)


def test_split_too_short_for_a_window(dataset):
    with pytest.raises(
        SplitError,
        match=r"model.window.seq_len \+ model.window.horizon = 100 \+ 20 = 120 bars: "
        r"the val split has 118, not one window",
    ):
        ForecastDataModule(dataset, seq_len=100, horizon=20, batch_size=7, eval_batch_size=7, seed=0)
    with pytest.raises(ValueError, match=r"model.window.batch_size=0"):
        ForecastDataModule(dataset, seq_len=SEQ_LEN, horizon=HORIZON, batch_size=0, eval_batch_size=7, seed=0)


class _TinyForecaster(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(SEQ_LEN * 4, HORIZON)

    def training_step(self, batch, batch_idx):
        prediction = self.head(batch["observed"].flatten(1))
        return torch.nn.functional.mse_loss(prediction, batch["target"])

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", torch.nn.functional.mse_loss(self.head(batch["observed"].flatten(1)), batch["target"]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_lightning_fit_runs_on_forecast_module(forecast, tmp_path):
    trainer = pl.Trainer(
        max_steps=2,
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        accelerator="cpu",
    )
    trainer.fit(_TinyForecaster(), datamodule=forecast)
    assert trainer.global_step == 2


ENV = {"num_envs": 3, "episode_len": 20, "steps_per_epoch": 5, "commission_usd": 2.0, "slippage_ticks": 0.5}


def test_env_module_builds_envs_over_a_split(dataset):
    module = EnvDataModule(dataset, **ENV)
    env = module.make_env("val", num_envs=4, seed=1)
    assert isinstance(env, TradingEnv)
    assert env.num_envs == 4 and env.episode_len == 20
    assert env.cost_per_contract_usd == pytest.approx(2.0 + 0.5 * 12.5)
    assert torch.equal(env.features, torch.from_numpy(dataset.splits["val"].features))
    obs = env.reset()
    assert obs.shape == (4, module.observation_dim) == (4, 17)
    assert module.make_env("train").num_envs == 3
    sequential = module.make_eval_env("test")
    assert sequential.episode_len == len(dataset.splits["test"]) - 1


def test_env_module_loaders(dataset):
    module = EnvDataModule(dataset, **ENV)
    assert [int(x) for x in module.train_dataloader()] == [0, 1, 2, 3, 4]
    assert len(list(module.val_dataloader())) == 1
    assert len(list(module.test_dataloader())) == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"episode_len": 354}, r"model.env.episode_len=354: exceeds the train split \(354 bars"),
        ({"num_envs": 0}, r"model.env.num_envs=0: must be an integer >= 1"),
        ({"commission_usd": -1.0}, r"execution.commission_usd=-1.0: must be a number >= 0"),
    ],
)
def test_env_module_errors(dataset, change, message):
    with pytest.raises(ValueError, match=message):
        EnvDataModule(dataset, **{**ENV, **change})
