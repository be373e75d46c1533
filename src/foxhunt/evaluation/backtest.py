"""The backtest every model's positions go through, so that the grid reports comparable metrics.

Positions are one contract short, flat or long (-1, 0, 1) per bar; ``positions[t]`` is taken at
the close of bar ``t`` and held to the close of bar ``t + 1`` (the last position has no next
bar and is ignored). Step ``t`` (``t = 0 .. T - 2``) earns :func:`foxhunt.trading.pnl.walk_pnl`'s
USD: the gross PnL of the contract held (its raw prices, a roll bar's move from its roll price),
less the commission and slippage of the contracts traded (a roll two contracts), the formula
written once in :mod:`foxhunt.trading.pnl`. The trading environment's reward
(:mod:`foxhunt.trading.env`) is the same step's PnL in ticks: an agent's summed reward equals
this PnL divided by the tick value.

**Annualization** follows the asset's exchange calendar, never the calendar time of the
window: ``bars_per_year = sessions per year x bars per session`` (:func:`annualization`), both
measured on the asset's calendar (:mod:`foxhunt.data.calendar`, holidays, early closes and
breaks counted) over a fixed reference span of trading dates (``evaluation.annualization_span``),
so a window with a weekend and one without, or one split and another, get the same factor (the
calendar time of a window moved it from 715 to 461 on the same bars). A number given as
``evaluation.sessions_per_year`` overrides the calendar (that many regular Globex sessions).
The Sharpe ratio of ``pnl`` is ``mean / std(ddof=1) * sqrt(bars_per_year)``; the run prints
:attr:`Annualization.line` with it (the bars per year, the calendar and the span) and logs the
whole account, :attr:`Annualization.note`, to its log file (:meth:`Annualization.announced`).

**Pooling.** :func:`pooled` joins the steps of several backtests (the test blocks of a
walk-forward's folds, each starting flat) into one, the out-of-sample backtest the walk-forward
figures are measured on.

The metrics are written here with numpy instead of taken from a library (empyrical,
quantstats) because those assume daily returns on a capital base, while foxhunt trades one
contract on intraday bars: PnL is in USD per contract, annualized by the session calendar.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from foxhunt.assets import AssetSpec
from foxhunt.console import detail_logger
from foxhunt.data.calendar import calendar_for
from foxhunt.data.features import BAR_INTERVAL
from foxhunt.evaluation.stats import calmar_ratio, sharpe_ratio, sortino_ratio
from foxhunt.trading.pnl import check_costs, contract_costs, walk_pnl

ALLOWED_POSITIONS = (-1, 0, 1)
CALENDAR = "calendar"  # evaluation.sessions_per_year: annualize by the asset's exchange calendar
detail = detail_logger(__name__)  # how the Sharpe was annualized, in full: the run's log file (foxhunt.console)


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
        bars_per_year: the annualization the Sharpe ratio used.
        metrics: ``pnl`` (total USD), ``mean_pnl`` (USD per step), ``sharpe``, ``sortino`` and
            ``calmar`` (annualized), ``max_drawdown`` (USD, >= 0), ``exposure``, ``hit_rate``,
            ``turnover``, ``trades``, ``steps``
            (see :func:`backtest`).
    """

    pnl: np.ndarray
    equity: np.ndarray
    positions: np.ndarray
    gross_pnl: np.ndarray
    costs: np.ndarray
    bars_per_year: float
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Annualization:
    """The bars per year a run's Sharpe ratios are annualized by, and how they were found."""

    bars_per_year: float
    note: str  # the whole account in one line (the calendar, its figures, the span): the run's log file
    line: str  # the short line printed with the run's figures

    def announced(self) -> str:
        """:attr:`line`, after logging :attr:`note` to the run's log file (``foxhunt.console.DETAIL``)."""
        detail.info("%s", self.note)
        return self.line


def annualization(asset: AssetSpec, sessions_per_year: Any = CALENDAR, span: Any = None) -> Annualization:
    """Bars per year for ``asset`` (see the module doc).

    ``sessions_per_year="calendar"``: from the asset's exchange calendar
    (:func:`foxhunt.data.calendar.calendar_for`) over the trading dates ``span`` = [start, end]
    (``evaluation.annualization_span``): its open minutes over the span (holidays, early closes
    and breaks counted) per year of the span, over the bar interval, i.e. sessions per year x
    open minutes per session. A number > 0 overrides it: that many sessions a year of the
    asset's regular Globex session (``asset.session_minutes``), the figure before calendars.
    """
    per_bar = BAR_INTERVAL / pd.Timedelta(minutes=1)
    if isinstance(sessions_per_year, str) and sessions_per_year == CALENDAR:
        first, last = _span(span)
        cal = calendar_for(asset)
        figures = cal.annual(first, last)
        bars = figures.open_minutes_per_year / per_bar
        note = (
            f"Sharpe annualized by the exchange calendar: sqrt({bars:,.0f} bars/year = "
            f"{figures.sessions_per_year:.2f} sessions/year x {figures.minutes_per_session / per_bar:,.1f} bars/session; "
            f"{asset.key} calendar {cal.name} ({cal.library}), trading dates {first}..{last}: "
            f"{figures.sessions:,} sessions, {figures.open_minutes:,} open minutes in {figures.years:.2f} years, "
            f"holidays and early closes counted)"
        )
        line = f"Sharpe annualized by the exchange calendar: {bars:,.0f} bars/year ({cal.name}, {first}..{last})"
        return Annualization(float(bars), note, line)
    if not (isinstance(sessions_per_year, numbers.Real) and not isinstance(sessions_per_year, bool)
            and math.isfinite(sessions_per_year) and float(sessions_per_year) > 0):  # fmt: skip
        raise ValueError(f"evaluation.sessions_per_year={sessions_per_year!r}: must be 'calendar' or a number > 0")
    per_session = asset.session_minutes / per_bar
    bars = float(per_session * sessions_per_year)
    note = (
        f"Sharpe annualized by a given session count: sqrt({bars:,.0f} bars/year = {per_session:,.0f} bars/session "
        f"({asset.key} Globex {asset.session_open}-{asset.session_close} {asset.session_tz}, no holiday or early close) "
        f"x {sessions_per_year:g} sessions/year, evaluation.sessions_per_year)"
    )
    line = f"Sharpe annualized by a given session count: {bars:,.0f} bars/year ({sessions_per_year:g} sessions/year)"
    return Annualization(bars, note, line)


def evaluation_annualization(asset: AssetSpec, evaluation: Any) -> Annualization:
    """:func:`annualization` from a config's ``evaluation`` node (``sessions_per_year``,
    ``annualization_span``)."""
    value = evaluation.sessions_per_year
    span = evaluation.get("annualization_span") if hasattr(evaluation, "get") else getattr(evaluation, "annualization_span", None)
    return annualization(asset, value if isinstance(value, str) else _number(value), span)


def calendar_bars_per_year(asset: AssetSpec, sessions_per_year: Any = CALENDAR, span: Any = None) -> float:
    """Bars in a year of the asset's sessions (:func:`annualization`)."""
    return annualization(asset, sessions_per_year, span).bars_per_year


def annualization_note(asset: AssetSpec, sessions_per_year: Any = CALENDAR, span: Any = None) -> str:
    """How the Sharpe ratios of a report are annualized, in one line (:func:`annualization`)."""
    return annualization(asset, sessions_per_year, span).note


def _number(value: Any) -> Any:
    try:
        return float(value) if not isinstance(value, bool) else value
    except (TypeError, ValueError):
        return value


def _span(span: Any) -> tuple[date, date]:
    rule = "must be [start, end], trading dates 'YYYY-MM-DD' with start <= end"
    try:
        first, last = (date.fromisoformat(str(d)) for d in span)
    except (TypeError, ValueError):
        raise ValueError(f"evaluation.annualization_span={_plain(span)!r}: {rule}") from None
    if last < first:
        raise ValueError(f"evaluation.annualization_span={_plain(span)!r}: {rule}")
    return first, last


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def backtest(
    positions,
    close,
    timestamps,
    asset: AssetSpec,
    commission_usd: float,
    slippage_ticks: float,
    *,
    bars_per_year: float,
    roll_price=None,
) -> BacktestResult:
    """Trade ``positions`` (T,) on ``close`` (T,) and measure the result (``timestamps`` are
    checked to increase; the annualization comes from ``bars_per_year``, not from them).

    Args:
        positions: (T,) values in {-1, 0, 1}; ``positions[t]`` is held from bar t to t + 1.
        close: (T,) finite close prices.
        timestamps: (T,) strictly increasing bar times (datetime64, DatetimeIndex, ...).
        asset: the contract (multiplier and tick value).
        commission_usd: commission per contract traded, USD (>= 0).
        slippage_ticks: slippage per contract traded, ticks (>= 0).
        bars_per_year: the annualization (:func:`calendar_bars_per_year`).
        roll_price: (T,) the new contract's entry price on each roll bar, NaN elsewhere
            (:attr:`foxhunt.data.dataset.SplitArrays.roll_price`); None: no roll.

    Metrics (over the T - 1 steps):
        pnl: total net PnL, USD.
        mean_pnl: net PnL per step, USD.
        sharpe: mean / sample standard deviation (ddof=1) of the per-step PnL, times
            sqrt(bars_per_year). 0 when the deviation is 0 or there are fewer than 2 steps.
        sortino: mean / downside deviation (root mean square of min(pnl, 0) over every step)
            of the per-step PnL, times sqrt(bars_per_year); 0 when no step lost.
        calmar: annualized PnL (mean_pnl x bars_per_year) / max_drawdown; 0 without a drawdown.
        max_drawdown: largest fall of the equity from a previous peak, USD (>= 0); the
            equity starts at 0.
        exposure: share of the steps held in the market (position != 0).
        hit_rate: among the steps held in the market over a bar whose price moved, the
            fraction whose gross PnL is > 0 (0 if none). A bar that did not move is neither
            a hit nor a miss (counted as misses, random positions scored 0.458).
        turnover: sum over steps of |positions[t] - positions[t-1]| (from flat) / (T - 1).
        trades: number of steps where the position changes (a flip counts once).
        steps: T - 1.

    Raises:
        ValueError: naming the argument, for positions outside {-1, 0, 1}, mismatched lengths,
            non-finite prices, timestamps that do not increase, or negative costs.
    """
    pos = _check_positions(positions)
    prices = _check_close(close, len(pos))
    _check_timestamps(timestamps, len(pos))
    check_costs("backtest", commission_usd, slippage_ticks)
    if not (isinstance(bars_per_year, numbers.Real) and math.isfinite(bars_per_year) and bars_per_year > 0):
        raise ValueError(f"backtest bars_per_year={bars_per_year!r}: must be a number > 0")

    cost_per_contract = contract_costs(asset, commission_usd, slippage_ticks).per_contract_usd
    rolls = None if roll_price is None else _check_roll_price(roll_price, len(pos))
    step = walk_pnl(pos, prices, rolls, asset.multiplier, cost_per_contract)
    return _result(pos, step.gross, step.costs, float(bars_per_year), _traded(pos))


def pooled(results: list[BacktestResult]) -> BacktestResult:
    """One backtest of the steps of ``results`` in order (each started flat and paid its own
    costs), annualized as they were: the out-of-sample backtest of a walk-forward."""
    if not results:
        raise ValueError("pooled: needs at least one backtest")
    rates = {r.bars_per_year for r in results}
    if len(rates) != 1:
        raise ValueError(f"pooled: the backtests were annualized differently ({sorted(rates)})")
    return _result(
        np.concatenate([r.positions for r in results]),
        np.concatenate([r.gross_pnl for r in results]),
        np.concatenate([r.costs for r in results]),
        rates.pop(),
        traded=np.concatenate([_traded(r.positions) for r in results]),
    )


def from_steps(positions: np.ndarray, gross_pnl: np.ndarray, costs: np.ndarray, bars_per_year: float) -> BacktestResult:
    """A backtest rebuilt from its saved arrays (one that started flat)."""
    pos = np.asarray(positions, dtype=np.int8)
    return _result(pos, np.asarray(gross_pnl, np.float64), np.asarray(costs, np.float64), float(bars_per_year), _traded(pos))


def _traded(pos: np.ndarray) -> np.ndarray:
    """|positions[t] - positions[t-1]| for the traded steps, from flat."""
    held = pos[:-1].astype(np.float64)
    return np.abs(held - np.concatenate(([0], pos[:-2])).astype(np.float64))


def _result(pos: np.ndarray, gross: np.ndarray, costs: np.ndarray, bars_per_year: float, traded: np.ndarray) -> BacktestResult:
    pnl = gross - costs
    equity = np.cumsum(pnl)
    num_steps = len(pnl)
    drawdown = _max_drawdown(equity)
    metrics = {
        "pnl": float(pnl.sum()),
        "mean_pnl": float(pnl.mean()),
        "sharpe": sharpe_ratio(pnl, bars_per_year),
        "sortino": sortino_ratio(pnl, bars_per_year),
        "calmar": calmar_ratio(pnl, drawdown, bars_per_year),
        "max_drawdown": drawdown,
        "exposure": float(np.count_nonzero(pos[:-1]) / num_steps),
        "hit_rate": _hit_rate(gross),
        "turnover": float(traded.sum() / num_steps),
        "trades": int(np.count_nonzero(traded)),
        "steps": num_steps,
    }
    return BacktestResult(pnl=pnl, equity=equity, positions=pos, gross_pnl=gross, costs=costs,
                          bars_per_year=bars_per_year, metrics=metrics)  # fmt: skip


def _max_drawdown(equity: np.ndarray) -> float:
    curve = np.concatenate(([0.0], equity))
    return float(np.max(np.maximum.accumulate(curve) - curve))


def _hit_rate(gross: np.ndarray) -> float:
    # gross is nonzero exactly when a position was held over a bar whose price moved
    count = int(np.count_nonzero(gross))
    if count == 0:
        return 0.0
    return float(np.count_nonzero(gross > 0) / count)


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
        raise ValueError(f"backtest close: shape {prices.shape} does not match positions ({num_bars},)")
    bad = ~np.isfinite(prices)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"backtest close[{row}]={prices[row]}: must be a finite price")
    return prices


def _check_roll_price(roll_price, num_bars: int) -> np.ndarray:
    prices = np.asarray(roll_price, dtype=np.float64)
    if prices.shape != (num_bars,):
        raise ValueError(f"backtest roll_price: shape {prices.shape} does not match positions ({num_bars},)")
    bad = np.isinf(prices) | (prices <= 0)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"backtest roll_price[{row}]={prices[row]}: must be a positive price or NaN (no roll)")
    return prices


def _check_timestamps(timestamps, num_bars: int) -> np.ndarray:
    try:
        index = pd.DatetimeIndex(timestamps)
    except (TypeError, ValueError) as err:
        raise ValueError(f"backtest timestamps: cannot be read as times ({err})") from None
    if len(index) != num_bars:
        raise ValueError(f"backtest timestamps: length {len(index)} does not match positions ({num_bars},)")
    if index.hasnans:
        row = int(np.flatnonzero(index.isna())[0])
        raise ValueError(f"backtest timestamps[{row}]: is missing (NaT)")
    times_ns = index.as_unit("ns").asi8
    not_increasing = np.diff(times_ns) <= 0
    if not_increasing.any():
        row = int(np.flatnonzero(not_increasing)[0]) + 1
        raise ValueError(
            f"backtest timestamps[{row}]={index[row]}: must be after timestamps[{row - 1}]={index[row - 1]} (strictly increasing)"
        )
    return times_ns
