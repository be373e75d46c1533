"""foxhunt.paper.risk: each limit breaches exactly past its threshold (never at it), the first
breached is the one named, the day and the pause follow the exchange's trading dates, and a stale
feed counts open-market minutes only."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paper_bars import ES

from foxhunt.paper.risk import ACTIVE, PAUSED, STOPPED, RiskLimits, RiskState


def limits(max_position=1, max_daily_loss_usd=None, max_drawdown_usd=None, stale_minutes=None, on_breach="stop") -> RiskLimits:
    return RiskLimits(SimpleNamespace(max_position=max_position, max_daily_loss_usd=max_daily_loss_usd,
                                      max_drawdown_usd=max_drawdown_usd, stale_minutes=stale_minutes,
                                      on_breach=on_breach), ES)  # fmt: skip


def utc(text: str) -> int:
    return int(np.datetime64(text, "ns").astype(np.int64))


@settings(deadline=None)  # the first example loads the exchange calendar
@given(st.integers(-6, 6), st.integers(0, 4))
def test_a_target_breaches_exactly_beyond_max_position(target, max_position):
    line = limits(max_position=max_position).breach(RiskState(), 10_000.0, {"ES.FUT": target})
    assert (line is not None) == (abs(target) > max_position)
    if line:
        assert line.startswith(f"max position: ES.FUT target {target:+d} beyond {max_position} contract(s)")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-300, 300), min_size=1, max_size=30), st.sampled_from([None, 100, 250]),
       st.sampled_from([None, 150, 400]))  # fmt: skip
def test_the_first_breach_is_where_the_loss_or_the_drawdown_first_passes_its_limit(steps, daily, drawdown):
    """Equities of one trading date from 10,000 USD, checked bar by bar against a peak and a day
    start kept here: the limits breach at the first bar that is strictly past one."""
    risk = limits(max_daily_loss_usd=daily, max_drawdown_usd=drawdown)
    state = RiskState(day="2024-03-12", day_start=10_000.0, peak=10_000.0)
    equity, peak = 10_000.0, 10_000.0
    for step in steps:
        equity += step
        peak = max(peak, equity)
        line = risk.breach(state, equity, {"ES.FUT": 1})
        assert state.peak == peak
        loss_past = daily is not None and 10_000.0 - equity > daily
        drawdown_past = drawdown is not None and peak - equity > drawdown
        if loss_past:  # the daily loss is checked before the drawdown
            assert line is not None and line.startswith(f"max daily loss: {10_000.0 - equity:,.2f} USD lost on 2024-03-12")
        elif drawdown_past:
            assert line is not None and line.startswith(f"max drawdown: {peak - equity:,.2f} USD below the peak {peak:,.2f}")
        else:
            assert line is None
        if line:
            break


def test_at_the_limit_is_within_it_and_the_position_limit_is_named_first():
    risk = limits(max_position=1, max_daily_loss_usd=500, max_drawdown_usd=800)
    state = RiskState(day="2024-03-12", day_start=1_000.0, peak=1_300.0)
    assert risk.breach(state, 500.0, {"ES.FUT": 1}) is None  # lost exactly 500, 800 below the peak
    assert risk.breach(state, 499.99, {"ES.FUT": -1}).startswith("max daily loss: 500.01 USD")
    assert risk.breach(state, 400.0, {"ES.FUT": 2}).startswith("max position")


def test_a_new_trading_date_resets_the_day_and_ends_a_pause_but_not_a_stop():
    """Globex opens the evening before: 23:00 UTC on the 12th (19:00 New York) trades the 13th."""
    paused = limits(on_breach="pause")
    state = RiskState(peak=2_000.0)
    assert paused.new_bar(state, utc("2024-03-12T15:00"), 1_000.0) is None
    assert (state.day, state.day_start, state.status) == ("2024-03-12", 1_000.0, ACTIVE)
    assert paused.new_bar(state, utc("2024-03-12T20:00"), 900.0) is None and state.day_start == 1_000.0  # same date
    paused.trip(state, "max daily loss: ...")
    assert (state.status, state.reason) == (PAUSED, "max daily loss: ...")
    assert paused.new_bar(state, utc("2024-03-12T20:59"), 800.0) is None and state.status == PAUSED
    line = paused.new_bar(state, utc("2024-03-12T23:00"), 700.0)
    assert line == "trading date 2024-03-13: the pause ends (max daily loss: ...)"
    assert (state.day, state.day_start, state.peak, state.status) == ("2024-03-13", 700.0, 700.0, ACTIVE)

    stopped = limits(on_breach="stop")
    state = RiskState(day="2024-03-12", day_start=1_000.0, peak=1_000.0)
    stopped.trip(state, "max drawdown: ...")
    assert stopped.new_bar(state, utc("2024-03-13T15:00"), 600.0) is None
    assert (state.status, state.day, state.day_start) == (STOPPED, "2024-03-13", 600.0)


@pytest.mark.parametrize(
    ("last", "now", "stale"),
    [
        ("2024-03-12T15:00", "2024-03-12T15:05", False),  # 4 open minutes missing: within 5
        ("2024-03-12T15:00", "2024-03-12T15:06", True),  # 5 missing
        ("2024-03-12T20:58", "2024-03-12T22:03", False),  # the daily break (21:00-22:00 UTC) is not missing
        ("2024-03-12T20:58", "2024-03-12T22:04", True),  # 20:59 and 22:00 .. 22:03: 5 missing
        ("2024-03-15T20:59", "2024-03-17T22:00", False),  # Friday's close to Sunday's open
        ("2024-03-28T20:59", "2024-03-31T22:00", False),  # Good Friday 2024: the exchange is closed
    ],
)
def test_a_stale_feed_counts_only_open_market_minutes(last, now, stale):
    line = limits(stale_minutes=5).stale(utc(last), utc(now))
    assert (line is not None) == stale
    if stale:
        assert line == "stale feed: no bar for 5 open-market minutes (limit 5, CME_Equity)"
    assert limits(stale_minutes=None).stale(utc(last), utc(now)) is None
    assert limits(stale_minutes=5).stale(None, utc(now)) is None


@pytest.mark.parametrize("on_breach", ["stop", "pause"])
@pytest.mark.parametrize("equity", [0.0, -0.01, -5_000.0])
def test_an_equity_at_or_below_zero_breaches_and_stops_whatever_the_limits(equity, on_breach):
    risk = limits(on_breach=on_breach)  # no loss limit at all
    state = RiskState(day="2024-03-12", day_start=10_000.0, peak=10_000.0)
    line = risk.breach(state, equity, {"ES.FUT": 0})
    assert line == f"account exhausted: equity {equity:,.2f} USD, nothing left to trade"
    assert risk.trip(state, line) == "stop" and state.status == STOPPED
    assert risk.breach(state, 0.01, {"ES.FUT": 0}) is None
