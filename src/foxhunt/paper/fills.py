"""Orders and fills: a target position becomes a market order, filled on the next bar as the
backtest trades.

An :class:`Order` is decided at a bar's close (the ensemble's target, or a risk limit's flat)
for the quantity that takes the position there. :meth:`FillModel.on_bar` fills the symbol's
pending order on the next bar and marks the account to that bar's raw close:

* the price: ``paper.fill_price=next_open``: the bar's raw open; ``decision_close``: the raw
  close of the bar the order was decided on (the price :func:`foxhunt.evaluation.backtest.backtest`
  assumes); either moved ``slippage_ticks`` ticks against the order (``execution``;
  :attr:`foxhunt.trading.pnl.ContractCosts.slippage_price`);
* ``commission_usd`` per contract traded: with the slippage, each contract costs
  :attr:`~foxhunt.trading.pnl.ContractCosts.per_contract_usd`, the backtest's figure (the costs
  come from :func:`foxhunt.trading.pnl.contract_costs`, the one owner of the formula);
* a roll bar (``roll_price`` finite, :mod:`foxhunt.data.roll`): the pending order was decided
  on the old contract, which has no next bar in the stream: it fills at the old contract's last
  close; then the position held is closed there and reopened at ``roll_price``, two contracts'
  costs, exactly the backtest's roll.

With ``decision_close`` every step's cash flow is the backtest's, so paper PnL equals the
backtest's on the same positions to float rounding; with ``next_open`` it differs by each
fill's ``gap_usd`` (quantity x (fill base price - decision close) x multiplier, recorded on
the fill), zero where a bar opens at the previous close.

Cash accounting: buying ``q`` at ``p`` takes ``q * p * multiplier + |q| * commission`` from the
cash; the equity is the cash plus the position marked at the raw close. Every money figure (the
capital, a fill's cash flow, the cash after it, the equity marked) is checked before it is
booked (:func:`check_money`): a figure that is not finite, or beyond :data:`MONEY_LIMIT_USD`
where a float no longer keeps an account to the cent, is one line and nothing of
the bar is booked (``paper.capital_usd=1e308`` once booked hundreds of fills as "PnL 0.00": each
fill's cash was lost in the rounding of the capital). Written by hand: the
rule is the backtest's, which no execution simulator (nautilus_trader, backtrader) reproduces
bar for bar without adopting its whole engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from foxhunt.errors import ConfigError
from foxhunt.trading.pnl import contract_costs

FILL_PRICES = ("next_open", "decision_close")
# the largest money figure booked (about 68.7 billion USD, above the schema's capital bound): below it
# float64 rounds a figure by at most 2^-17 USD (7.6e-6), so even a thousand fills' worst-case rounding
# stays under a cent; far beyond it the cents go (a capital of 1e308 swallowed every fill whole)
MONEY_LIMIT_USD = 2.0**36
MONEY_KEYS = "paper.capital_usd, execution.slippage_ticks, execution.commission_usd or a bar's price"


def check_money(value: float, what: str) -> float:
    """``value`` when a float keeps it (finite, within :data:`MONEY_LIMIT_USD`), else a one-line
    ConfigError naming ``what``."""
    if not math.isfinite(value) or abs(value) >= MONEY_LIMIT_USD:
        raise ConfigError(f"{what}: {value:.6g} USD is beyond +-{MONEY_LIMIT_USD:,.0f} USD, past which a float no longer "
                          "keeps an account to the cent; nothing was booked")  # fmt: skip
    return value


@dataclass(frozen=True)
class Order:
    symbol: str
    ts_ns: int  # the bar it was decided on (its start)
    target: int
    quantity: int
    reason: str  # "signal" or the risk limit's why
    reference: float  # the raw close it was decided at


@dataclass(frozen=True)
class Fill:
    symbol: str
    ts_ns: int  # the bar it filled on
    quantity: int
    price: float  # including slippage
    commission: float
    kind: str  # trade | roll_out | roll_in
    reference: float  # the decision close (trade) or the roll's own price
    gap_usd: float  # quantity x (base price - reference) x multiplier: next_open's difference to the backtest
    order_ts_ns: int | None = None


@dataclass
class Account:
    """One symbol's book: position, cash (USD), the last raw close marked, the pending order."""

    symbol: str
    position: int = 0
    cash: float = 0.0
    mark: float = math.nan
    pending: Order | None = None
    multiplier: float = field(default=1.0, repr=False)

    @property
    def equity(self) -> float:
        return self.cash + (self.position * self.mark * self.multiplier if self.position else 0.0)


class FillModel:
    def __init__(self, asset, commission_usd: float, slippage_ticks: float, fill_price: str) -> None:
        if fill_price not in FILL_PRICES:
            raise ValueError(f"paper.fill_price={fill_price!r}: must be one of {', '.join(FILL_PRICES)}")
        self.multiplier = float(asset.multiplier)
        self.costs = contract_costs(asset, commission_usd, slippage_ticks)
        self.commission = self.costs.commission_usd
        self.slip = self.costs.slippage_price
        self.at_open = fill_price == "next_open"
        check_money(self.commission, f"execution.commission_usd={float(commission_usd):g} per contract")
        check_money(self.slip * self.multiplier, f"execution.slippage_ticks={float(slippage_ticks):g} (per contract)")

    def order(self, account: Account, bar, target: int, reason: str) -> Order | None:
        """The order taking ``account`` to ``target`` from ``bar``'s close (None: nothing to trade)."""
        if target == account.position:
            return None
        return Order(account.symbol, bar.ts_ns, int(target), int(target) - account.position, reason, bar.raw_close)

    def on_bar(self, account: Account, bar) -> list[Fill]:
        """Fill the pending order on ``bar``, roll, mark to its raw close (module doc)."""
        fills: list[Fill] = []
        order, account.pending = account.pending, None
        rolled = not math.isnan(bar.roll_price)
        if order is not None:
            base = order.reference if (rolled or not self.at_open) else bar.raw_open
            fills.append(self._fill(account, bar.ts_ns, order.quantity, base, "trade", order.reference, order.ts_ns))
        if rolled and account.position:
            held = account.position
            fills.append(self._fill(account, bar.ts_ns, -held, account.mark, "roll_out", account.mark))
            fills.append(self._fill(account, bar.ts_ns, held, bar.roll_price, "roll_in", bar.roll_price))
        account.mark = bar.raw_close
        check_money(
            account.equity, f"paper: the equity of {account.symbol} marked at {bar.raw_close:g} ({MONEY_KEYS} out of range)"
        )
        return fills

    def _fill(self, account: Account, ts_ns: int, quantity: int, base: float, kind: str, reference: float,
              order_ts: int | None = None) -> Fill:  # fmt: skip
        price = base + (self.slip if quantity > 0 else -self.slip)
        commission = abs(quantity) * self.commission
        flow = quantity * price * self.multiplier + commission
        what = f"paper: a fill of {quantity:+d} {account.symbol} at {price:g} ({MONEY_KEYS} out of range)"
        account.cash = check_money(account.cash - check_money(flow, what), what)
        account.position += quantity
        gap = quantity * (base - reference) * self.multiplier
        return Fill(account.symbol, ts_ns, quantity, price, commission, kind, reference, gap, order_ts)
