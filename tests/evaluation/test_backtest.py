"""Backtest metrics on hand-computed cases, and clear errors on bad inputs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from foxhunt.assets import AssetSpec
from foxhunt.evaluation import BacktestResult, backtest

CONF_ASSET = Path(__file__).resolve().parents[2] / "conf" / "asset"


def load_asset(key: str) -> AssetSpec:
    raw = OmegaConf.to_container(OmegaConf.load(CONF_ASSET / f"{key}.yaml"))
    return AssetSpec(**{k: v for k, v in raw.items() if k != "_target_"})


ES = load_asset("es")  # tick 0.25, multiplier 50, tick value 12.5
# Costs: 2 USD commission + 1 tick (12.5 USD) slippage = 14.5 USD per contract traded.
COMMISSION, SLIPPAGE = 2.0, 1.0
CLOSE = np.array([100.00, 100.50, 100.25, 101.00, 100.75])
POSITIONS = np.array([1, 1, -1, 0, 1])  # the last one is never traded
# 5 bars, 12 hours apart: 4 steps over 2 days -> 4 / (2 / 365.25) = 730.5 steps per year.
TWO_DAYS = pd.date_range("2024-03-04", periods=5, freq="12h", tz="UTC")


def run(positions=POSITIONS, close=CLOSE, timestamps=TWO_DAYS, commission=COMMISSION,
        slippage=SLIPPAGE) -> BacktestResult:
    return backtest(positions, close, timestamps, ES, commission, slippage)


def test_pnl_costs_and_equity_by_hand():
    result = run()
    # step 0: long from flat: +2 ticks = 25.0, cost 14.5          -> 10.5
    # step 1: stay long: -1 tick = -12.5, no cost                  -> -12.5
    # step 2: flip to short: price +3 ticks -> -37.5, cost 2x14.5  -> -66.5
    # step 3: flatten: no exposure, cost 14.5                      -> -14.5
    np.testing.assert_allclose(result.gross_pnl, [25.0, -12.5, -37.5, 0.0])
    np.testing.assert_allclose(result.costs, [14.5, 0.0, 29.0, 14.5])
    np.testing.assert_allclose(result.pnl, [10.5, -12.5, -66.5, -14.5])
    np.testing.assert_allclose(result.equity, [10.5, -2.0, -68.5, -83.0])
    np.testing.assert_array_equal(result.positions, POSITIONS)
    m = result.metrics
    assert m["pnl"] == pytest.approx(-83.0)
    assert m["max_drawdown"] == pytest.approx(10.5 + 83.0)  # peak 10.5 -> trough -83
    assert m["hit_rate"] == pytest.approx(1 / 3)  # in the market 3 steps, 1 gross winner
    assert m["turnover"] == pytest.approx((1 + 0 + 2 + 1) / 4)
    assert m["trades"] == 3
    assert set(m) == {"pnl", "sharpe", "max_drawdown", "hit_rate", "turnover", "trades"}


def test_sharpe_uses_bars_per_year_from_timestamps():
    result = run()
    mean = -83.0 / 4  # -20.75
    # deviations 31.25, 8.25, -45.75, 6.25 -> squares sum 3176.75; sample std: / (4 - 1)
    std = math.sqrt(3176.75 / 3)
    steps_per_year = 4 / (2 / 365.25)  # 730.5
    assert result.metrics["sharpe"] == pytest.approx(mean / std * math.sqrt(steps_per_year))


def test_sharpe_scales_with_bar_frequency():
    per_minute = run(timestamps=pd.date_range("2024-03-04", periods=5, freq="1min"))
    per_day = run(timestamps=pd.date_range("2024-03-04", periods=5, freq="1D"))
    ratio = per_minute.metrics["sharpe"] / per_day.metrics["sharpe"]
    assert ratio == pytest.approx(math.sqrt(24 * 60))
    assert per_minute.metrics["pnl"] == per_day.metrics["pnl"]


def test_sharpe_is_zero_when_pnl_is_constant():
    rising = 100.0 + 0.25 * np.arange(5)
    result = run(positions=[1, 1, 1, 1, 1], close=rising, commission=0.0, slippage=0.0)
    np.testing.assert_allclose(result.pnl, [12.5] * 4)
    assert result.metrics["sharpe"] == 0.0
    assert result.metrics["max_drawdown"] == 0.0
    assert result.metrics["hit_rate"] == 1.0
    assert result.metrics["trades"] == 1  # entering from flat counts
    assert result.metrics["turnover"] == pytest.approx(1 / 4)


def test_always_flat_has_zero_everything():
    result = run(positions=np.zeros(5))
    assert result.metrics == {
        "pnl": 0.0, "sharpe": 0.0, "max_drawdown": 0.0, "hit_rate": 0.0, "turnover": 0.0,
        "trades": 0,
    }


def test_last_position_is_ignored():
    a = run(positions=[0, 1, 1, 0, 0])
    b = run(positions=[0, 1, 1, 0, -1])
    np.testing.assert_array_equal(a.pnl, b.pnl)
    assert a.metrics == b.metrics


def test_float_positions_on_the_grid_are_accepted():
    result = run(positions=POSITIONS.astype(float))
    assert result.metrics["pnl"] == pytest.approx(-83.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"positions": [1, 2, 0, 0, 0]}, r"positions\[1\]=2"),
        ({"positions": [1, 0, np.nan, 0, 0]}, r"positions\[2\]"),
        ({"positions": [1, 0, 0, 0]}, r"close: shape \(5,\) does not match positions \(4,\)"),
        ({"close": CLOSE[:4]}, r"close: shape \(4,\)"),
        ({"close": [100.0, np.nan, 100.0, 100.0, 100.0]}, r"close\[1\]=nan"),
        ({"timestamps": TWO_DAYS[:4]}, r"timestamps: length 4"),
        ({"timestamps": TWO_DAYS[[0, 1, 1, 2, 3]]}, r"timestamps\[2\]"),
        ({"commission": -1.0}, r"commission_usd=-1.0"),
        ({"slippage": float("nan")}, r"slippage_ticks=nan"),
        ({"positions": [1], "close": [1.0], "timestamps": TWO_DAYS[:1]}, r"at least 2 bars"),
    ],
)
def test_bad_inputs_raise_naming_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run(**kwargs)


def test_accepts_numpy_datetime64_timestamps():
    naive = TWO_DAYS.tz_localize(None).to_numpy()
    assert run(timestamps=naive).metrics == run().metrics
