"""Shared agent machinery (foxhunt.models.agent): MLP builder, greedy walk, walk rewards."""

from __future__ import annotations

import typing

import numpy as np
import pytest
import torch
from agent_data import (
    COMMISSION_USD,
    SLIPPAGE_TICKS,
    build_agent,
    cpu_trainer,
    env_datamodule,
    model_config,
    random_dataset,
    single_torch_thread,  # noqa: F401  (autouse fixture)
)
from torch import nn

from foxhunt.models.agent import ACTIVATIONS, Activation, build_mlp, walk_positions, walk_rewards
from foxhunt.trading.env import TradingEnv


def test_build_mlp_layers_and_shapes():
    mlp = build_mlp(17, [8, 4], 3, "tanh")
    kinds = [type(m) for m in mlp]
    assert kinds == [nn.Linear, nn.Tanh, nn.Linear, nn.Tanh, nn.Linear]
    assert [m.out_features for m in mlp if isinstance(m, nn.Linear)] == [8, 4, 3]
    assert mlp(torch.zeros(5, 17)).shape == (5, 3)
    assert [type(m) for m in build_mlp(17, [], 3, "relu")] == [nn.Linear]


def test_the_agents_activations_are_those_build_mlp_builds():
    """The definition's choices (Activation) and build_mlp's layers (ACTIVATIONS) name the same
    activations: a name added to one only is found here."""
    assert typing.get_args(Activation) == tuple(ACTIVATIONS)
    for name in ACTIVATIONS:
        assert type(build_mlp(17, [8], 3, name)[1]) is ACTIVATIONS[name]


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_the_mlp_computes_what_its_layers_compute_as_modules(activation):
    """MLP calls its layers' forward directly: the same outputs and gradients, bit for bit, as
    torch's Sequential over the same layers."""
    torch.manual_seed(0)
    mlp = build_mlp(17, [32, 16], 3, activation)
    plain = nn.Sequential(*mlp)
    x = torch.randn(9, 17)
    out, reference = mlp(x), plain(x)
    assert torch.equal(out, reference)
    grads = torch.autograd.grad(out.square().sum(), list(mlp.parameters()))
    reference_grads = torch.autograd.grad(reference.square().sum(), list(plain.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(grads, reference_grads))


def test_the_mlp_runs_every_hook_a_module_call_runs():
    """A hook on a layer or a global module hook (a profiler's, a memory probe's) sees each layer
    called as a module: the direct calls are taken only where no hook is registered."""
    mlp = build_mlp(17, [8], 3, "relu")
    seen: list[str] = []
    handle = mlp[0].register_forward_hook(lambda module, args, out: seen.append("layer"))
    mlp(torch.zeros(2, 17))
    assert seen == ["layer"]
    handle.remove()
    handle = nn.modules.module.register_module_forward_hook(lambda module, args, out: seen.append(type(module).__name__))
    try:
        mlp(torch.zeros(2, 17))
    finally:
        handle.remove()
    assert seen == ["layer", "Linear", "ReLU", "Linear", "MLP"]
    mlp(torch.zeros(2, 17))
    assert len(seen) == 5  # removed: none runs


def test_walk_positions_follows_the_held_position():
    # columns: greedy action while holding -1, 0, +1
    table = np.array(
        [
            [0, 2, 1],  # bar 0, flat -> long (2)
            [0, 0, 1],  # bar 1, long -> flat (1)
            [0, 0, 2],  # bar 2, flat -> short (0)
            [1, 2, 2],  # bar 3, short -> flat (1)
            [2, 2, 2],  # bar 4: last bar, no decision
        ]
    )
    np.testing.assert_array_equal(walk_positions(table), [1, 0, -1, 0, 0])


def test_walk_rewards_match_the_env_stepped_bar_by_bar():
    dataset = random_dataset(seed=3, split_bars=(60, 30, 30))
    split = dataset.splits["val"]
    rng = np.random.default_rng(0)
    positions = rng.integers(-1, 2, len(split.close))
    positions[-1] = 0
    reward, pnl = walk_rewards(positions, split.close, dataset.asset, COMMISSION_USD, SLIPPAGE_TICKS)
    env = TradingEnv.sequential(
        torch.from_numpy(split.features),
        torch.from_numpy(split.close),
        dataset.asset,
        COMMISSION_USD,
        SLIPPAGE_TICKS,
    )
    env.reset()
    env_reward, env_pnl = [], []
    for t in range(len(split.close) - 1):
        _, r, _, _, info = env.step(torch.tensor([positions[t] + 1]))
        env_reward.append(float(r[0]))
        env_pnl.append(float(info["pnl_usd"][0]))
    np.testing.assert_allclose(reward, env_reward, rtol=1e-6, atol=1e-5)
    np.testing.assert_array_equal(pnl, env_pnl)  # one formula (foxhunt.trading.pnl): equal to the last bit
    assert np.any(np.abs(pnl) > 0) and np.any(np.diff(positions) != 0)


@pytest.mark.parametrize("name", ["dqn", "ppo"])
def test_greedy_positions_equal_a_step_by_step_walk_of_the_env(name):
    torch.manual_seed(0)
    dataset = random_dataset(seed=4, split_bars=(60, 200, 30))
    agent = build_agent(model_config(name, seed=0))
    # Make the policy depend strongly on the position column so that the walk matters.
    with torch.no_grad():
        first = next(m for m in agent.modules() if isinstance(m, nn.Linear))
        first.weight[:, -1] *= 50.0
    split = dataset.splits["val"]
    positions = agent.greedy_positions(split.features)

    env = TradingEnv.sequential(
        torch.from_numpy(split.features),
        torch.from_numpy(split.close),
        dataset.asset,
        COMMISSION_USD,
        SLIPPAGE_TICKS,
    )
    obs = env.reset()
    expected = []
    with torch.no_grad():
        for _ in range(len(split.close) - 1):
            action = agent.greedy_action(obs)
            obs, _, _, _, info = env.step(action)
            expected.append(int(info["position"][0]))
    expected.append(0)
    assert positions.shape == (len(split.close),)
    np.testing.assert_array_equal(positions, expected)
    assert len(set(expected)) > 1  # the walk is not trivially constant


@pytest.mark.parametrize("name", ["dqn", "ppo"])
def test_state_dim_mismatch_is_a_clear_error(name):
    dataset = random_dataset(seed=5)
    cfg = model_config(name, seed=0, state_dim=15)
    agent = build_agent(cfg)
    with pytest.raises(ValueError, match=r"state_dim=15.*observation_dim is 17"):
        cpu_trainer(max_steps=1).fit(agent, datamodule=env_datamodule(dataset, cfg))


@pytest.mark.parametrize("name", ["dqn", "ppo"])
def test_an_agents_typed_hyperparameters_are_those_it_was_built_with(name):
    """``agent.hp``, the values as the family's definition types them, holds what Lightning saves
    as the agent's hparams (what a checkpoint rebuilds it from)."""
    agent = build_agent(model_config(name, seed=4, gamma=0.9))
    assert type(agent.hp) is agent.hyperparameters
    assert agent.hp.model_dump() == dict(agent.hparams)
    assert agent.hp.gamma == 0.9 and agent.hp.seed == 4


@pytest.mark.parametrize("name", ["dqn", "ppo"])
def test_an_agent_stepped_before_its_fit_starts_names_what_builds_its_state(name):
    """The training envs come from setup('fit'), their observation (and DQN's replay buffer) from
    on_train_start: an agent stepped without them says which was skipped."""
    cfg = model_config(name, seed=0, env={"episode_len": 20})
    agent = build_agent(cfg)
    with pytest.raises(RuntimeError, match=r"no training env; setup\('fit'\) builds it"):
        agent.on_train_start()
    datamodule = env_datamodule(random_dataset(seed=7, split_bars=(60, 30, 30)), cfg)
    datamodule.setup("fit")
    agent = build_agent(cfg)
    agent.train_env = datamodule.make_env("train", num_envs=agent.num_envs, seed=agent.seed)
    step = (lambda: agent.collect_step(0.5)) if name == "dqn" else agent.collect_rollout
    with pytest.raises(RuntimeError, match="no observation of the training envs; on_train_start resets them"):
        step()
    if name == "dqn":
        with pytest.raises(RuntimeError, match="no replay buffer; on_train_start builds it"):
            agent.agent_state()
    agent.on_train_start()
    step()  # steps once the fit's start built its state


def test_agents_declare_the_monitor_metric():
    from foxhunt.models.dqn import DQNAgent
    from foxhunt.models.ppo import PPOAgent

    for cls in (DQNAgent, PPOAgent):
        assert cls.monitor_metric == "val/mean_reward"
        assert cls.monitor_mode == "max"


@pytest.mark.parametrize("name", ["dqn", "ppo"])
def test_checkpoint_loads_weights_only_and_resumes(name, tmp_path):
    dataset = random_dataset(seed=6)
    cfg = model_config(name, seed=0, env={"steps_per_epoch": 3, "episode_len": 20})
    steps = 3 if name == "dqn" else 40  # PPO: 40 optimizer steps per training step
    agent = build_agent(cfg)
    datamodule = env_datamodule(dataset, cfg)
    trainer = cpu_trainer(max_steps=steps, limit_val_batches=0)
    trainer.fit(agent, datamodule=datamodule)
    path = tmp_path / f"{name}.ckpt"
    trainer.save_checkpoint(path)

    checkpoint = torch.load(path, weights_only=True)
    restored = build_agent(cfg)
    restored.load_state_dict(checkpoint["state_dict"])
    np.testing.assert_array_equal(restored.trading_positions(datamodule, "val"), agent.trading_positions(datamodule, "val"))

    resumed = build_agent(cfg)
    trainer = cpu_trainer(max_steps=2 * steps, limit_val_batches=0)
    trainer.fit(resumed, datamodule=datamodule, ckpt_path=path)
    assert trainer.global_step == 2 * steps
