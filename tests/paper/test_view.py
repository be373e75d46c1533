"""foxhunt.paper.view: the live table shows the session's own figures (position and the order in
flight, equity, PnL, drawdown, the day, the status and its reason, the last events), and redraws
at most ``view_refresh_hz`` times a second."""

from __future__ import annotations

import io

from paper_bars import CAPITAL, bar
from rich.console import Console
from test_session import limits, session

from foxhunt.paper.view import PaperView


def text(renderable) -> str:
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def test_the_table_shows_the_sessions_figures(tmp_path):
    risk = limits(max_daily_loss_usd=600.0, on_breach="stop")
    s = session(tmp_path / "paper.sqlite", lambda ts: 1, risk, slippage=0.0)
    view = PaperView(4.0, "paper ES.FUT: test", risk)
    assert "waiting for the first bar" in text(view._table(None))
    bars = [bar(0, 4800.0, 4800.0), bar(1, 4800.0, 4790.0), bar(2, 4790.0, 4785.0)]
    s.run(iter(bars), lambda: False)
    shown = text(view._table(s))
    equity = CAPITAL - 15 * 50 - 2.25  # long from 4800, marked 4785
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in shown.splitlines() if line.count("│") == 3}
    assert rows["equity USD"] == f"{equity:,.2f}"
    assert rows["ES.FUT position"] == "+1 (order -1)"  # the breach's flat in flight
    assert rows["ensemble target"] == "+0"
    assert rows["PnL USD"] == f"{equity - CAPITAL:,.2f}" and rows["drawdown USD"] == f"{CAPITAL - equity:,.2f}"
    assert rows["day PnL USD"] == f"{equity - CAPITAL:,.2f} (2024-03-12)"
    assert rows["status"].startswith("stopped: max daily loss: 752.25 USD lost on 2024-03-12")
    assert rows["last bar ES.FUT"] == "2024-03-12T15:02:00 UTC close 4785"
    assert rows["limits"] == "pos 1, day loss 600.0, drawdown None, stale None min, on breach stop"
    assert rows["event"].startswith("max daily loss: 752.25 USD")


def test_a_redraw_waits_for_its_period(tmp_path):
    s = session(tmp_path / "paper.sqlite", lambda ts: 0)
    s.run(iter([bar(0, 4800.0, 4800.0)]), lambda: False)
    view = PaperView(0.5, "paper", limits())  # one redraw per 2 s
    view.update(s)
    drawn = view.live.renderable
    view.update(s)
    assert view.live.renderable is drawn  # within the period: not rebuilt
    view.update(s, force=True)
    assert view.live.renderable is not drawn
