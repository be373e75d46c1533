"""Risk limits of a paper session: what stops a runaway, checked on every bar.

* ``max_position``: a target beyond this many contracts of a symbol is a breach;
* ``max_daily_loss_usd``: the account's equity more than this below its value at the first bar
  of the trading date (the asset's calendar: a Globex session opens the evening before);
* ``max_drawdown_usd``: the equity more than this below its running peak;
* ``stale_minutes``: a bar arriving after this many open-market minutes without one (the asset's
  exchange calendar, :meth:`foxhunt.data.calendar.SessionCalendar.open_minutes`: a weekend, a
  holiday or the daily break are not missing minutes), or the wall clock that far past the last
  bar on a live feed, flattens (the order fills at the next bar's open) and says so; trading
  goes on with the next decision.

A breach of the first three flattens, is recorded with its reason, and then (``on_breach``)
``stop``: the session ends once the flat has filled; ``pause``: the account stays flat until the
next trading date, where the day's loss and the drawdown's peak start again from the equity.
Whatever the limits (all three losses may be null), an equity at or below zero is a breach that
always stops: an exhausted account has nothing left to trade with, so no pause can end it.
Written by hand: the limits are a few comparisons on the ledger's own figures.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from foxhunt.data.calendar import MINUTE_NS, calendar_for

ACTIVE, PAUSED, STOPPED = "active", "paused", "stopped"
EXHAUSTED = "account exhausted"  # the breach that stops whatever ``on_breach`` says


@dataclass
class RiskState:
    """What the limits remember (kept in the ledger): the trading date, the equity at its
    start, the peak, the status and the last breach."""

    day: str = ""
    day_start: float = 0.0
    peak: float = 0.0
    status: str = ACTIVE
    reason: str = ""


class RiskLimits:
    def __init__(self, settings, asset) -> None:
        self.max_position = int(settings.max_position)
        self.max_daily_loss = None if settings.max_daily_loss_usd is None else float(settings.max_daily_loss_usd)
        self.max_drawdown = None if settings.max_drawdown_usd is None else float(settings.max_drawdown_usd)
        self.stale_minutes = None if settings.stale_minutes is None else int(settings.stale_minutes)
        self.on_breach = str(settings.on_breach)
        self.calendar = calendar_for(asset)

    def trading_date(self, ts_ns: int) -> str:
        return str(self.calendar.trading_dates(np.array([ts_ns], "datetime64[ns]"))[0])

    def new_bar(self, state: RiskState, ts_ns: int, equity: float) -> str | None:
        """Before a bar is traded: a new trading date resets the day (and ends a pause);
        returns a line when that happened."""
        day = self.trading_date(ts_ns)
        if day == state.day:
            return None
        state.day, state.day_start = day, equity
        if state.status == PAUSED:
            state.status, state.peak = ACTIVE, equity
            return f"trading date {day}: the pause ends ({state.reason})"
        return None

    def stale(self, last_ts_ns: int | None, now_ns: int) -> str | None:
        """A line when the open-market minutes between the end of the bar at ``last_ts_ns``
        and ``now_ns`` reach ``stale_minutes``."""
        if self.stale_minutes is None or last_ts_ns is None:
            return None
        missing = self.calendar.open_minutes(last_ts_ns + MINUTE_NS, now_ns)
        if missing >= self.stale_minutes:
            return f"stale feed: no bar for {missing} open-market minutes (limit {self.stale_minutes}, {self.calendar.name})"
        return None

    def breach(self, state: RiskState, equity: float, targets: dict[str, int]) -> str | None:
        """After a bar is marked: the first limit breached, as a line (None: within limits)."""
        state.peak = max(state.peak, equity)
        if equity <= 0:
            return f"{EXHAUSTED}: equity {equity:,.2f} USD, nothing left to trade"
        for symbol, target in targets.items():
            if abs(target) > self.max_position:
                return (
                    f"max position: {symbol} target {target:+d} beyond {self.max_position} contract(s) (paper.risk.max_position)"
                )
        loss = state.day_start - equity
        if self.max_daily_loss is not None and loss > self.max_daily_loss:
            return f"max daily loss: {loss:,.2f} USD lost on {state.day} (paper.risk.max_daily_loss_usd={self.max_daily_loss:g})"
        drawdown = state.peak - equity
        if self.max_drawdown is not None and drawdown > self.max_drawdown:
            return f"max drawdown: {drawdown:,.2f} USD below the peak {state.peak:,.2f} (paper.risk.max_drawdown_usd={self.max_drawdown:g})"
        return None

    def trip(self, state: RiskState, reason: str) -> str:
        """Flatten for ``reason``; returns what follows: ``stop`` or ``pause``."""
        final = self.on_breach == "stop" or reason.startswith(EXHAUSTED)
        state.status = STOPPED if final else PAUSED
        state.reason = reason
        return "stop" if final else "pause"
