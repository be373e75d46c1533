"""The trading cost and PnL formula, written once: the env's reward, the agents' greedy walk, the
backtest and the paper fills' per-contract costs all come from here.

One contract is held short, flat or long (-1, 0, 1). ``pos[t]`` is taken at the close of bar
``t`` and held to the close of bar ``t + 1``; ``pos[t-1]`` is the position held before
(``pos[-1] = 0``: a walk starts flat). Step ``t`` earns, in USD::

    cost_per_contract = commission_usd + slippage_ticks * tick_value
    gross[t] = pos[t] * move[t] * multiplier
    costs[t] = cost_per_contract * (|pos[t] - pos[t-1]| + 2 * |pos[t]| * roll[t])
    pnl[t]   = gross[t] - costs[t]
    reward[t] = pnl[t] / tick_value          (the env's reward, in ticks)

``move[t]`` is the price move of bar ``t + 1`` in the contract held over it (:func:`held_moves`):
``close[t+1] - close[t]``, or ``close[t+1] - roll_price[t+1]`` where bar ``t + 1`` is a roll bar
(``roll[t] = 1``, :func:`roll_flags`): there the position is closed in the old contract at its
last close and reopened in the new one at ``roll_price[t+1]`` (:mod:`foxhunt.data.roll` finds the
rolls), two contracts' costs. Prices are the raw contract prices, never the back-adjusted series
the features read: the PnL an account would have seen. A flip from short to long pays two
contracts' cost, flattening one; the position still open after the last step pays nothing.

:func:`step_pnl` is the formula itself, plain arithmetic and ``abs`` on numpy arrays or torch
tensors alike (the env steps it on tensors, batched over its episodes; :func:`walk_pnl` on a
whole walk's numpy arrays, for the greedy evaluation and the backtest). :class:`ContractCosts`
holds what one contract traded costs, in the units each user books it: USD per contract for
the PnL, the commission and a price offset for the paper fills (which book cash at prices).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from foxhunt.assets import AssetSpec


@dataclass(frozen=True)
class ContractCosts:
    """What one contract traded costs: ``commission_usd`` and ``slippage_ticks`` of the asset whose
    tick is ``tick_size`` price units and ``tick_value`` USD."""

    commission_usd: float
    slippage_ticks: float
    tick_size: float
    tick_value: float

    @property
    def per_contract_usd(self) -> float:
        """``commission_usd + slippage_ticks * tick_value``: the USD one contract traded costs."""
        return self.commission_usd + self.slippage_ticks * self.tick_value

    @property
    def slippage_price(self) -> float:
        """``slippage_ticks * tick_size``: how far a fill's price moves against the order."""
        return self.slippage_ticks * self.tick_size


def contract_costs(asset: AssetSpec, commission_usd: float, slippage_ticks: float) -> ContractCosts:
    """The :class:`ContractCosts` of ``asset`` at ``commission_usd`` per contract and
    ``slippage_ticks`` ticks of slippage."""
    return ContractCosts(float(commission_usd), float(slippage_ticks), float(asset.tick_size), float(asset.tick_value))


def check_costs(who: str, commission_usd: Any, slippage_ticks: Any) -> None:
    """ValueError ``"<who> <name>=<value>: must be a finite number >= 0"`` unless both costs are."""
    for name, value in (("commission_usd", commission_usd), ("slippage_ticks", slippage_ticks)):
        if not (isinstance(value, numbers.Real) and math.isfinite(value) and float(value) >= 0):
            raise ValueError(f"{who} {name}={value!r}: must be a finite number >= 0")


def entry_prices(close: np.ndarray, roll_price: np.ndarray | None) -> np.ndarray:
    """(T - 1,) the price bar t + 1's move in the contract held is measured from: ``close[t]``,
    or ``roll_price[t+1]`` where bar t + 1 is a roll bar."""
    close = np.asarray(close, np.float64)
    if roll_price is None:
        return close[:-1]
    roll = np.asarray(roll_price, np.float64)[1:]
    return np.where(np.isnan(roll), close[:-1], roll)


def held_moves(close: np.ndarray, roll_price: np.ndarray | None) -> np.ndarray:
    """(T - 1,) ``move[t]``: the move of bar t + 1 in the contract held over it (see :func:`entry_prices`)."""
    close = np.asarray(close, np.float64)
    return close[1:] - entry_prices(close, roll_price)


def roll_flags(roll_price: np.ndarray | None, num_bars: int) -> np.ndarray:
    """(T - 1,) ``roll[t]``: True where bar t + 1 is a roll bar (a position held from t to t + 1 is rolled)."""
    if roll_price is None:
        return np.zeros(max(num_bars - 1, 0), dtype=bool)
    return ~np.isnan(np.asarray(roll_price, np.float64)[1:])


class StepPnl(NamedTuple):
    """One or many steps' USD figures, arrays of one kind (numpy or torch): ``gross`` before costs,
    ``costs`` of commission and slippage (>= 0), ``net = gross - costs``."""

    gross: Any
    costs: Any
    net: Any


def step_pnl(position: Any, previous: Any, move: Any, rolled: Any, multiplier: float, cost_per_contract: float) -> StepPnl:
    """The module's formula, elementwise: ``position`` held over a bar whose held-contract move is
    ``move``, after ``previous``; ``rolled`` 1 (or True) where the bar is a roll bar, None when no
    bar is. Float64 numpy arrays or torch tensors (positions as floats), returned as the same kind."""
    gross = position * move * multiplier
    contracts = abs(position - previous)
    if rolled is not None:
        contracts = contracts + 2.0 * abs(position) * rolled
    costs = cost_per_contract * contracts
    return StepPnl(gross, costs, gross - costs)


def walk_pnl(positions: Any, close: Any, roll_price: Any, multiplier: float, cost_per_contract: float) -> StepPnl:
    """:func:`step_pnl` of a walk that starts flat and holds ``positions[t]`` (T,) from bar t to
    t + 1 over ``close`` (T,) and ``roll_price`` (T,: NaN except on roll bars; None: no roll);
    the last position is ignored. Three float64 (T - 1,) numpy arrays."""
    held = np.asarray(positions, dtype=np.float64)[:-1]
    previous = np.concatenate(([0.0], held[:-1]))
    rolled = None if roll_price is None else roll_flags(roll_price, len(held) + 1)
    return step_pnl(held, previous, held_moves(close, roll_price), rolled, multiplier, cost_per_contract)


def in_ticks(pnl_usd: Any, tick_value: float) -> Any:
    """``pnl_usd / tick_value``: the env's reward."""
    return pnl_usd / tick_value
