"""Tests of the shared forecaster base: pinball loss, the forecasters' shared hyperparameters,
logged metrics, optimizer and the forecast -> position mapping."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lightning import Trainer
from torch import nn
from torch.utils.data import DataLoader

from foxhunt.config.model_schemas import HyperparameterError
from foxhunt.models.forecaster import ForecasterHyperparameters, ForecasterModule, quantile_loss

QUANTILES = [0.1, 0.5, 0.9]


class EchoForecaster(ForecasterModule):
    """Forecasts read straight from the batch: every quantile of step h equals
    `scale * observed[:, -1, 0] + offset[q]`, so tests know the forecasts exactly."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()
        self.scale = nn.Parameter(torch.ones(()))
        self.register_buffer("offset", torch.linspace(-1.0, 1.0, len(self.quantiles)))

    def forward(self, batch):
        base = self.scale * batch["observed"][:, -1, 0]
        return base[:, None, None] + self.offset.expand(len(base), self.horizon, -1)


def make_echo(horizon: int = 3, threshold: float = 0.5) -> EchoForecaster:
    return EchoForecaster(
        quantiles=QUANTILES, horizon=horizon, learning_rate=1e-2, weight_decay=0.25, position_threshold=threshold
    )


def window_batch(last_observed: list[float], target: list[list[float]]) -> dict[str, torch.Tensor]:
    n = len(last_observed)
    observed = torch.zeros(n, 2, 1)
    observed[:, -1, 0] = torch.tensor(last_observed)
    return {
        "static": torch.zeros(n, 1),
        "known": torch.zeros(n, 2 + len(target[0]), 1),
        "observed": observed,
        "target": torch.tensor(target),
    }


def test_quantile_loss_hand_computed():
    pred = torch.tensor([[[0.0, 1.0, 2.0], [-1.0, -2.0, 0.0]]])  # (B=1, H=2, Q=3)
    target = torch.tensor([[1.0, -2.0]])
    # step 1, y = 1:  q=.1 e=1 -> .1 ; q=.5 e=0 -> 0 ; q=.9 e=-1 -> .1
    # step 2, y = -2: q=.1 e=-1 -> .9 ; q=.5 e=0 -> 0 ; q=.9 e=-2 -> .2
    expected = (0.1 + 0.0 + 0.1 + 0.9 + 0.0 + 0.2) / 6
    assert quantile_loss(pred, target, QUANTILES).item() == pytest.approx(expected, abs=1e-7)


def test_quantile_loss_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="quantile_loss"):
        quantile_loss(torch.zeros(2, 3, 3), torch.zeros(2, 4), QUANTILES)
    with pytest.raises(ValueError, match="levels"):
        quantile_loss(torch.zeros(2, 3, 2), torch.zeros(2, 3), QUANTILES)


@settings(max_examples=50, deadline=None)
@given(
    values=st.lists(st.floats(-100, 100, allow_nan=False), min_size=4, max_size=4),
    shift=st.floats(0.01, 10),
    q=st.sampled_from(QUANTILES),
)
def test_quantile_loss_is_zero_on_target_and_linear_off_it(values, shift, q):
    target = torch.tensor(values, dtype=torch.float64).view(2, 2)
    exact = target.unsqueeze(-1)
    assert quantile_loss(exact, target, [q]).item() == 0.0
    # forecasting too high by `shift` costs (1 - q) * shift, too low costs q * shift
    assert quantile_loss(exact + shift, target, [q]).item() == pytest.approx((1 - q) * shift)
    assert quantile_loss(exact - shift, target, [q]).item() == pytest.approx(q * shift)


def test_quantile_loss_minimised_by_empirical_quantile():
    samples = torch.arange(1.0, 11.0).view(10, 1)  # 1..10
    losses = {c: quantile_loss(torch.full((10, 1, 1), c), samples, [0.2]).item() for c in (1.0, 2.5, 5.0, 8.0)}
    assert min(losses, key=losses.get) == 2.5  # any point in [2, 3] is a 0.2-quantile of 1..10


SHARED = {"input_dim": 16, "seq_len": 50, "horizon": 10, "dropout": 0.1, "quantiles": QUANTILES, "learning_rate": 1e-3,
          "weight_decay": 0.0, "position_threshold": 0.0}  # fmt: skip


@pytest.mark.parametrize(
    ("levels", "message"),
    [
        ([0.1, 0.9], "must include the median 0.5"),
        ([0.5, 0.1, 0.9], "strictly increasing"),
        ([0.1, 0.5, 0.5], "strictly increasing"),
        ([0.0, 0.5], "numbers > 0 and < 1"),
        ([0.5, 1.0], "numbers > 0 and < 1"),
        ([], "non-empty"),
    ],
)
def test_the_shared_definition_refuses_bad_quantiles(levels, message):
    with pytest.raises(HyperparameterError, match=rf"^model\.module\.quantiles=.*{message}"):
        ForecasterHyperparameters.check({**SHARED, "quantiles": levels})


def test_the_shared_definition_refuses_a_negative_threshold_and_keeps_good_values():
    with pytest.raises(HyperparameterError, match=r"^model\.module\.position_threshold=-1\.0: must be a number >= 0 and <= 1e6$"):
        ForecasterHyperparameters.check({**SHARED, "position_threshold": -1.0})
    assert ForecasterHyperparameters.check(SHARED) == SHARED


def test_configure_optimizers_is_adamw_with_l2():
    model = make_echo()
    optimizer = model.configure_optimizers()
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.param_groups[0]["weight_decay"] == 0.25
    assert optimizer.param_groups[0]["lr"] == 1e-2


def test_validation_logs_loss_and_epoch_direction_accuracy():
    model = make_echo(horizon=2)
    # median forecast = last observed value. Batch 1: signs vs first targets: hit, miss, (zero target skipped)
    # Batch 2: hit, hit, hit, miss. Epoch accuracy over the 6 nonzero targets = 4/6 (a per-batch
    # mean would give (1/2 + 3/4) / 2 = 0.625 instead).
    batches = [
        window_batch([1.0, -1.0, 2.0], [[0.5, 0.0], [0.3, 0.0], [0.0, 1.0]]),
        window_batch([1.0, -2.0, 3.0, 0.5], [[2.0, 0.0], [-1.0, 0.0], [0.1, 0.0], [-0.1, 0.0]]),
    ]
    trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    [metrics] = trainer.validate(model, dataloaders=DataLoader(batches, batch_size=None), verbose=False)
    assert metrics["val/direction_accuracy"] == pytest.approx(4 / 6)
    # Lightning averages the epoch loss weighted by batch size (3 and 4 windows)
    expected_loss = sum(quantile_loss(model(b), b["target"], QUANTILES).item() * len(b["target"]) for b in batches) / 7
    assert metrics["val/loss"] == pytest.approx(expected_loss, rel=1e-5)


def test_trading_positions_threshold_and_alignment():
    horizon, seq_len, n_bars = 3, 2, 9
    model = make_echo(horizon=horizon, threshold=0.9)
    # median forecast per step = last observed; summed over the horizon = 3 * value.
    values = torch.tensor([0.5, -0.2, -0.4, 0.0, 0.29])  # sums 1.5, -0.6, -1.2, 0, 0.87
    observed = torch.zeros(len(values), seq_len, 1)
    observed[:, -1, 0] = values
    windows = {
        "static": torch.zeros(len(values), 1),
        "known": torch.zeros(len(values), seq_len + horizon, 1),
        "observed": observed,
        "target": torch.zeros(len(values), horizon),
        "bar_index": torch.arange(seq_len - 1, seq_len - 1 + len(values)),
    }
    datamodule = SimpleNamespace(
        input_windows=lambda split: windows if split == "test" else None,
        dataset=SimpleNamespace(splits={"test": SimpleNamespace(close=np.ones(n_bars))}),
        batch_size=2,  # several batches, last one partial
    )
    model.train()
    positions = model.trading_positions(datamodule, "test")
    assert model.training  # mode restored
    np.testing.assert_array_equal(positions, [0, 1, 0, -1, 0, 0, 0, 0, 0])
    assert positions.dtype == np.int8


def test_trading_positions_rejects_out_of_range_bar_index():
    model = make_echo(horizon=1)
    windows = {
        "static": torch.zeros(1, 1),
        "known": torch.zeros(1, 3, 1),
        "observed": torch.zeros(1, 2, 1),
        "target": torch.zeros(1, 1),
        "bar_index": torch.tensor([5]),
    }
    datamodule = SimpleNamespace(
        input_windows=lambda split: windows,
        dataset=SimpleNamespace(splits={"val": SimpleNamespace(close=np.ones(4))}),
        batch_size=4,
    )
    with pytest.raises(ValueError, match="bar_index"):
        model.trading_positions(datamodule, "val")
