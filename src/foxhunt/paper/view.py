"""The live terminal view of a paper session (rich): each member's and the ensemble's position,
the account, the last bar and its latency, the limits.

Redrawn at most ``paper.view_refresh_hz`` times a second from the session's own figures (the
loop does not wait on the terminal: :meth:`PaperView.update` only rebuilds the table when a
redraw is due). ``paper.view=auto`` shows it when stdout is a terminal. Written on rich's
``Live`` and ``Table``: the layout is foxhunt's, the drawing rich's.
"""

from __future__ import annotations

import time

import numpy as np
from rich.live import Live
from rich.table import Table


class PaperView:
    def __init__(self, refresh_hz: float, title: str, limits) -> None:
        self.period = 1.0 / float(refresh_hz)
        self.title = title
        self.limits = limits
        self.started = time.monotonic()
        self.next_draw = 0.0
        self.live = Live(self._table(None), refresh_per_second=float(refresh_hz), transient=False)

    def __enter__(self) -> PaperView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.live.__exit__(*exc)

    def update(self, session, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self.next_draw:
            return
        self.next_draw = now + self.period
        self.live.update(self._table(session))

    def _table(self, session):
        table = Table(title=self.title, show_header=True, expand=False)
        table.add_column("")
        table.add_column("value", justify="right")
        if session is None:
            table.add_row("waiting for the first bar", "")
            return table
        latest = session.latest
        bar = latest.bar
        if bar is not None:
            stamp = np.datetime64(bar.ts_ns, "ns").astype("datetime64[s]")
            table.add_row(f"last bar {bar.symbol} {bar.contract}".strip(), f"{stamp} UTC close {bar.raw_close:g}")
        for name, decision in sorted(latest.decisions.items()):
            table.add_row(f"  {name}", f"{decision.position:+d}")
        table.add_row("ensemble target", f"{latest.position:+d}")
        for symbol, account in session.accounts.items():
            table.add_row(
                f"{symbol} position",
                f"{account.position:+d}" + (f" (order {account.pending.quantity:+d})" if account.pending else ""),
            )
        equity = session.equity
        table.add_row("equity USD", f"{equity:,.2f}")
        table.add_row("PnL USD", f"{equity - session.capital:,.2f}")
        table.add_row("drawdown USD", f"{max(session.state.peak - equity, 0.0):,.2f}")
        table.add_row("day PnL USD", f"{equity - session.state.day_start:,.2f} ({session.state.day})")
        table.add_row("ensemble / loop per bar", f"{latest.ensemble_ns / 1e3:,.1f} us / {latest.loop_ns / 1e3:,.1f} us")
        elapsed = time.monotonic() - self.started
        table.add_row("bars", f"{session.bars:,} ({session.bars / elapsed:,.0f}/s)" if elapsed > 0 else f"{session.bars:,}")
        lim = self.limits
        table.add_row("limits", f"pos {lim.max_position}, day loss {lim.max_daily_loss}, drawdown {lim.max_drawdown}, "
                                f"stale {lim.stale_minutes} min, on breach {lim.on_breach}")  # fmt: skip
        table.add_row("status", session.state.status + (f": {session.state.reason}" if session.state.reason else ""))
        for line in latest.events[-2:]:
            table.add_row("event", line)
        return table
