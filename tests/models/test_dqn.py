"""DQN agent: double-DQN targets, replay buffer, epsilon schedule, target updates, a short
fit, and learning a planted pattern."""

from __future__ import annotations

import math
import time

import lightning.pytorch as L
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
from lightning.pytorch.loggers.logger import Logger

from foxhunt.models.agent import walk_rewards
from foxhunt.models.dqn import ReplayBuffer, double_dqn_loss, double_dqn_targets, epsilon_at


def test_double_dqn_target_hand_computed():
    rewards = torch.tensor([1.0, -0.5, 2.0])
    dones = torch.tensor([0.0, 0.0, 1.0])
    next_q_online = torch.tensor([[1.0, 3.0, 2.0], [5.0, 0.0, 1.0], [0.0, 0.0, 9.0]])
    next_q_target = torch.tensor([[10.0, 20.0, 30.0], [7.0, 8.0, 9.0], [1.0, 2.0, 3.0]])
    targets = double_dqn_targets(rewards, dones, next_q_online, next_q_target, gamma=0.9)
    # online argmax = [1, 0, 2]; target net evaluates it: [20, 7, (3, masked by done)]
    # (plain DQN would take the target's own max [30, 9, 3] and give [28, 7.6, 2])
    torch.testing.assert_close(targets, torch.tensor([1.0 + 0.9 * 20.0, -0.5 + 0.9 * 7.0, 2.0]))


def _transitions(values, obs_dim=2):
    values = torch.as_tensor(values, dtype=torch.float32)
    n = values.shape[0]
    return (
        values.unsqueeze(1).repeat(1, obs_dim),
        values.to(torch.int64) % 3,
        values,
        values.unsqueeze(1).repeat(1, obs_dim) + 0.5,
        torch.zeros(n),
    )


def test_replay_buffer_wraps_at_capacity():
    buffer = ReplayBuffer(capacity=5, obs_dim=2, device="cpu", seed=0)
    buffer.add(*_transitions([0, 1, 2]))
    assert len(buffer) == 3 and buffer.cursor == 3
    buffer.add(*_transitions([3, 4, 5, 6]))
    assert len(buffer) == 5 and buffer.cursor == 2
    # items 5 and 6 overwrote the oldest slots 0 and 1
    torch.testing.assert_close(buffer.rewards, torch.tensor([5.0, 6.0, 2.0, 3.0, 4.0]))
    torch.testing.assert_close(buffer.obs[:, 0], torch.tensor([5.0, 6.0, 2.0, 3.0, 4.0]))
    torch.testing.assert_close(buffer.next_obs[:, 1], torch.tensor([5.5, 6.5, 2.5, 3.5, 4.5]))
    with pytest.raises(ValueError, match="exceed the capacity 5"):
        buffer.add(*_transitions(range(6)))


def test_replay_buffer_samples_only_filled_slots_uniformly_and_reproducibly():
    buffer = ReplayBuffer(capacity=100, obs_dim=2, device="cpu", seed=7)
    buffer.add(*_transitions([1, 2, 3]))  # slots 3..99 are zeros
    sample = buffer.sample(3000)
    values, counts = torch.unique(sample.rewards, return_counts=True)
    assert values.tolist() == [1.0, 2.0, 3.0]
    assert all(900 < c < 1100 for c in counts.tolist())  # uniform: 1000 each, sd ~26
    torch.testing.assert_close(sample.next_obs[:, 0], sample.rewards + 0.5)  # rows stay aligned
    again = ReplayBuffer(capacity=100, obs_dim=2, device="cpu", seed=7)
    again.add(*_transitions([1, 2, 3]))
    torch.testing.assert_close(again.sample(3000).rewards, sample.rewards)


def test_epsilon_schedule_values():
    cfg = model_config("dqn", seed=0).module

    def eps(step):
        return epsilon_at(step, cfg.epsilon_start, cfg.epsilon_end, cfg.epsilon_decay)

    assert eps(0) == 1.0
    assert eps(1) == pytest.approx(0.995, abs=1e-15)
    assert eps(100) == pytest.approx(0.6057704364907279, rel=1e-12)
    assert eps(918) == pytest.approx(0.010036634861955126, rel=1e-12)  # last step above the floor
    assert eps(919) == 0.01
    assert eps(10**6) == 0.01
    agent = build_agent(model_config("dqn", seed=0))
    assert agent.epsilon(100) == eps(100)


def test_target_network_updated_exactly_every_interval():
    torch.manual_seed(0)
    agent = build_agent(model_config("dqn", seed=0))
    assert agent.hparams.target_update_interval == 100

    def nudge_online():
        with torch.no_grad():
            for p in agent.q_net.parameters():
                p.add_(0.01)

    def same():
        return all(torch.equal(a, b) for a, b in zip(agent.q_net.parameters(), agent.target_net.parameters()))

    updated = []
    for step in range(1, 251):
        nudge_online()
        if agent.maybe_update_target(step):
            updated.append(step)
            assert same()
        else:
            assert not same()
    assert updated == [100, 200]
    assert not any(p.requires_grad for p in agent.target_net.parameters())


def test_short_fit_logs_finite_metrics_and_syncs_the_target():
    dataset = random_dataset(seed=1)
    # 3 training_step calls per epoch x steps_per_call 25 = 75 agent steps: two epochs, the second
    # cut at max_steps (45 agent steps: one call of 20)
    cfg = model_config("dqn", seed=0, env={"steps_per_epoch": 3, "episode_len": 50})
    assert cfg.module.steps_per_call == 25
    agent = build_agent(cfg)
    datamodule = env_datamodule(dataset, cfg)
    syncs = []
    original = agent.maybe_update_target
    agent.maybe_update_target = lambda step: syncs.append(step) if original(step) else None
    trainer = cpu_trainer(max_steps=120)
    trainer.fit(agent, datamodule=datamodule)
    assert trainer.global_step == 120  # steps spent filling the buffer count as well
    metrics = trainer.callback_metrics
    for key in (
        "train/loss",
        "train/q_mean",
        "train/epsilon",
        "train/episode_reward",
        "train/env_steps_per_s",
        "val/mean_reward",
        "val/env_pnl_usd",
    ):
        assert key in metrics, key
        assert math.isfinite(float(metrics[key])), key
    assert float(metrics["train/epsilon"]) == pytest.approx(0.995**119)
    assert syncs == [100]
    # 4 envs x 120 steps went into the buffer
    assert len(agent.replay) == 4 * 120
    assert agent.replay.obs.device == agent.device

    result = trainer.test(agent, datamodule=datamodule, verbose=False)[0]
    assert set(result) == {"test/mean_reward", "test/env_pnl_usd"}
    positions = agent.trading_positions(datamodule, "test")
    close = dataset.splits["test"].close
    assert positions.shape == close.shape and positions[-1] == 0
    assert set(np.unique(positions)) <= {-1, 0, 1}
    reward, pnl = walk_rewards(positions, close, dataset.asset, COMMISSION_USD, SLIPPAGE_TICKS)
    assert result["test/mean_reward"] == pytest.approx(reward.mean(), rel=1e-5)
    assert result["test/env_pnl_usd"] == pytest.approx(pnl.sum(), rel=1e-5)


def test_truncated_transitions_store_final_obs_and_are_not_terminal():
    dataset = random_dataset(seed=2)
    cfg = model_config("dqn", seed=0, env={"episode_len": 5, "steps_per_epoch": 10})
    agent = build_agent(cfg)
    trainer = cpu_trainer(max_steps=10, limit_val_batches=0)
    trainer.fit(agent, datamodule=env_datamodule(dataset, cfg))
    replay = agent.replay
    assert len(replay) == 40
    assert float(replay.dones[:40].sum()) == 0.0  # episodes only truncate
    features = torch.from_numpy(dataset.splits["train"].features)
    # every stored next state is the bar after the state (never an auto-reset start bar),
    # with the position that the action took
    position = replay.actions[:40].to(torch.float32) - 1.0
    torch.testing.assert_close(replay.next_obs[:40, -1], position)
    for i in range(40):
        row = int(torch.nonzero((features == replay.obs[i, :-1]).all(dim=1))[0, 0])
        torch.testing.assert_close(replay.next_obs[i, :-1], features[row + 1])


LEARNING_SEEDS = [0, 1, 2]
LEARNING_STEPS = 300  # training steps (4 env steps each)
MARGIN_TICKS = 0.5  # required edge per step over the random and the flat policy


@pytest.mark.parametrize("seed", LEARNING_SEEDS)
def test_learns_a_planted_pattern(seed):
    torch.manual_seed(seed)
    dataset = planted_dataset(seed)
    cfg = model_config("dqn", seed=seed)
    agent = build_agent(cfg)
    datamodule = env_datamodule(dataset, cfg)
    trainer = cpu_trainer(max_steps=LEARNING_STEPS, limit_val_batches=0)
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
        f"dqn seed {seed}: greedy {greedy_reward:.3f} ticks/step, random {random_reward:.3f}, "
        f"flat {flat_reward:.3f}, fit {seconds:.1f} s"
    )
    assert greedy_reward > random_reward + MARGIN_TICKS
    assert greedy_reward > flat_reward + MARGIN_TICKS


EQUAL_UPDATE_STEPS = 130  # agent steps: 25 filling the buffer (100 / 4 envs), 105 learning, a target sync at 100


def _fit_agent(dataset, steps_per_call: int, max_steps: int = EQUAL_UPDATE_STEPS):
    cfg = model_config("dqn", seed=3, env={"steps_per_epoch": 1000, "episode_len": 30}, steps_per_call=steps_per_call)
    torch.manual_seed(3)
    agent = build_agent(cfg)
    trainer = cpu_trainer(max_steps=max_steps, limit_val_batches=0)
    trainer.fit(agent, datamodule=env_datamodule(dataset, cfg))
    return agent, trainer


def _reference_one_step_loop(dataset, num_steps: int):
    """The algorithm one agent step per iteration, without Lightning: the agent's own acting
    (collect_step), replay, loss, Adam and clipping, the target synced after the step whose
    count is a multiple of the interval. The same initial weights as _fit_agent's."""
    cfg = model_config("dqn", seed=3, env={"steps_per_epoch": 1000, "episode_len": 30}, steps_per_call=1)
    torch.manual_seed(3)
    agent = build_agent(cfg)
    hp = agent.hparams
    datamodule = env_datamodule(dataset, cfg)
    datamodule.setup("fit")
    agent.train_env = datamodule.make_env("train", num_envs=agent.num_envs, seed=agent.seed)
    agent.on_train_start()
    optimizer = agent.configure_optimizers()
    params = list(agent.q_net.parameters())
    for step in range(num_steps):
        agent.collect_step(epsilon_at(step, hp.epsilon_start, hp.epsilon_end, hp.epsilon_decay))
        if len(agent.replay) >= hp.min_replay_size:
            loss, _ = double_dqn_loss(agent.q_net, agent.target_net, agent.replay.sample(hp.batch_size), hp.gamma)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, hp.max_grad_norm)
            optimizer.step()
        if (step + 1) % hp.target_update_interval == 0:
            agent.target_net.load_state_dict(agent.q_net.state_dict())
    return agent


def _assert_same_agent(a, b):
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name
    for field in ("obs", "next_obs", "actions", "rewards", "dones"):
        assert torch.equal(getattr(a.replay, field), getattr(b.replay, field)), field
    assert a.replay.cursor == b.replay.cursor


@pytest.mark.parametrize("steps_per_call", [4, 3])  # 3 does not divide 130: the last call is cut at max_steps
def test_several_agent_steps_per_training_step_take_the_one_step_updates(steps_per_call):
    dataset = random_dataset(seed=4)
    one, one_trainer = _fit_agent(dataset, steps_per_call=1)
    several, trainer = _fit_agent(dataset, steps_per_call=steps_per_call)
    assert one_trainer.global_step == trainer.global_step == EQUAL_UPDATE_STEPS
    assert len(several.replay) == 4 * EQUAL_UPDATE_STEPS
    _assert_same_agent(one, several)
    one_state = one_trainer.optimizers[0].state_dict()["state"]
    state = trainer.optimizers[0].state_dict()["state"]
    assert one_state.keys() == state.keys() and len(state) > 0
    for key in state:
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(one_state[key][name], state[key][name]), (key, name)
    # the logged values are those of the last agent step in either case
    for key in ("train/epsilon", "train/loss", "train/q_mean"):
        assert float(trainer.callback_metrics[key]) == float(one_trainer.callback_metrics[key]), key
    assert float(trainer.callback_metrics["train/epsilon"]) == pytest.approx(0.995 ** (EQUAL_UPDATE_STEPS - 1))


class _Recording(Logger):
    """A Lightning logger that keeps every row it is given."""

    name, version = "recording", "0"

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict[str, float]]] = []

    def log_metrics(self, metrics, step=None) -> None:
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


def _train_rows(steps_per_call: int, log_every_n_steps: int) -> tuple[list[tuple[int, dict[str, float]]], L.Trainer]:
    """The train-metric rows a fit of EQUAL_UPDATE_STEPS agent steps writes, by logging step."""
    dataset = random_dataset(seed=4)
    cfg = model_config("dqn", seed=3, env={"steps_per_epoch": 1000, "episode_len": 30}, steps_per_call=steps_per_call)
    torch.manual_seed(3)
    agent = build_agent(cfg)
    logger = _Recording()
    trainer = cpu_trainer(max_steps=EQUAL_UPDATE_STEPS, limit_val_batches=0, logger=logger, log_every_n_steps=log_every_n_steps)
    trainer.fit(agent, datamodule=env_datamodule(dataset, cfg))
    return [(step, row) for step, row in logger.rows if "train/epsilon" in row], trainer


@pytest.mark.parametrize("steps_per_call", [5, 10])
def test_train_metrics_are_written_every_log_every_n_steps_agent_steps_at_any_steps_per_call(steps_per_call):
    """The logging axis and Lightning's logging gate count agent steps (runs.steps.log_on_step):
    a fit of several agent steps per call writes the rows of the one-step fit, at the same steps
    with the same values (the env throughput aside, a clock reading). Before, the gate and the
    axis counted calls: rows every 10 calls (50 or 100 agent steps) at steps 9, 19, ..."""
    one, one_trainer = _train_rows(steps_per_call=1, log_every_n_steps=10)
    several, trainer = _train_rows(steps_per_call=steps_per_call, log_every_n_steps=10)
    assert [step for step, _ in one] == [*range(9, EQUAL_UPDATE_STEPS, 10)]  # agent steps 10, 20, ..., 130
    assert [step for step, _ in several] == [step for step, _ in one]
    for (_, a), (_, b) in zip(one, several):
        for row in (a, b):
            row.pop("train/env_steps_per_s", None)  # a clock reading
        assert a == b
    assert trainer.fit_loop.epoch_loop._batches_that_stepped == trainer.global_step == EQUAL_UPDATE_STEPS


def test_lightning_fit_takes_the_updates_of_the_plain_one_step_loop():
    dataset = random_dataset(seed=4)
    fitted, _ = _fit_agent(dataset, steps_per_call=4)
    _assert_same_agent(fitted, _reference_one_step_loop(dataset, EQUAL_UPDATE_STEPS))


def test_steps_per_call_must_be_positive():
    with pytest.raises(Exception, match=r"model\.module\.steps_per_call=0: must be an integer >= 1 and <= 10000000"):
        build_agent(model_config("dqn", seed=0, steps_per_call=0))


@pytest.mark.parametrize("value", [0, 1.5])
def test_a_bad_steps_per_call_is_a_one_line_config_error(value, tmp_path):
    from configs import compose_train_config
    from foxhunt.config.schema import ConfigError, validate

    cfg = compose_train_config(["model=dqn", f"model.module.steps_per_call={value}"], tmp_path)
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert str(error.value) == f"model.module.steps_per_call={value!r}: must be an integer >= 1 and <= 10000000"


@pytest.mark.parametrize("every", [30, 26])
def test_a_log_cadence_the_calls_cannot_keep_is_a_one_line_config_error(every, tmp_path):
    from configs import compose_train_config
    from foxhunt.config.schema import ConfigError, validate

    cfg = compose_train_config(["model=dqn", "model.module.steps_per_call=25", f"trainer.log_every_n_steps={every}"], tmp_path)
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert str(error.value) == (
        f"trainer.log_every_n_steps={every}: must be a multiple of model.module.steps_per_call (25) or at most it: "
        "train metrics are written at the end of a training_step of 25 agent steps"
    )
    for fits in (50, 25, 5, 1):
        validate(
            compose_train_config(["model=dqn", "model.module.steps_per_call=25", f"trainer.log_every_n_steps={fits}"], tmp_path)
        )
