"""Baseline positions: hand-computed backtests, no look-ahead, a seeded random baseline."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from tests.evaluation.test_backtest import (
    ES,  # tick 0.25, multiplier 50, tick value 12.5
)

from foxhunt.evaluation.backtest import BacktestResult, backtest
from foxhunt.evaluation.baselines import BASELINES, baseline_positions

# Costs: 2 USD commission + 1 tick (12.5 USD) slippage = 14.5 USD per contract traded.
COMMISSION, SLIPPAGE = 2.0, 1.0
# Moves in ticks: +2, 0, -1, +3, -1 -> USD per contract: +25, 0, -12.5, +37.5, -12.5
CLOSE = np.array([100.00, 100.50, 100.50, 100.25, 101.00, 100.75])
TIMES = pd.date_range("2024-03-04 14:30", periods=6, freq="1min", tz="UTC")
BARS_PER_YEAR = 252.0


def run(name: str, seed: int = 0) -> BacktestResult:
    positions = baseline_positions(name, CLOSE, seed=seed)
    return backtest(positions, CLOSE, TIMES, ES, COMMISSION, SLIPPAGE, bars_per_year=BARS_PER_YEAR)


def test_baselines_are_the_four_named():
    assert BASELINES == ("flat", "buy_and_hold", "random", "momentum")


def test_flat_by_hand():
    result = run("flat")
    np.testing.assert_array_equal(result.positions, [0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(result.pnl, [0.0] * 5)
    assert result.metrics["pnl"] == 0.0
    assert result.metrics["sharpe"] == 0.0
    assert result.metrics["trades"] == 0


def test_buy_and_hold_by_hand():
    result = run("buy_and_hold")
    np.testing.assert_array_equal(result.positions, [1, 1, 1, 1, 1, 1])
    # one entry cost at step 0, then the market's moves
    np.testing.assert_allclose(result.costs, [14.5, 0.0, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(result.pnl, [10.5, 0.0, -12.5, 37.5, -12.5])
    np.testing.assert_allclose(result.equity, [10.5, 10.5, -2.0, 35.5, 23.0])
    assert result.metrics["pnl"] == pytest.approx(23.0)
    assert result.metrics["max_drawdown"] == pytest.approx(12.5)  # 10.5 -> -2.0
    assert result.metrics["trades"] == 1
    # mean 4.6; deviations 5.9, -4.6, -17.1, 32.9, -17.1 -> squares sum 1723.2; / (5 - 1)
    std = math.sqrt(1723.2 / 4)
    assert result.metrics["sharpe"] == pytest.approx(4.6 / std * math.sqrt(BARS_PER_YEAR))


def test_momentum_by_hand():
    result = run("momentum")
    # sign of each bar's own move: 0 at t=0, +0.5, 0.0, -0.25, +0.75, -0.25
    np.testing.assert_array_equal(result.positions, [0, 1, 0, -1, 1, -1])
    # step 0: flat                                     ->   0.0
    # step 1: enter long over a still bar: cost 14.5   -> -14.5
    # step 2: flatten: cost 14.5                       -> -14.5
    # step 3: go short, price +3 ticks: -37.5 - 14.5   -> -52.0
    # step 4: flip long, price -1 tick: -12.5 - 2x14.5 -> -41.5
    np.testing.assert_allclose(result.gross_pnl, [0.0, 0.0, 0.0, -37.5, -12.5])
    np.testing.assert_allclose(result.costs, [0.0, 14.5, 14.5, 14.5, 29.0])
    np.testing.assert_allclose(result.pnl, [0.0, -14.5, -14.5, -52.0, -41.5])
    assert result.metrics["pnl"] == pytest.approx(-122.5)
    assert result.metrics["trades"] == 4
    assert result.metrics["turnover"] == pytest.approx((0 + 1 + 1 + 1 + 2) / 5)


def test_random_by_hand():
    result = run("random", seed=2)
    # numpy's default_rng(2).integers(-1, 2, 6), pinned: a change of numpy's stream shows here
    np.testing.assert_array_equal(result.positions, [1, -1, -1, -1, 0, 1])
    # step 0: long from flat, +2 ticks: 25 - 14.5      ->  10.5
    # step 1: flip short over a still bar: 2x14.5      -> -29.0
    # step 2: stay short, -1 tick: +12.5               ->  12.5
    # step 3: stay short, +3 ticks: -37.5              -> -37.5
    # step 4: flatten: 14.5                            -> -14.5
    np.testing.assert_allclose(result.pnl, [10.5, -29.0, 12.5, -37.5, -14.5])
    assert result.metrics["pnl"] == pytest.approx(-58.0)
    assert result.metrics["trades"] == 3


@pytest.mark.parametrize("name", BASELINES)
def test_positions_are_int8_on_the_grid(name):
    close = 100.0 + np.cumsum(np.random.default_rng(0).normal(size=300))
    positions = baseline_positions(name, close, seed=1)
    assert positions.dtype == np.int8
    assert positions.shape == close.shape
    assert set(np.unique(positions)) <= {-1, 0, 1}


def test_random_is_seeded_and_deterministic():
    close = np.full(1000, 100.0)
    first = baseline_positions("random", close, seed=5)
    np.testing.assert_array_equal(first, baseline_positions("random", close, seed=5))
    assert not np.array_equal(first, baseline_positions("random", close, seed=6))
    counts = np.bincount(first + 1, minlength=3)
    assert np.all(np.abs(counts / 1000 - 1 / 3) < 0.06)  # about a third each
    # the draws do not depend on the prices
    moved = 100.0 + np.cumsum(np.random.default_rng(0).normal(size=1000))
    np.testing.assert_array_equal(first, baseline_positions("random", moved, seed=5))


def test_single_bar_is_allowed():
    for name in BASELINES:
        assert baseline_positions(name, [100.0], seed=0).shape == (1,)
    assert baseline_positions("momentum", [100.0], seed=0)[0] == 0


prices = arrays(
    np.float64,
    st.integers(2, 40),
    elements=st.floats(1.0, 1e4, allow_nan=False, allow_infinity=False),
)


@settings(max_examples=100, deadline=None)
@given(close=prices, cut=st.integers(0, 39), data=st.data(), seed=st.integers(0, 2**32))
def test_no_look_ahead(close, cut, data, seed):
    """positions[:t + 1] does not change when close[t + 1:] does, nor when it is cut off
    (for ``random``: numpy's Generator draws the positions in order)."""
    t = min(cut, len(close) - 1)
    future = data.draw(arrays(np.float64, len(close) - t - 1, elements=st.floats(1.0, 1e4)), label="future")
    changed = np.concatenate([close[: t + 1], future])
    for name in BASELINES:
        original = baseline_positions(name, close, seed=seed)
        np.testing.assert_array_equal(baseline_positions(name, changed, seed=seed)[: t + 1], original[: t + 1])
        np.testing.assert_array_equal(baseline_positions(name, close[: t + 1], seed=seed), original[: t + 1])


@pytest.mark.parametrize(
    ("name", "close", "seed", "message"),
    [
        ("best", CLOSE, 0, r"name='best': must be one of flat, buy_and_hold, random, momentum"),
        ("Flat", CLOSE, 0, r"name='Flat'"),
        ("flat", [], 0, r"close: needs at least 1 bar"),
        ("flat", [[100.0, 101.0]], 0, r"close: expected a 1-D array"),
        ("momentum", [100.0, np.nan, 101.0], 0, r"close\[1\]=nan"),
        ("momentum", ["a", "b"], 0, r"close: must be numbers"),
        ("random", CLOSE, -1, r"seed=-1"),
        ("random", CLOSE, 1.5, r"seed=1.5"),
        ("random", CLOSE, None, r"seed=None"),
    ],
)
def test_bad_arguments_raise_naming_them(name, close, seed, message):
    with pytest.raises(ValueError, match=message):
        baseline_positions(name, close, seed=seed)
