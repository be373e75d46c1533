"""PPO agent: GAE and the clipped objective against hand-computed cases, initialization, a
short fit, and learning a planted pattern."""

from __future__ import annotations

import math
import time

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
    planted_dataset,
    random_dataset,
    single_torch_thread,  # noqa: F401  (autouse fixture)
)
from torch import nn

from foxhunt.models.agent import walk_rewards
from foxhunt.models.ppo import clipped_surrogate_loss, compute_gae


def test_gae_hand_computed_with_a_termination_and_a_truncation():
    gamma, lam = 0.9, 0.8
    # env 0: terminated at step 1, truncated at step 2 (bootstraps from V(final_obs) = 10);
    # env 1: no episode end, bootstraps from next_value at the end of the rollout.
    rewards = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [4.0, 1.0]])
    values = torch.tensor([[0.5, 0.0], [1.0, 0.0], [1.5, 0.0], [2.0, 0.0]])
    terminated = torch.tensor([[False, False], [True, False], [False, False], [False, False]])
    truncated = torch.tensor([[False, False], [False, False], [True, False], [False, False]])
    # 99 where no truncation happened: must be ignored (env 0 step 1 is terminal, not cut)
    final_values = torch.tensor([[99.0, 99.0], [99.0, 99.0], [10.0, 99.0], [99.0, 99.0]])
    next_value = torch.tensor([5.0, 2.0])
    advantages, returns = compute_gae(rewards, values, terminated, truncated, final_values, next_value, gamma, lam)
    # env 0, backwards:
    #   t=3: delta = 4 + 0.9 * 5 - 2.0 = 6.5                       A = 6.5
    #   t=2: truncated: delta = 3 + 0.9 * 10 - 1.5 = 10.5, no carry A = 10.5
    #   t=1: terminated: delta = 2 + 0 - 1.0 = 1.0, no carry         A = 1.0
    #   t=0: delta = 1 + 0.9 * 1.0 - 0.5 = 1.4;  A = 1.4 + 0.72 * 1.0 = 2.12
    # env 1: t=3: delta = 1 + 0.9 * 2 = 2.8; then A = 0.72 * A_next (all other deltas are 0)
    expected = torch.tensor([[2.12, 0.72**3 * 2.8], [1.0, 0.72**2 * 2.8], [10.5, 0.72 * 2.8], [6.5, 2.8]])
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected + values)


def test_gae_shape_mismatch_is_rejected():
    ones = torch.ones(3, 2)
    flags = torch.zeros(3, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="compute_gae"):
        compute_gae(ones, ones, flags, flags, ones, torch.ones(3), 0.99, 0.95)


def test_clipped_surrogate_hand_computed():
    clip = 0.2
    ratio = torch.tensor([1.1, 1.5, 0.5, 0.5, 1.5])
    advantages = torch.tensor([1.0, 2.0, 1.0, -1.0, -1.0])
    old_logprob = torch.tensor([-1.0, -0.5, -2.0, -0.3, -1.2])
    new_logprob = (old_logprob + torch.log(ratio)).requires_grad_(True)
    loss = clipped_surrogate_loss(new_logprob, old_logprob, advantages, clip)
    # per sample min(ratio * A, clip(ratio) * A):
    #   1.1 inside the range, A>0:           1.1
    #   1.5 above 1.2, A>0: clipped          1.2 * 2 = 2.4
    #   0.5 below 0.8, A>0: unclipped        0.5 (pessimistic bound)
    #   0.5 below 0.8, A<0: clipped          0.8 * -1 = -0.8
    #   1.5 above 1.2, A<0: unclipped        -1.5
    # loss = -mean = -(1.1 + 2.4 + 0.5 - 0.8 - 1.5) / 5 = -0.34
    torch.testing.assert_close(loss, torch.tensor(-0.34))
    loss.backward()
    # d loss / d new_logprob = -A * ratio / 5 where unclipped, 0 where clipped
    torch.testing.assert_close(new_logprob.grad, torch.tensor([-0.22, 0.0, -0.1, 0.0, 0.3]))


def test_networks_are_separate_and_orthogonally_initialized():
    agent = build_agent(model_config("ppo", seed=0))
    policy = [m for m in agent.policy_net if isinstance(m, nn.Linear)]
    value = [m for m in agent.value_net if isinstance(m, nn.Linear)]
    assert [m.out_features for m in policy] == [256, 256, 3]
    assert [m.out_features for m in value] == [256, 256, 1]
    assert policy[0].in_features == value[0].in_features == 17
    first = policy[0].weight  # (256, 17), orthogonal columns with gain sqrt(2)
    torch.testing.assert_close(first.T @ first, 2.0 * torch.eye(17), atol=1e-4, rtol=0)
    head = policy[-1].weight  # (3, 256), orthonormal rows with gain 0.01
    torch.testing.assert_close(head @ head.T, 1e-4 * torch.eye(3), atol=1e-8, rtol=0)
    value_head = value[-1].weight  # (1, 256), gain 1
    assert float(value_head.detach().norm()) == pytest.approx(1.0, rel=1e-5)
    assert all(float(m.bias.detach().abs().max()) == 0.0 for m in policy + value)
    optimizer = agent.configure_optimizers()  # one Adam, a parameter group per network
    policy_group, value_group = optimizer.param_groups
    assert policy_group["lr"] == 3e-4 and value_group["lr"] == 1e-3
    assert policy_group["eps"] == value_group["eps"] == 1e-5
    assert {id(p) for p in policy_group["params"]} == {id(p) for p in agent.policy_net.parameters()}
    assert {id(p) for p in value_group["params"]} == {id(p) for p in agent.value_net.parameters()}


def test_each_network_is_clipped_by_its_own_norm_before_every_step():
    dataset = random_dataset(seed=2)
    cfg = model_config("ppo", seed=0, max_grad_norm=1e-3, env={"steps_per_epoch": 1, "episode_len": 5})
    agent = build_agent(cfg)
    seen = []
    original = agent.clip_update_gradients  # the one clipping, through Lightning's wrapper or a direct update

    def record(optimizer):
        original(optimizer)
        seen.append(
            [torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in g["params"]])).item() for g in optimizer.param_groups]
        )

    agent.clip_update_gradients = record
    cpu_trainer(max_steps=20).fit(agent, datamodule=env_datamodule(dataset, cfg))
    assert len(seen) == 20  # one optimizer step per minibatch
    for policy_norm, value_norm in seen:  # each group at most max_grad_norm on its own
        assert policy_norm <= 1e-3 * (1 + 1e-4) and value_norm <= 1e-3 * (1 + 1e-4)
    assert any(value_norm > 0.9e-3 for _, value_norm in seen)  # clipped to the bound, not zeroed


def test_config_rollout_batch_and_minibatches():
    cfg = model_config("ppo", seed=0)
    assert cfg.env.num_envs * cfg.module.rollout_steps == 64
    assert cfg.module.minibatch_size == 32 and cfg.module.update_epochs == 10
    # hydra wraps the constructor's ValueError in an InstantiationException; the message stays
    with pytest.raises(Exception, match="minibatch_size=30: must divide"):
        build_agent(model_config("ppo", seed=0, minibatch_size=30))


def test_short_fit_logs_finite_metrics():
    dataset = random_dataset(seed=1)
    cfg = model_config("ppo", seed=0, env={"steps_per_epoch": 2, "episode_len": 5})
    agent = build_agent(cfg)
    datamodule = env_datamodule(dataset, cfg)
    steps_per_rollout = 10 * (64 // 32)  # 10 epochs x 2 minibatches, one optimizer step each
    trainer = cpu_trainer(max_steps=3 * steps_per_rollout)
    calls = []
    original = agent.collect_rollout
    agent.collect_rollout = lambda: calls.append(1) or original()
    trainer.fit(agent, datamodule=datamodule)
    assert trainer.global_step == 3 * steps_per_rollout
    assert len(calls) == 3
    metrics = trainer.callback_metrics
    for key in (
        "train/loss",
        "train/policy_loss",
        "train/value_loss",
        "train/entropy",
        "train/approx_kl",
        "train/clip_fraction",
        "train/explained_variance",
        "train/env_steps_per_s",
        "train/episode_reward",
        "val/mean_reward",
        "val/env_pnl_usd",
    ):
        assert key in metrics, key
        assert math.isfinite(float(metrics[key])), key
    assert 0.0 < float(metrics["train/entropy"]) <= math.log(3) + 1e-6

    result = trainer.test(agent, datamodule=datamodule, verbose=False)[0]
    positions = agent.trading_positions(datamodule, "test")
    close = dataset.splits["test"].close
    assert positions.shape == close.shape and positions[-1] == 0
    reward, pnl = walk_rewards(positions, close, dataset.asset, COMMISSION_USD, SLIPPAGE_TICKS)
    assert result["test/mean_reward"] == pytest.approx(reward.mean(), rel=1e-5)
    assert result["test/env_pnl_usd"] == pytest.approx(pnl.sum(), rel=1e-5)


LEARNING_SEEDS = [0, 1, 2]
LEARNING_ROLLOUTS = 30  # training steps (64 env steps each)
MARGIN_TICKS = 0.5  # required edge per step over the random and the flat policy


@pytest.mark.parametrize("seed", LEARNING_SEEDS)
def test_learns_a_planted_pattern(seed):
    torch.manual_seed(seed)
    dataset = planted_dataset(seed)
    cfg = model_config("ppo", seed=seed)
    agent = build_agent(cfg)
    datamodule = env_datamodule(dataset, cfg)
    steps_per_rollout = 2 * cfg.module.update_epochs * (64 // cfg.module.minibatch_size)
    trainer = cpu_trainer(max_steps=LEARNING_ROLLOUTS * steps_per_rollout, limit_val_batches=0)
    start = time.perf_counter()
    trainer.fit(agent, datamodule=datamodule)
    seconds = time.perf_counter() - start

    test = dataset.splits["test"]
    greedy = agent.trading_positions(datamodule, "test")
    greedy_reward = walk_rewards(greedy, test.close, dataset.asset, COMMISSION_USD, SLIPPAGE_TICKS)[0].mean()
    rng = np.random.default_rng(seed)
    random_positions = rng.integers(-1, 2, len(test.close))
    random_reward = walk_rewards(random_positions, test.close, dataset.asset, COMMISSION_USD, SLIPPAGE_TICKS)[0].mean()
    flat_reward = 0.0
    print(
        f"ppo seed {seed}: greedy {greedy_reward:.3f} ticks/step, random {random_reward:.3f}, "
        f"flat {flat_reward:.3f}, fit {seconds:.1f} s"
    )
    assert greedy_reward > random_reward + MARGIN_TICKS
    assert greedy_reward > flat_reward + MARGIN_TICKS
