"""Positions of naive strategies, scored by the same backtest on the same bars as the models.

A model's Sharpe ratio means little alone: on a rising market holding one contract long
earns one too, and a one-hour bootstrap interval is wide. These four baselines give the
figures a model has to beat, each for a different reason:

    flat          positions[t] = 0: no trades, PnL 0; the floor (costs can only lose).
    buy_and_hold  positions[t] = 1: the market's own drift, paid one entry cost; a model
                  that is long most of the time must beat it, not merely be positive.
    random        positions[t] uniform in {-1, 0, 1} from a seeded numpy Generator: no
                  skill, full turnover; what the costs alone do to a strategy that trades.
    momentum      positions[t] = sign(close[t] - close[t-1]) (0 at t = 0 and when the bar
                  did not move; on a roll bar the move in the new contract, from its roll
                  price, never the jump between contracts): the simplest use of the price,
                  one bar of trend-following; a model whose features see the last bars must
                  beat it.

As in :func:`foxhunt.evaluation.backtest.backtest`, ``positions[t]`` is taken at the close
of bar ``t`` and may use only ``close[:t + 1]``: no baseline looks ahead.
"""

from __future__ import annotations

import numbers

import numpy as np

from foxhunt.trading.pnl import held_moves

BASELINES = ("flat", "buy_and_hold", "random", "momentum")


def baseline_positions(name: str, close, *, seed: int, roll_price=None) -> np.ndarray:
    """The positions of baseline ``name`` on ``close``.

    Args:
        name: one of :data:`BASELINES`.
        close: (T,) finite close prices, T >= 1.
        seed: seed of the numpy Generator of the ``random`` baseline (an integer >= 0;
            the others ignore it).
        roll_price: (T,) roll prices (NaN except on roll bars, :mod:`foxhunt.data.roll`) or None.

    Returns:
        (T,) int8 positions in {-1, 0, 1}; ``positions[t]`` depends on ``close[:t + 1]`` only.

    Raises:
        ValueError: naming the argument, for an unknown ``name`` (the message lists the
            allowed ones), a ``close`` that is not 1-D finite numbers, or a bad ``seed``.
    """
    if name not in BASELINES:
        raise ValueError(f"baseline_positions name={name!r}: must be one of {', '.join(BASELINES)}")
    prices = _check_close(close)
    if not (isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and seed >= 0):
        raise ValueError(f"baseline_positions seed={seed!r}: must be an integer >= 0")

    num_bars = len(prices)
    if name == "flat":
        return np.zeros(num_bars, dtype=np.int8)
    if name == "buy_and_hold":
        return np.ones(num_bars, dtype=np.int8)
    if name == "random":
        rng = np.random.default_rng(seed)
        return rng.integers(-1, 2, size=num_bars).astype(np.int8)
    # momentum: the sign of the bar's own move, known at its close
    positions = np.zeros(num_bars, dtype=np.int8)
    positions[1:] = np.sign(held_moves(prices, roll_price)).astype(np.int8)
    return positions


def _check_close(close) -> np.ndarray:
    try:
        prices = np.asarray(close, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("baseline_positions close: must be numbers") from None
    if prices.ndim != 1:
        raise ValueError(f"baseline_positions close: expected a 1-D array, got shape {prices.shape}")
    if len(prices) < 1:
        raise ValueError("baseline_positions close: needs at least 1 bar, got 0")
    bad = ~np.isfinite(prices)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"baseline_positions close[{row}]={prices[row]}: must be a finite price")
    return prices
