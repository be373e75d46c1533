"""Trading environment: hand-computed rewards, agreement with the backtest, vectorization,
auto-reset, seeding and the gymnasium wrapper."""

from __future__ import annotations

import warnings
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from foxhunt.assets import AssetSpec
from foxhunt.evaluation import backtest
from foxhunt.trading.env import TradingEnv, TradingGymEnv, make_gym_vector_env

CONF_ASSET = Path(__file__).resolve().parents[2] / "conf" / "asset"


def load_asset(key: str) -> AssetSpec:
    raw = OmegaConf.to_container(OmegaConf.load(CONF_ASSET / f"{key}.yaml"))
    return AssetSpec(**{k: v for k, v in raw.items() if k != "_target_"})


ASSETS = {key: load_asset(key) for key in ("es", "nq", "6e", "zn")}
ES = ASSETS["es"]  # tick 0.25, multiplier 50, tick value 12.5
# 2 USD commission + 1 tick slippage = 14.5 USD = 1.16 ticks per contract traded.
COMMISSION, SLIPPAGE = 2.0, 1.0
CLOSE5 = torch.tensor([100.00, 100.50, 100.25, 101.00, 100.75], dtype=torch.float64)
FEATURES5 = torch.arange(10, dtype=torch.float32).reshape(5, 2)
SHORT, FLAT, LONG = 0, 1, 2


def make_env(features, close, num_envs=1, episode_len=3, seed=0, **kwargs) -> TradingEnv:
    return TradingEnv(
        features,
        close,
        ES,
        num_envs=num_envs,
        episode_len=episode_len,
        commission_usd=COMMISSION,
        slippage_ticks=SLIPPAGE,
        seed=seed,
        **kwargs,
    )


def random_series(num_bars: int, num_features: int = 3, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(num_bars, num_features, generator=gen)
    ticks = torch.randint(-3, 4, (num_bars,), generator=gen).cumsum(0)
    close = ES.price_level + ES.tick_size * ticks.to(torch.float64)
    return features, close


def test_rewards_on_a_hand_built_series():
    env = TradingEnv.sequential(FEATURES5, CLOSE5, ES, COMMISSION, SLIPPAGE)
    env.reset()
    rewards, pnls = [], []
    for action in (LONG, LONG, SHORT, FLAT):
        _, reward, _, _, info = env.step(torch.tensor([action]))
        rewards.append(reward.item())
        pnls.append(info["pnl_usd"].item())
    # step 0: long from flat, price +2 ticks, cost 1.16 -> 0.84
    # step 1: hold long, price -1 tick                 -> -1.0
    # step 2: flip to short (2 contracts), price +3    -> -3 - 2.32 = -5.32
    # step 3: flatten (1 contract), no exposure         -> -1.16
    np.testing.assert_allclose(rewards, [0.84, -1.0, -5.32, -1.16], rtol=1e-6)
    np.testing.assert_allclose(pnls, [10.5, -12.5, -66.5, -14.5], rtol=1e-12)


def test_reward_matches_contract_formula_on_other_assets():
    zn = ASSETS["zn"]  # tick 1/64, tick value 15.625
    close = torch.tensor([110.0, 110.0 + 3 / 64, 110.0 + 1 / 64])
    env = TradingEnv(FEATURES5[:3], close, zn, num_envs=1, episode_len=2, commission_usd=1.25, slippage_ticks=0.5, seed=0)
    env.reset()
    _, r0, *_ = env.step(torch.tensor([SHORT]))
    _, r1, *_ = env.step(torch.tensor([LONG]))
    cost_ticks = 1.25 / 15.625 + 0.5  # 0.58
    assert r0.item() == pytest.approx(-3 - cost_ticks, rel=1e-6)
    assert r1.item() == pytest.approx(-2 - 2 * cost_ticks, rel=1e-6)


def test_observation_is_features_then_position():
    env = make_env(FEATURES5, CLOSE5, num_envs=2, episode_len=3)
    assert env.observation_dim == 3
    assert env.num_actions == 3
    obs = env.reset(starts=torch.tensor([0, 1]))
    assert obs.dtype == torch.float32 and obs.shape == (2, 3)
    torch.testing.assert_close(obs, torch.tensor([[0.0, 1.0, 0.0], [2.0, 3.0, 0.0]]))
    obs, *_ = env.step(torch.tensor([LONG, SHORT]))
    torch.testing.assert_close(obs, torch.tensor([[2.0, 3.0, 1.0], [4.0, 5.0, -1.0]]))
    obs, *_ = env.step(torch.tensor([FLAT, SHORT]))
    torch.testing.assert_close(obs, torch.tensor([[4.0, 5.0, 0.0], [6.0, 7.0, -1.0]]))
    torch.testing.assert_close(env.position, torch.tensor([0, -1]))
    torch.testing.assert_close(env.bar, torch.tensor([2, 3]))


@settings(max_examples=60, deadline=None)
@given(
    key=st.sampled_from(sorted(ASSETS)),
    moves=st.lists(st.integers(-20, 20), min_size=1, max_size=40),
    data=st.data(),
    commission=st.sampled_from([0.0, 0.62, 2.5]),
    slippage=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
)
def test_env_reward_sums_to_backtest_pnl(key, moves, data, commission, slippage):
    asset = ASSETS[key]
    ticks = np.concatenate(([0], np.cumsum(moves)))
    close = asset.round_to_tick(asset.price_level + asset.tick_size * ticks)
    num_bars = len(close)
    positions = np.array(data.draw(st.lists(st.sampled_from([-1, 0, 1]), min_size=num_bars, max_size=num_bars)))
    timestamps = np.datetime64("2024-03-04T14:30") + np.arange(num_bars) * np.timedelta64(1, "m")
    features = torch.zeros(num_bars, 2)

    env = TradingEnv.sequential(features, torch.from_numpy(close), asset, commission, slippage)
    env.reset()
    rewards, pnls, held = [], [], []
    for t in range(num_bars - 1):
        _, reward, terminated, truncated, info = env.step(torch.tensor([positions[t] + 1]))
        rewards.append(reward.item())
        pnls.append(info["pnl_usd"].item())
        held.append(info["position"].item())
        assert not terminated.item()
        assert truncated.item() == (t == num_bars - 2)

    result = backtest(positions, close, timestamps, asset, commission, slippage, bars_per_year=1e5)
    np.testing.assert_array_equal(held, positions[:-1])
    np.testing.assert_allclose(pnls, result.pnl, rtol=1e-12, atol=1e-9)
    scale = max(1.0, float(np.abs(rewards).sum()))
    assert sum(rewards) == pytest.approx(result.metrics["pnl"] / asset.tick_value, abs=1e-5 * scale)


def test_vectorized_envs_equal_single_envs_with_the_same_starts():
    features, close = random_series(60)
    starts = [0, 7, 31, 45]
    episode_len = 12
    gen = torch.Generator().manual_seed(1)
    actions = torch.randint(0, 3, (episode_len, len(starts)), generator=gen)

    batch = make_env(features, close, num_envs=len(starts), episode_len=episode_len)
    batch_obs = [batch.reset(starts=torch.tensor(starts))]
    batch_rewards = []
    for step in range(episode_len):
        obs, reward, _, truncated, info = batch.step(actions[step])
        batch_obs.append(info["final_obs"])
        batch_rewards.append(reward)
    assert truncated.all()

    for i, start in enumerate(starts):
        single = make_env(features, close, num_envs=1, episode_len=episode_len, seed=99)
        obs = single.reset(starts=torch.tensor([start]))
        torch.testing.assert_close(obs[0], batch_obs[0][i])
        for step in range(episode_len):
            _, reward, _, _, info = single.step(actions[step, i : i + 1])
            torch.testing.assert_close(reward[0], batch_rewards[step][i])
            torch.testing.assert_close(info["final_obs"][0], batch_obs[step + 1][i])


def test_auto_reset_returns_new_episode_and_final_obs():
    features, close = random_series(40)
    env = make_env(features, close, num_envs=3, episode_len=4, seed=5)
    obs = env.reset(starts=torch.tensor([0, 10, 35]))
    assert env.max_start == 35
    for step in range(4):
        obs, reward, terminated, truncated, info = env.step(torch.tensor([LONG, SHORT, FLAT]))
        assert not terminated.any()
        assert truncated.tolist() == [step == 3] * 3
        if step < 3:
            torch.testing.assert_close(info["final_obs"], obs)
    # The finished episodes ended on bars 4, 14, 39 holding long, short, flat.
    expected_final = torch.cat([features[[4, 14, 39]], torch.tensor([[1.0], [-1.0], [0.0]])], 1)
    torch.testing.assert_close(info["final_obs"], expected_final)
    torch.testing.assert_close(info["position"], torch.tensor([1, -1, 0]))
    torch.testing.assert_close(info["bar"], torch.tensor([3, 13, 38]))
    # The returned observation starts new, flat episodes at freshly drawn bars.
    new_bars = env.bar
    assert ((new_bars >= 0) & (new_bars <= env.max_start)).all()
    torch.testing.assert_close(obs[:, :3], features[new_bars])
    torch.testing.assert_close(obs[:, 3], torch.zeros(3))
    torch.testing.assert_close(env.position, torch.zeros(3, dtype=torch.int64))
    # ...and they run a full episode again.
    for step in range(4):
        _, _, _, truncated, _ = env.step(torch.tensor([FLAT] * 3))
        assert truncated.tolist() == [step == 3] * 3


def test_starts_cover_the_whole_allowed_range():
    features, close = random_series(8)
    env = make_env(features, close, num_envs=2000, episode_len=4, seed=3)
    env.reset()
    assert env.max_start == 3
    assert sorted(env.bar.unique().tolist()) == [0, 1, 2, 3]


def test_seeding_is_deterministic():
    features, close = random_series(500)

    def trajectory(seed: int) -> list[torch.Tensor]:
        env = make_env(features, close, num_envs=4, episode_len=5, seed=seed)
        out = [env.reset()]
        for step in range(12):
            out.append(env.step(torch.full((4,), step % 3))[0])
        return out

    first, again, other = trajectory(7), trajectory(7), trajectory(8)
    for a, b in zip(first, again):
        torch.testing.assert_close(a, b)
    assert not all(torch.equal(a, b) for a, b in zip(first, other))
    # reset(seed=...) re-seeds an existing environment.
    env = make_env(features, close, num_envs=4, episode_len=5, seed=0)
    torch.testing.assert_close(env.reset(seed=7), first[0])


def test_sequential_walks_the_split_once():
    features, close = random_series(10)
    env = TradingEnv.sequential(features, close, ES, COMMISSION, SLIPPAGE)
    assert env.episode_len == 9 and env.num_envs == 1
    obs = env.reset()
    torch.testing.assert_close(obs[0, :3], features[0])
    for t in range(9):
        obs, _, _, truncated, info = env.step(torch.tensor([LONG]))
        assert info["bar"].item() == t
        assert truncated.item() == (t == 8)
    torch.testing.assert_close(obs[0], torch.cat([features[9], torch.tensor([1.0])]))
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(torch.tensor([LONG]))


@pytest.mark.parametrize(
    ("actions", "message"),
    [
        (torch.tensor([3]), "must be 0"),
        (torch.tensor([-1]), "must be 0"),
        (torch.tensor([1.0]), "integer tensor"),
        (torch.tensor([1, 1]), r"shape \(1,\)"),
    ],
)
def test_bad_actions_raise(actions, message):
    env = make_env(FEATURES5, CLOSE5)
    env.reset()
    with pytest.raises(ValueError, match=message):
        env.step(actions)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"episode_len": 5}, r"episode_len=5: must be an integer in \[1, 4\]"),
        ({"num_envs": 0}, "num_envs=0"),
        ({"close": torch.tensor([1.0, 2.0, float("nan"), 1.0, 1.0])}, r"close\[2\]=nan"),
        ({"close": CLOSE5[:4]}, r"close: expected shape \(5,\)"),
        ({"commission_usd": -1.0}, "commission_usd=-1.0"),
    ],
)
def test_bad_construction_raises(kwargs, message):
    args = {
        "features": FEATURES5,
        "close": CLOSE5,
        "asset": ES,
        "num_envs": 1,
        "episode_len": 3,
        "commission_usd": COMMISSION,
        "slippage_ticks": SLIPPAGE,
        "seed": 0,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        TradingEnv(**args)


def test_step_before_reset_raises():
    with pytest.raises(RuntimeError, match="call reset"):
        make_env(FEATURES5, CLOSE5).step(torch.tensor([FLAT]))


def test_gym_wrapper_passes_check_env_without_warnings():
    features, close = random_series(50)
    features[:, 0] = 0.5  # a constant (static) column must not give a degenerate box
    gym_env = TradingGymEnv(make_env(features, close, episode_len=10))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(gym_env, skip_render_check=True)
    assert gym_env.observation_space.shape == (4,)
    assert gym_env.action_space == gymnasium.spaces.Discrete(3)


def test_gym_wrapper_episode():
    features, close = random_series(30)
    gym_env = TradingGymEnv(make_env(features, close, episode_len=5))
    obs, info = gym_env.reset(seed=11)
    assert obs.dtype == np.float32 and obs in gym_env.observation_space
    for step in range(5):
        obs, reward, terminated, truncated, info = gym_env.step(LONG)
        assert isinstance(reward, float) and not terminated
        assert truncated == (step == 4)
        assert info["position"] == 1
        assert obs[-1] == 1.0  # the final observation, not the next episode's
    with pytest.raises(ValueError, match="num_envs=2"):
        TradingGymEnv(make_env(features, close, num_envs=2))


def test_gym_vector_env_steps():
    features, close = random_series(30)
    vec = make_gym_vector_env(
        features, close, ES, num_envs=3, episode_len=5, commission_usd=COMMISSION, slippage_ticks=SLIPPAGE, seed=0
    )
    obs, _ = vec.reset(seed=0)
    assert obs.shape == (3, 4) and obs.dtype == np.float32
    obs, reward, terminated, truncated, _ = vec.step(np.array([LONG, FLAT, SHORT]))
    assert reward.shape == (3,) and reward[1] == 0.0
    np.testing.assert_array_equal(obs[:, -1], [1.0, 0.0, -1.0])
    vec.close()
