"""foxhunt.paper.fills: the money adds up. With ``decision_close`` every bar's equity step is the
shared backtest's step, rolls included; with ``next_open`` it differs by exactly the fills' gaps;
the cash and the position always equal the capital plus realized and unrealized PnL less the
commissions; a fill is never at a better price than its bar allows; each contract a fill trades
costs the cash foxhunt.trading.pnl's per-contract cost, the backtest's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paper_bars import CAPITAL, ES, bar, bar_paths

from foxhunt.evaluation.backtest import backtest
from foxhunt.paper.fills import Account, FillModel
from foxhunt.trading.pnl import contract_costs

COSTS = st.tuples(st.sampled_from([0.0, 2.25]), st.sampled_from([0.0, 0.5, 1.0]))  # (commission USD, slippage ticks)


def trade(model: FillModel, bars, targets):
    """Decide ``targets[i]`` at bar i's close, fill on bar i + 1: the paper loop without the ensemble."""
    account = Account("ES.FUT", cash=CAPITAL, multiplier=ES.multiplier)
    equity, fills = [], []
    for b, target in zip(bars, targets):
        made = model.on_bar(account, b)
        fills.append(made)
        equity.append(account.equity)
        account.pending = model.order(account, b, target, "signal")
    return account, np.array(equity), fills


def paths_and_targets(low: int, high: int):
    return bar_paths().flatmap(lambda bars: st.tuples(
        st.just(bars), st.lists(st.integers(low, high), min_size=len(bars), max_size=len(bars))))  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(paths_and_targets(-1, 1), COSTS)
def test_decision_close_equity_steps_are_the_backtests_steps(case, costs):
    bars, targets = case
    commission, slippage = costs
    _, equity, _ = trade(FillModel(ES, commission, slippage, "decision_close"), bars, targets)
    close = np.array([b.raw_close for b in bars])
    roll = np.array([b.roll_price for b in bars])
    stamps = np.array([b.ts_ns for b in bars], "datetime64[ns]")
    result = backtest(np.array(targets), close, stamps, ES, commission, slippage, bars_per_year=1e5, roll_price=roll)
    assert equity[0] == CAPITAL  # nothing is filled on the first bar
    np.testing.assert_allclose(np.diff(equity), result.pnl, rtol=0, atol=1e-6)
    assert equity[-1] - CAPITAL == pytest.approx(result.metrics["pnl"], abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(paths_and_targets(-1, 1), COSTS)
def test_next_open_differs_from_the_backtest_by_the_fills_gaps(case, costs):
    bars, targets = case
    commission, slippage = costs
    closed, _, _ = trade(FillModel(ES, commission, slippage, "decision_close"), bars, targets)
    opened, _, fills = trade(FillModel(ES, commission, slippage, "next_open"), bars, targets)
    gap = sum(f.gap_usd for made in fills for f in made)
    assert opened.position == closed.position
    assert opened.equity + gap == pytest.approx(closed.equity, abs=1e-6)
    # the gap of one fill: quantity x (the bar's open - the close it was decided at) x multiplier
    for i, made in enumerate(fills):
        for f in made:
            if f.kind == "trade" and math.isnan(bars[i].roll_price):
                assert f.gap_usd == pytest.approx(f.quantity * (bars[i].raw_open - bars[i - 1].raw_close) * ES.multiplier)
            else:
                assert f.gap_usd == 0.0  # a roll bar's order and the roll itself fill at their own reference


class AverageCost:
    """An independent book: the position's average entry price, realized PnL on each reduction."""

    def __init__(self) -> None:
        self.position, self.average, self.realized, self.commission = 0, 0.0, 0.0, 0.0

    def fill(self, quantity: int, price: float, commission: float) -> None:
        self.commission += commission
        pos = self.position
        if pos == 0 or (pos > 0) == (quantity > 0):
            self.average = (self.average * abs(pos) + price * abs(quantity)) / abs(pos + quantity)
            self.position = pos + quantity
            return
        closed = min(abs(quantity), abs(pos))
        self.realized += closed * (price - self.average) * (1 if pos > 0 else -1) * ES.multiplier
        self.position = pos + quantity
        if self.position == 0:
            self.average = 0.0
        elif (self.position > 0) != (pos > 0):  # flipped: the rest opened at this price
            self.average = price

    def unrealized(self, mark: float) -> float:
        return self.position * (mark - self.average) * ES.multiplier if self.position else 0.0


@settings(max_examples=80, deadline=None)
@given(paths_and_targets(-3, 3), COSTS, st.sampled_from(["next_open", "decision_close"]))
def test_equity_is_capital_plus_realized_and_unrealized_pnl_less_commissions(case, costs, fill_price):
    bars, targets = case
    model = FillModel(ES, *costs, fill_price)
    account = Account("ES.FUT", cash=CAPITAL, multiplier=ES.multiplier)
    book = AverageCost()
    for b, target in zip(bars, targets):
        for f in model.on_bar(account, b):
            book.fill(f.quantity, f.price, f.commission)
            assert f.commission == abs(f.quantity) * costs[0]
        assert account.position == book.position
        expected = CAPITAL + book.realized + book.unrealized(b.raw_close) - book.commission
        assert account.equity == pytest.approx(expected, abs=1e-6)
        account.pending = model.order(account, b, target, "signal")


@settings(max_examples=60, deadline=None)
@given(paths_and_targets(-2, 2), st.sampled_from([0.0, 1.0, 2.0]), st.sampled_from(["next_open", "decision_close"]))
def test_a_fill_is_never_better_than_its_bar_allows(case, slippage, fill_price):
    """A buy pays the base price plus the slippage, a sell gets it less the slippage; the base is
    the fill bar's raw open (next_open), the close decided at (decision_close), or on a roll bar
    the old contract's last close; the order fills on the bar after its decision, and the position
    then is the target decided."""
    bars, targets = case
    model = FillModel(ES, 0.0, slippage, fill_price)
    _, _, fills = trade(model, bars, targets)
    slip = slippage * ES.tick_size
    for i, made in enumerate(fills):
        trades = [f for f in made if f.kind == "trade"]
        assert len(trades) <= 1 and (i > 0 or not made)
        for f in trades:
            rolled = not math.isnan(bars[i].roll_price)
            base = bars[i - 1].raw_close if rolled or fill_price == "decision_close" else bars[i].raw_open
            assert f.order_ts_ns == bars[i - 1].ts_ns and f.ts_ns == bars[i].ts_ns
            assert f.quantity == targets[i - 1] - (targets[i - 2] if i >= 2 else 0)
            if f.quantity > 0:
                assert f.price == pytest.approx(base + slip) and f.price >= base
            else:
                assert f.price == pytest.approx(base - slip) and f.price <= base
        rolls = [f for f in made if f.kind != "trade"]
        if rolls:  # out of the old contract at its last close, into the new at the roll price, both slipped
            out, into = rolls
            assert (out.kind, into.kind) == ("roll_out", "roll_in") and out.quantity == -into.quantity == -targets[i - 1]
            sign = 1 if into.quantity > 0 else -1
            assert out.price == pytest.approx(bars[i - 1].raw_close - sign * slip)
            assert into.price == pytest.approx(bars[i].roll_price + sign * slip)


def test_one_round_trip_by_hand():
    """Buy 1 at the next open 4800.50 + 1 tick, sell it at the next open 4803.00 - 1 tick, 2.25 USD a
    side: (4802.75 - 4800.75) x 50 - 4.50 = 95.50 USD."""
    model = FillModel(ES, 2.25, 1.0, "next_open")
    account = Account("ES.FUT", cash=CAPITAL, multiplier=ES.multiplier)
    bars = [bar(0, 4800.0, 4800.25), bar(1, 4800.50, 4801.0), bar(2, 4803.0, 4802.0)]
    assert model.on_bar(account, bars[0]) == [] and account.pending is None
    account.pending = model.order(account, bars[0], 1, "signal")
    (buy,) = model.on_bar(account, bars[1])
    assert (buy.quantity, buy.price, buy.commission, buy.gap_usd) == (1, 4800.75, 2.25, (4800.50 - 4800.25) * 50)
    assert account.cash == CAPITAL - 4800.75 * 50 - 2.25
    assert account.equity == pytest.approx(CAPITAL + (4801.0 - 4800.75) * 50 - 2.25)
    account.pending = model.order(account, bars[1], 0, "signal")
    (sell,) = model.on_bar(account, bars[2])
    assert (sell.quantity, sell.price) == (-1, 4802.75)
    assert account.position == 0 and account.equity == pytest.approx(CAPITAL + 95.50)


def test_no_order_for_the_position_held_and_a_bad_fill_price_is_refused():
    model = FillModel(ES, 0.0, 0.0, "next_open")
    account = Account("ES.FUT", position=2, cash=CAPITAL, multiplier=ES.multiplier)
    assert model.order(account, bar(0, 4800.0, 4800.0), 2, "signal") is None
    order = model.order(account, bar(0, 4800.0, 4801.0), -1, "signal")
    assert (order.target, order.quantity, order.reference) == (-1, -3, 4801.0)
    with pytest.raises(ValueError, match="paper.fill_price='mid': must be one of next_open, decision_close"):
        FillModel(ES, 0.0, 0.0, "mid")


@settings(max_examples=60, deadline=None)
@given(st.floats(0.0, 10.0, allow_nan=False).map(lambda c: round(c, 2)), st.sampled_from([0.0, 0.5, 1.0, 1.7, 3.0]),
       st.integers(-5, 5).filter(bool), st.integers(18_000, 21_000))  # fmt: skip
def test_a_fills_cost_per_contract_is_the_pnl_modules(commission, slippage, quantity, base_ticks):
    """The cash a fill of ``quantity`` contracts takes beyond their price is ``|quantity|`` times
    ``trading.pnl``'s per-contract cost (commission + slippage in ticks x tick value): the paper
    account and the backtest charge one figure, from one owner."""
    model = FillModel(ES, commission, slippage, "decision_close")
    assert model.costs == contract_costs(ES, commission, slippage)
    account = Account("ES.FUT", cash=CAPITAL, multiplier=ES.multiplier)
    base = base_ticks * ES.tick_size
    account.pending = model.order(account, bar(0, base, base), quantity, "signal")
    (fill,) = model.on_bar(account, bar(1, base, base))
    paid = CAPITAL - account.cash - quantity * base * ES.multiplier
    assert paid == pytest.approx(abs(quantity) * model.costs.per_contract_usd, abs=1e-6)
    assert fill.commission == abs(quantity) * model.costs.commission_usd
    assert abs(fill.price - base) == pytest.approx(model.costs.slippage_price, abs=1e-9)
