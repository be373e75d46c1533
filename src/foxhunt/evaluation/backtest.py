"""The backtest every model's positions go through, so that the grid reports comparable metrics.

Positions are one contract short, flat or long (-1, 0, 1) per bar; ``positions[t]`` is taken at
the close of bar ``t`` and held to the close of bar ``t + 1`` (the last position has no next
bar and is ignored). Step ``t`` (``t = 0 .. T - 2``) earns, in USD::

    cost_per_contract = commission_usd + slippage_ticks * tick_value
    pnl[t] = positions[t] * (close[t+1] - close[t]) * multiplier
             - cost_per_contract * |positions[t] - positions[t-1]|,   positions[-1] = 0

which is the trading environment's reward (:mod:`foxhunt.data.env`) times ``tick_value``: an
agent's summed reward in ticks equals this PnL divided by the tick value.

The metrics are written here with numpy instead of taken from a library (empyrical,
quantstats) because those assume daily returns on a capital base, while foxhunt trades one
contract on irregular intraday bars: PnL is in USD, and the annualization factor comes from
the bars' own timestamps.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from foxhunt.assets import AssetSpec

SECONDS_PER_YEAR = 365.25 * 24 * 3600
ALLOWED_POSITIONS = (-1, 0, 1)


@dataclass(frozen=True)
class BacktestResult:
    """What :func:`backtest` computes; arrays are numpy.

    Attributes:
        pnl: (T - 1,) float64 USD net of costs for step t (bar t -> t + 1).
        equity: (T - 1,) float64 cumulative ``pnl``: the equity at the close of bar t + 1,
            starting from 0 before the first step.
        positions: (T,) int8 the positions given (the last one is not traded).
        gross_pnl: (T - 1,) float64 USD before costs.
        costs: (T - 1,) float64 USD of commission and slippage paid at step t (>= 0).
        metrics: ``pnl`` (total USD), ``sharpe`` (annualized), ``max_drawdown`` (USD, >= 0),
            ``hit_rate``, ``turnover``, ``trades`` (see :func:`backtest`).
    """

    pnl: np.ndarray
    equity: np.ndarray
    positions: np.ndarray
    gross_pnl: np.ndarray
    costs: np.ndarray
    metrics: dict[str, float] = field(default_factory=dict)


def backtest(
    positions,
    close,
    timestamps,
    asset: AssetSpec,
    commission_usd: float,
    slippage_ticks: float,
) -> BacktestResult:
    """Trade ``positions`` (T,) on ``close`` (T,) and measure the result.

    Args:
        positions: (T,) values in {-1, 0, 1}; ``positions[t]`` is held from bar t to t + 1.
        close: (T,) finite close prices.
        timestamps: (T,) strictly increasing bar times (datetime64, DatetimeIndex, ...).
        asset: the contract (multiplier and tick value).
        commission_usd: commission per contract traded, USD (>= 0).
        slippage_ticks: slippage per contract traded, ticks (>= 0).

    Metrics (over the T - 1 steps):
        pnl: total net PnL, USD.
        sharpe: mean / sample standard deviation (ddof=1) of the per-step PnL, times
            sqrt(steps per year); steps per year = (T - 1) / (timestamps[-1] - timestamps[0]
            in years of 365.25 days), so the figure follows the bar frequency and the
            session gaps of the data. 0 when the deviation is 0 or there are fewer than 2 steps.
        max_drawdown: largest fall of the equity from a previous peak, USD (>= 0); the
            equity starts at 0.
        hit_rate: fraction of steps with a nonzero position whose gross PnL is > 0 (0 if none).
        turnover: sum over steps of |positions[t] - positions[t-1]| (from flat) / (T - 1).
        trades: number of steps where the position changes (a flip counts once).

    Raises:
        ValueError: naming the argument, for positions outside {-1, 0, 1}, mismatched lengths,
            non-finite prices, timestamps that do not increase, or negative costs.
    """
    pos = _check_positions(positions)
    prices = _check_close(close, len(pos))
    times_ns = _check_timestamps(timestamps, len(pos))
    for name, value in (("commission_usd", commission_usd), ("slippage_ticks", slippage_ticks)):
        if not (isinstance(value, numbers.Real) and math.isfinite(value) and value >= 0):
            raise ValueError(f"backtest {name}={value!r}: must be a finite number >= 0")

    cost_per_contract = float(commission_usd) + float(slippage_ticks) * asset.tick_value
    held = pos[:-1].astype(np.float64)
    previous = np.concatenate(([0], pos[:-2])).astype(np.float64)
    traded = np.abs(held - previous)
    move_usd = (prices[1:] - prices[:-1]) * asset.multiplier
    gross = held * move_usd
    costs = cost_per_contract * traded
    pnl = gross - costs
    equity = np.cumsum(pnl)

    num_steps = len(pnl)
    elapsed_years = (times_ns[-1] - times_ns[0]) / 1e9 / SECONDS_PER_YEAR
    metrics = {
        "pnl": float(pnl.sum()),
        "sharpe": _sharpe(pnl, num_steps / elapsed_years),
        "max_drawdown": _max_drawdown(equity),
        "hit_rate": _hit_rate(held, gross),
        "turnover": float(traded.sum() / num_steps),
        "trades": int(np.count_nonzero(traded)),
    }
    return BacktestResult(
        pnl=pnl,
        equity=equity,
        positions=pos,
        gross_pnl=gross,
        costs=costs,
        metrics=metrics,
    )


def _sharpe(pnl: np.ndarray, steps_per_year: float) -> float:
    if len(pnl) < 2:
        return 0.0
    std = float(np.std(pnl, ddof=1))
    if std == 0.0:
        return 0.0
    return float(np.mean(pnl) / std * math.sqrt(steps_per_year))


def _max_drawdown(equity: np.ndarray) -> float:
    curve = np.concatenate(([0.0], equity))
    return float(np.max(np.maximum.accumulate(curve) - curve))


def _hit_rate(held: np.ndarray, gross: np.ndarray) -> float:
    in_market = held != 0
    count = int(np.count_nonzero(in_market))
    if count == 0:
        return 0.0
    return float(np.count_nonzero(gross[in_market] > 0) / count)


def _check_positions(positions) -> np.ndarray:
    try:
        values = np.asarray(positions, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("backtest positions: must be numbers in {-1, 0, 1}") from None
    if values.ndim != 1:
        raise ValueError(f"backtest positions: expected a 1-D array, got shape {values.shape}")
    if len(values) < 2:
        raise ValueError(f"backtest positions: needs at least 2 bars, got {len(values)}")
    bad = ~np.isin(values, ALLOWED_POSITIONS)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"backtest positions[{row}]={values[row]:g}: must be -1, 0 or 1")
    return values.astype(np.int8)


def _check_close(close, num_bars: int) -> np.ndarray:
    try:
        prices = np.asarray(close, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("backtest close: must be numbers") from None
    if prices.ndim != 1 or len(prices) != num_bars:
        raise ValueError(
            f"backtest close: shape {prices.shape} does not match positions ({num_bars},)"
        )
    bad = ~np.isfinite(prices)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"backtest close[{row}]={prices[row]}: must be a finite price")
    return prices


def _check_timestamps(timestamps, num_bars: int) -> np.ndarray:
    try:
        index = pd.DatetimeIndex(timestamps)
    except (TypeError, ValueError) as err:
        raise ValueError(f"backtest timestamps: cannot be read as times ({err})") from None
    if len(index) != num_bars:
        raise ValueError(
            f"backtest timestamps: length {len(index)} does not match positions ({num_bars},)"
        )
    if index.hasnans:
        row = int(np.flatnonzero(index.isna())[0])
        raise ValueError(f"backtest timestamps[{row}]: is missing (NaT)")
    times_ns = index.as_unit("ns").asi8
    not_increasing = np.diff(times_ns) <= 0
    if not_increasing.any():
        row = int(np.flatnonzero(not_increasing)[0]) + 1
        raise ValueError(
            f"backtest timestamps[{row}]={index[row]}: must be after timestamps[{row - 1}]"
            f"={index[row - 1]} (strictly increasing)"
        )
    return times_ns
