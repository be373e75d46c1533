"""foxhunt.trading.pnl, the one owner of the cost and PnL formula: the env stepped bar by bar, the
agents' greedy-walk rewards and the backtest give the same per-step PnL to the last bit (all three
call it), and that PnL is the formula written out by hand; the formula gives the same figures on
numpy arrays and torch tensors; the held contract's move and the roll flags on a roll bar."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from foxhunt.evaluation.backtest import backtest
from foxhunt.models.agent import walk_rewards
from foxhunt.trading.env import TradingEnv
from foxhunt.trading.pnl import contract_costs, held_moves, in_ticks, roll_flags, step_pnl, walk_pnl

CONF_ASSET = Path(__file__).resolve().parents[2] / "conf" / "asset"
ASSETS = {key: instantiate(OmegaConf.load(CONF_ASSET / f"{key}.yaml")) for key in ("es", "nq", "6e", "zn")}
ES = ASSETS["es"]  # tick 0.25, multiplier 50, tick value 12.5


@st.composite
def walks(draw):
    """(asset, positions, raw close, roll_price or None, commission USD, slippage ticks): prices on
    the asset's tick grid, some roll bars whose new contract trades tens of ticks away, costs
    drawn freely (not only round figures: a sum of costs rounds)."""
    asset = ASSETS[draw(st.sampled_from(sorted(ASSETS)))]
    n = draw(st.integers(2, 50))
    ticks = np.cumsum(draw(st.lists(st.integers(-20, 20), min_size=n, max_size=n)))
    close = asset.round_to_tick(asset.price_level + asset.tick_size * ticks)
    positions = np.array(draw(st.lists(st.sampled_from([-1, 0, 1]), min_size=n, max_size=n)))
    roll_price = None
    if draw(st.booleans()):
        rolled = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        spreads = draw(st.lists(st.integers(-60, 60), min_size=n, max_size=n))
        roll_price = np.full(n, np.nan)
        for t in range(1, n):
            if rolled[t]:
                roll_price[t] = asset.round_to_tick(close[t - 1] + asset.tick_size * spreads[t])
    commission = draw(st.floats(0.0, 5.0, allow_nan=False).map(lambda c: round(c, 2)))
    slippage = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.7, 2.0]))
    return asset, positions, close, roll_price, commission, slippage


def env_steps(asset, positions, close, roll_price, commission, slippage):
    """(pnl_usd, reward) of TradingEnv.sequential stepped bar by bar through ``positions``."""
    env = TradingEnv.sequential(torch.zeros(len(close), 2), torch.from_numpy(close), asset, commission, slippage,
                                roll_price=roll_price)  # fmt: skip
    env.reset()
    pnl, reward = [], []
    for p in positions[:-1]:
        _, r, _, _, info = env.step(torch.tensor([p + 1]))
        pnl.append(float(info["pnl_usd"][0]))
        reward.append(float(r[0]))
    return np.array(pnl), np.array(reward)


def by_hand(asset, positions, close, roll_price, commission, slippage) -> list[float]:
    """The formula of foxhunt.trading.pnl's docstring, one Python float at a time."""
    cost = commission + slippage * asset.tick_value
    out, previous = [], 0
    for t in range(len(close) - 1):
        pos = int(positions[t])
        rolled = roll_price is not None and not math.isnan(roll_price[t + 1])
        move = close[t + 1] - (roll_price[t + 1] if rolled else close[t])
        out.append(pos * move * asset.multiplier - cost * (abs(pos - previous) + (2 * abs(pos) if rolled else 0)))
        previous = pos
    return out


@settings(max_examples=120, deadline=None)
@given(walks())
def test_env_walk_rewards_and_backtest_give_the_same_step_pnl(walk):
    asset, positions, close, roll_price, commission, slippage = walk
    env_pnl, env_reward = env_steps(*walk)
    reward, walk_pnl_usd = walk_rewards(positions, close, asset, commission, slippage, roll_price)
    stamps = np.datetime64("2024-03-04T14:30") + np.arange(len(close)) * np.timedelta64(1, "m")
    result = backtest(positions, close, stamps, asset, commission, slippage, bars_per_year=1e5, roll_price=roll_price)

    np.testing.assert_array_equal(env_pnl, result.pnl)  # to the last bit: one formula, one order of operations
    np.testing.assert_array_equal(walk_pnl_usd, result.pnl)
    np.testing.assert_array_equal(result.pnl, result.gross_pnl - result.costs)
    np.testing.assert_array_equal(reward, result.pnl / asset.tick_value)
    np.testing.assert_array_equal(env_reward, (result.pnl / asset.tick_value).astype(np.float32))
    np.testing.assert_allclose(result.pnl, by_hand(*walk), rtol=0, atol=1e-6)  # to the cent, and far below
    assert (result.costs >= 0).all()


@settings(max_examples=60, deadline=None)
@given(walks())
def test_the_formula_gives_the_same_figures_on_numpy_and_torch(walk):
    asset, positions, close, roll_price, commission, slippage = walk
    cost = contract_costs(asset, commission, slippage).per_contract_usd
    held = positions[:-1].astype(np.float64)
    previous = np.concatenate(([0.0], held[:-1]))
    rolled = roll_flags(roll_price, len(close)).astype(np.float64)
    numpy_step = step_pnl(held, previous, held_moves(close, roll_price), rolled, asset.multiplier, cost)
    torch_step = step_pnl(*(torch.from_numpy(a) for a in (held, previous, held_moves(close, roll_price), rolled)),
                          asset.multiplier, cost)  # fmt: skip
    for a, b in zip(numpy_step, torch_step):
        assert isinstance(a, np.ndarray) and isinstance(b, torch.Tensor)
        np.testing.assert_array_equal(a, b.numpy())
    walked = walk_pnl(positions, close, roll_price, asset.multiplier, cost)
    for a, b in zip(numpy_step, walked):
        np.testing.assert_array_equal(a, b)  # flags 0.0 where no bar rolls: the same as no roll at all


def test_a_long_held_over_a_roll_bar_by_hand():
    """ES long 2 bars: bar 1 +2 ticks, bar 2 a roll bar (new contract entered at 4810.00, closes at
    4810.50: +2 ticks in the contract held, the 39-tick spread is no profit). 2 USD + 1 tick = 14.50 USD
    a contract: entry 14.50, the roll two contracts, 29.00."""
    close = np.array([4800.0, 4800.5, 4810.5])
    roll_price = np.array([np.nan, np.nan, 4810.0])
    assert held_moves(close, roll_price).tolist() == [0.5, 0.5]
    assert roll_flags(roll_price, 3).tolist() == [False, True]
    assert roll_flags(None, 3).tolist() == [False, False]
    costs = contract_costs(ES, 2.0, 1.0)
    assert (costs.per_contract_usd, costs.slippage_price) == (14.5, 0.25)
    step = walk_pnl(np.array([1, 1, 0]), close, roll_price, ES.multiplier, costs.per_contract_usd)
    assert step.gross.tolist() == [25.0, 25.0]
    assert step.costs.tolist() == [14.5, 29.0]
    assert step.net.tolist() == [10.5, -4.0]
    assert in_ticks(step.net, ES.tick_value).tolist() == [0.84, -0.32]


def test_the_env_and_the_backtest_name_a_bad_cost_the_same_way():
    for who, call in (
        ("TradingEnv", lambda c: TradingEnv.sequential(torch.zeros(3, 1), torch.ones(3), ES, c, 0.0)),
        (
            "backtest",
            lambda c: backtest([0, 1, 0], [1.0, 2.0, 3.0], np.arange(3).astype("datetime64[m]"), ES, c, 0.0, bars_per_year=1.0),
        ),  # fmt: skip
    ):
        with pytest.raises(ValueError, match=rf"^{who} commission_usd=-1.0: must be a finite number >= 0$"):
            call(-1.0)
