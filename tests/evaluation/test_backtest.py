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
from foxhunt.evaluation.backtest import (
    annualization,
    annualization_note,
    calendar_bars_per_year,
    pooled,
)

CONF_ASSET = Path(__file__).resolve().parents[2] / "conf" / "asset"


def load_asset(key: str) -> AssetSpec:
    raw = OmegaConf.to_container(OmegaConf.load(CONF_ASSET / f"{key}.yaml"))
    return AssetSpec(**{k: v for k, v in raw.items() if k != "_target_"})


ES = load_asset("es")  # tick 0.25, multiplier 50, tick value 12.5
# Costs: 2 USD commission + 1 tick (12.5 USD) slippage = 14.5 USD per contract traded.
COMMISSION, SLIPPAGE = 2.0, 1.0
CLOSE = np.array([100.00, 100.50, 100.25, 101.00, 100.75])
POSITIONS = np.array([1, 1, -1, 0, 1])  # the last one is never traded
TWO_DAYS = pd.date_range("2024-03-04", periods=5, freq="12h", tz="UTC")
BARS_PER_YEAR = 730.5


def run(
    positions=POSITIONS, close=CLOSE, timestamps=TWO_DAYS, commission=COMMISSION, slippage=SLIPPAGE, bars_per_year=BARS_PER_YEAR
) -> BacktestResult:
    return backtest(positions, close, timestamps, ES, commission, slippage, bars_per_year=bars_per_year)


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
    assert m["exposure"] == pytest.approx(3 / 4)  # long, long, short, flat
    mean = -83.0 / 4
    downside = math.sqrt((0.0 + 12.5**2 + 66.5**2 + 14.5**2) / 4)  # losses only (step 0 won), over every step
    assert m["sortino"] == pytest.approx(mean / downside * math.sqrt(BARS_PER_YEAR))
    assert m["calmar"] == pytest.approx(mean * BARS_PER_YEAR / (10.5 + 83.0))
    assert m["mean_pnl"] == pytest.approx(-83.0 / 4)
    assert m["steps"] == 4
    assert set(m) == {"pnl", "mean_pnl", "sharpe", "sortino", "calmar", "max_drawdown", "exposure", "hit_rate",
                      "turnover", "trades", "steps"}  # fmt: skip


def test_sharpe_is_annualized_by_bars_per_year():
    result = run()
    mean = -83.0 / 4  # -20.75
    # deviations 31.25, 8.25, -45.75, 6.25 -> squares sum 3176.75; sample std: / (4 - 1)
    std = math.sqrt(3176.75 / 3)
    assert result.metrics["sharpe"] == pytest.approx(mean / std * math.sqrt(BARS_PER_YEAR))
    assert run(bars_per_year=4 * BARS_PER_YEAR).metrics["sharpe"] == pytest.approx(2 * result.metrics["sharpe"])


def test_annualization_does_not_depend_on_the_window_calendar_time():
    """A window over a weekend and one inside a week give the same factor (the old rule, steps
    per calendar year of the window, moved it from 715 to 461 on the same bars)."""
    weekday = run(timestamps=pd.date_range("2024-03-05 14:00", periods=5, freq="1min", tz="UTC"))
    over_weekend = run(timestamps=pd.DatetimeIndex(["2024-03-08 21:57", "2024-03-08 21:58", "2024-03-08 21:59",
                                                    "2024-03-10 23:00", "2024-03-10 23:01"], tz="UTC"))  # fmt: skip
    assert weekday.metrics == over_weekend.metrics


def test_an_explicit_session_count_overrides_the_calendar():
    # a number: that many regular Globex sessions (18:00-17:00 ET: 23 h of 1-minute bars), the old figure
    assert calendar_bars_per_year(ES, 252) == 1380 * 252
    note = annualization_note(ES, 252)
    assert "347,760 bars/year" in note and "1,380 bars/session" in note and "252 sessions/year" in note
    for bad in (0, -1.0, float("nan"), "weekly", True):
        with pytest.raises(ValueError, match=r"^evaluation.sessions_per_year=.*: must be 'calendar' or a number > 0$"):
            calendar_bars_per_year(ES, bad)


def test_calendar_annualization_is_hand_checked_on_2024():
    # CME_Equity 2024: 262 weekdays - 3 holidays (Jan 1, Good Friday Mar 29, Dec 25) = 259 sessions of
    # 1,380 minutes, 10 of them closing at 12:00 CT instead of 16:00 (240 minutes short each)
    minutes = 259 * 1380 - 10 * 240
    assert minutes == 355_020
    result = annualization(ES, "calendar", ["2024-01-01", "2024-12-31"])
    assert result.bars_per_year == pytest.approx(minutes / (366 / 365.25), rel=1e-12)
    assert "CME_Equity" in result.note and "2024-01-01..2024-12-31" in result.note and "259 sessions" in result.note
    assert "354,292 bars/year" in result.note  # vs 347,760 = 1,380 x 252 before the calendar
    # the same span, the same factor, whatever window is scored
    assert calendar_bars_per_year(ES, "calendar", ("2024-01-01", "2024-12-31")) == result.bars_per_year
    for bad in (["2024-12-31", "2024-01-01"], ["2024-13-01", "2024-12-31"], None, ["2024-01-01"]):
        with pytest.raises(ValueError, match=r"^evaluation.annualization_span=.*: must be \[start, end\]"):
            annualization(ES, "calendar", bad)


def test_hit_rate_counts_only_bars_whose_price_moved():
    # long over 4 steps: +2 ticks, no move, no move, -1 tick -> 1 hit, 1 miss; the flat bars are neither
    result = run(positions=[1, 1, 1, 1, 0], close=[100.0, 100.5, 100.5, 100.5, 100.25], commission=0.0, slippage=0.0)
    assert result.metrics["hit_rate"] == pytest.approx(1 / 2)


def test_pooled_joins_steps_as_separate_backtests():
    a = run(positions=[1, 1, -1, 0, 1])
    b = run(positions=[-1, 0, 0, 1, 1], close=CLOSE[::-1].copy())
    joined = pooled([a, b])
    np.testing.assert_allclose(joined.pnl, np.concatenate([a.pnl, b.pnl]))
    np.testing.assert_allclose(joined.equity, np.cumsum(np.concatenate([a.pnl, b.pnl])))
    assert joined.metrics["trades"] == a.metrics["trades"] + b.metrics["trades"]  # b starts flat again
    assert joined.metrics["pnl"] == pytest.approx(a.metrics["pnl"] + b.metrics["pnl"])
    assert joined.metrics["steps"] == 8
    with pytest.raises(ValueError, match="annualized differently"):
        pooled([a, run(bars_per_year=1.0)])


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
        "pnl": 0.0,
        "mean_pnl": 0.0,
        "sharpe": 0.0,
        "sortino": 0.0,
        "calmar": 0.0,
        "max_drawdown": 0.0,
        "exposure": 0.0,
        "hit_rate": 0.0,
        "turnover": 0.0,
        "trades": 0,
        "steps": 4,
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
        ({"bars_per_year": 0.0}, r"bars_per_year=0.0"),
    ],
)
def test_bad_inputs_raise_naming_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run(**kwargs)


def test_accepts_numpy_datetime64_timestamps():
    naive = TWO_DAYS.tz_localize(None).to_numpy()
    assert run(timestamps=naive).metrics == run().metrics
