"""Double DQN agent for the trading env: a readable single-file reference implementation.

Written by hand (as in CleanRL's single-file agents) rather than taken from an RL library:
the env is a batched torch env stepped inside ``training_step``, the agent is a
LightningModule checkpointed, logged and memory-measured like every other foxhunt model, and
the whole algorithm fits on a page.

Algorithm (van Hasselt et al., 2016, "Deep Reinforcement Learning with Double Q-learning"):

- **Agent steps.** One agent step steps the ``num_envs`` training envs once with an
  epsilon-greedy policy on the online Q-network, stores the ``num_envs`` transitions in the
  replay buffer and takes one gradient step (``num_envs`` env steps per gradient step). Epsilon
  decays multiplicatively per agent step: ``epsilon(k) = max(epsilon_end, epsilon_start *
  epsilon_decay ** k)`` with ``k = trainer.global_step``, the agent steps completed.
- **Several agent steps per ``training_step``.** Each ``training_step`` call runs
  ``steps_per_call`` agent steps one after the other (fewer where ``trainer.max_steps`` comes
  first), with manual optimization: Lightning's loop costs about as much per ``training_step``
  as a gradient step of this network (hooks, batch fetch, result collection; measured by
  foxhunt.bench.rl), so it is paid once per ``steps_per_call`` gradient steps. Every agent step
  is exactly the step of a one-step ``training_step`` (same order of random draws, same
  ``global_step`` at each, the target update after its own step), so the updates do not depend
  on ``steps_per_call`` (tests/models/test_dqn.py checks it bit for bit). ``trainer.global_step``
  counts agent steps, filling steps included, and so does the logging axis
  (:func:`foxhunt.runs.steps.log_on_step`): the train metrics are written every
  ``trainer.log_every_n_steps`` agent steps, at the steps a one-step fit writes them;
  ``model.env.steps_per_epoch`` counts ``training_step`` calls.
- **Episode ends.** The env only truncates episodes (time limit, ``terminated`` is always
  False). A truncated transition is *not* terminal: its next state is ``info["final_obs"]``
  (the observation the episode reached, before the auto-reset) and its target bootstraps from
  it. Only ``terminated`` masks the bootstrap (``done`` in the buffer = ``terminated``).
- **Learning.** Once the buffer holds ``min_replay_size`` transitions, each agent step
  samples ``batch_size`` transitions uniformly and minimizes the Huber loss between
  ``Q(s, a)`` and the double-DQN target ``r + gamma * (1 - done) * Q_target(s',
  argmax_a' Q_online(s', a'))`` with Adam. While the buffer fills, an agent step takes an
  optimizer step without gradients (Adam leaves every parameter and its state as they are; the
  step is counted in ``global_step``), and nothing but the epsilon and env metrics is logged.
- **Target network.** A copy of the online network, hard-updated (weights copied) whenever
  ``global_step`` is a multiple of ``target_update_interval``, after that step's update.
- **Gradient clipping.** By total norm at ``max_grad_norm`` (``null`` disables it), applied
  before each optimizer step (``clip_update_gradients``: in ``on_before_optimizer_step``, after
  Lightning has unscaled the gradients under a grad scaler, or inline in a direct update,
  :meth:`TradingAgent.update`) so that the value lives in the model config; the trainer's
  ``gradient_clip_val`` must stay unset (Lightning rejects it under manual optimization).
- **Direct updates.** Where nothing listens to Lightning's optimizer wrapper (no grad scaler,
  no callback on the backward and optimizer-step hooks), each agent step steps the torch Adam
  itself, counted in ``global_step`` as the wrapper counts it (:meth:`TradingAgent.update`):
  the same updates, without the wrapper's cost per agent step.

The replay buffer is preallocated tensors on the module's device; sampling uses its own seeded
``torch.Generator`` (on the CPU, so that a seed gives the same batches on every device), as
does the exploration. A checkpoint holds the buffer's filled part, both generators and the
envs' state (:meth:`agent_state`, :class:`TradingAgent`): a fit resumed from it takes exactly
the updates of the fit never stopped.

Logged on the training steps a logger sees (``TradingAgent.log_due``), of the last agent step
of that ``training_step``: ``train/loss``, ``train/q_mean`` (mean Q(s, a) of the batch),
``train/epsilon``, ``train/episode_reward`` (mean
return in ticks of the episodes that ended since the previous logged step),
``train/env_steps_per_s``, and in validation/test the greedy pass of :class:`TradingAgent`.
The loss is :func:`double_dqn_loss`, a pure function the benchmark's bare loop
(``foxhunt.bench.rl``) runs too.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.types import OptimizerLRScheduler
from pydantic import Field, model_validator
from torch import Tensor, nn

from foxhunt.config.model_schemas import MAX_BATCH, MAX_MEMORY, MAX_STEPS, MAX_WIDTH, Related, defined_by
from foxhunt.models.agent import Activation, AgentHyperparameters, CompileStep, TradingAgent, build_mlp
from foxhunt.precision.optim import make_optimizer
from foxhunt.runs.steps import log_on_step
from foxhunt.trading.env import NUM_ACTIONS


@dataclass
class Transitions:
    """A batch of transitions (all tensors share the first dimension B)."""

    obs: Tensor  # (B, D) float32
    actions: Tensor  # (B,) int64
    rewards: Tensor  # (B,) float32
    next_obs: Tensor  # (B, D) float32: the state reached (final_obs on truncation)
    dones: Tensor  # (B,) float32: 1.0 where the episode terminated (no bootstrap)


class ReplayBuffer:
    """Fixed-capacity ring buffer of transitions in preallocated tensors.

    ``add`` writes a batch at the write cursor, wrapping around at ``capacity`` (the oldest
    transitions are overwritten); ``sample`` draws uniformly, with replacement, among the
    filled slots only, using a CPU ``torch.Generator`` seeded with ``seed``.
    """

    def __init__(self, capacity: int, obs_dim: int, device: torch.device | str, seed: int) -> None:
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self.obs = torch.zeros(self.capacity, obs_dim, dtype=torch.float32, device=self.device)
        self.next_obs = torch.zeros_like(self.obs)
        self.actions = torch.zeros(self.capacity, dtype=torch.int64, device=self.device)
        self.rewards = torch.zeros(self.capacity, dtype=torch.float32, device=self.device)
        self.dones = torch.zeros(self.capacity, dtype=torch.float32, device=self.device)
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(int(seed))
        self.cursor = 0  # next slot to write
        self.size = 0  # filled slots

    def memory_tensors(self) -> tuple[torch.Tensor, ...]:
        """The buffer's storage, for foxhunt.memory's model-owned state accounting."""
        return (self.obs, self.next_obs, self.actions, self.rewards, self.dones)

    def __len__(self) -> int:
        return self.size

    def add(self, obs: Tensor, actions: Tensor, rewards: Tensor, next_obs: Tensor, dones: Tensor) -> None:
        """Store a batch of B transitions (B <= capacity)."""
        batch = obs.shape[0]
        if batch > self.capacity:
            raise ValueError(
                f"ReplayBuffer.add: {batch} transitions exceed the capacity {self.capacity} "
                f"(model.module.replay_capacity must be >= num_envs)"
            )
        slots: slice | Tensor
        if self.cursor + batch <= self.capacity:  # contiguous slots: plain copies into views
            slots = slice(self.cursor, self.cursor + batch)
        else:  # wrapping around the end of the ring
            slots = (self.cursor + torch.arange(batch, device=self.device)) % self.capacity
        self.obs[slots] = obs.to(self.device, torch.float32)
        self.actions[slots] = actions.to(self.device, torch.int64)
        self.rewards[slots] = rewards.to(self.device, torch.float32)
        self.next_obs[slots] = next_obs.to(self.device, torch.float32)
        self.dones[slots] = dones.to(self.device, torch.float32)
        self.cursor = (self.cursor + batch) % self.capacity
        self.size = min(self.size + batch, self.capacity)

    def state_dict(self) -> dict[str, Any]:
        """The filled slots (the ring fills from slot 0, so they are the first ``size``), in their
        own dtypes, the write cursor and the sampling generator's state."""
        filled = {name: tensor[: self.size].detach().cpu().clone() for name, tensor in self._storage().items()}
        return {**filled, "cursor": self.cursor, "size": self.size, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`state_dict` saved into this (empty) buffer of the same capacity."""
        size, cursor = int(state["size"]), int(state["cursor"])
        if not (0 <= size <= self.capacity and 0 <= cursor < self.capacity):
            raise ValueError(f"replay buffer state: size {size}, cursor {cursor} do not fit its capacity {self.capacity}")
        for name, tensor in self._storage().items():
            tensor[:size] = state[name].to(self.device, tensor.dtype)
        self.size, self.cursor = size, cursor
        self.generator.set_state(state["generator"])

    def _storage(self) -> dict[str, Tensor]:
        return {"obs": self.obs, "next_obs": self.next_obs, "actions": self.actions, "rewards": self.rewards, "dones": self.dones}

    def sample(self, batch_size: int) -> Transitions:
        """``batch_size`` transitions drawn uniformly among the filled slots."""
        if self.size == 0:
            raise RuntimeError("ReplayBuffer.sample: the buffer is empty")
        idx = torch.randint(0, self.size, (batch_size,), generator=self.generator).to(self.device)
        # index_select: the rows of advanced indexing, without its Python argument parsing
        return Transitions(
            obs=self.obs.index_select(0, idx),
            actions=self.actions.index_select(0, idx),
            rewards=self.rewards.index_select(0, idx),
            next_obs=self.next_obs.index_select(0, idx),
            dones=self.dones.index_select(0, idx),
        )


def epsilon_at(step: int, start: float, end: float, decay: float) -> float:
    """Exploration rate after ``step`` training steps: ``max(end, start * decay ** step)``."""
    return max(end, start * decay**step)


def double_dqn_targets(rewards: Tensor, dones: Tensor, next_q_online: Tensor, next_q_target: Tensor, gamma: float) -> Tensor:
    """Double-DQN targets ``r + gamma * (1 - done) * Q_target(s', argmax_a' Q_online(s', a'))``.

    rewards, dones: (B,); next_q_online, next_q_target: (B, A) Q-values of the next states
    under the online and the target network. The online network picks the action, the target
    network evaluates it; ``dones`` (1.0 = terminated) removes the bootstrap.
    """
    best = next_q_online.argmax(dim=1, keepdim=True)
    next_value = next_q_target.gather(1, best).squeeze(1)
    return rewards + gamma * (1.0 - dones) * next_value


def double_dqn_loss(q_net: nn.Module, target_net: nn.Module, sample: Transitions, gamma: float) -> tuple[Tensor, Tensor]:
    """Smooth-L1 loss of ``Q(s, a)`` against the double-DQN targets of a replay sample.

    Returns ``(loss, q_taken)`` with ``q_taken`` (B,) the online network's ``Q(s, a)``. Shared by
    ``DQNAgent.training_step`` and the bare loop of ``foxhunt.bench.rl``, so both take the same
    gradient steps.
    """
    q_taken = q_net(sample.obs).gather(1, sample.actions.unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        targets = double_dqn_targets(
            sample.rewards,
            sample.dones,
            q_net(sample.next_obs),
            target_net(sample.next_obs),
            gamma,
        )
    return F.smooth_l1_loss(q_taken, targets), q_taken


def double_dqn_batch_loss(
    q_net: nn.Module,
    target_net: nn.Module,
    obs: Tensor,
    actions: Tensor,
    rewards: Tensor,
    next_obs: Tensor,
    dones: Tensor,
    gamma: float,
) -> tuple[Tensor, Tensor]:
    """:func:`double_dqn_loss` of a sample given as its five tensors: what the agent's step runs,
    compiled where ``compile_step`` says so (:meth:`TradingAgent.step_function`)."""
    return double_dqn_loss(q_net, target_net, Transitions(obs, actions, rewards, next_obs, dones), gamma)


# ------------------------------------------------------------------------- hyperparameters
class DQNHyperparameters(AgentHyperparameters):
    """DQN's ``model.module`` (conf/model/dqn.yaml): the agents' shared keys and these."""

    hidden_sizes: Annotated[list[Annotated[int, Field(ge=1, le=MAX_WIDTH)]],
                            Field(min_length=1, strict=False, description="widths of the Q-network's hidden layers")]  # fmt: skip
    steps_per_call: Annotated[int, Field(ge=1, le=MAX_STEPS, description="agent steps (an env step and a gradient step) per training_step call")]  # fmt: skip
    lr: Annotated[float, Field(gt=0, le=10, description="Adam learning rate")]
    batch_size: Annotated[int, Field(ge=1, le=MAX_BATCH, description="transitions per update")]
    replay_capacity: Annotated[int, Field(ge=1, le=MAX_MEMORY, description="transitions the replay buffer holds (a ring)")]
    min_replay_size: Annotated[int, Field(ge=1, le=MAX_MEMORY, description="transitions stored before the first update")]
    target_update_interval: Annotated[int, Field(ge=1, le=MAX_STEPS, description="agent steps between hard target-network updates")]  # fmt: skip
    epsilon_start: Annotated[float, Field(ge=0, le=1, description="exploration rate at step 0")]
    epsilon_end: Annotated[float, Field(ge=0, le=1, description="the exploration rate's floor")]
    epsilon_decay: Annotated[float, Field(gt=0, le=1, description="epsilon = max(epsilon_end, epsilon_start x epsilon_decay ^ agent step)")]  # fmt: skip

    @model_validator(mode="after")
    def _exploration_decays(self) -> DQNHyperparameters:
        if self.epsilon_end > self.epsilon_start:
            raise Related("epsilon_end", f"must be <= model.module.epsilon_start ({self.epsilon_start})")
        return self

    @model_validator(mode="after")
    def _replay_holds_a_step_and_a_batch(self) -> DQNHyperparameters:
        if self.replay_capacity < self.num_envs:
            raise Related("replay_capacity", f"must be >= model.module.num_envs ({self.num_envs})")
        if self.batch_size > self.replay_capacity:
            raise Related("batch_size", f"must be <= model.module.replay_capacity ({self.replay_capacity})")
        if self.min_replay_size > self.replay_capacity:
            raise Related("min_replay_size", f"must be <= model.module.replay_capacity ({self.replay_capacity})")
        return self


@defined_by(DQNHyperparameters)
class DQNAgent(TradingAgent):
    """Double DQN with experience replay and a hard-updated target network. Its arguments are
    ``model.module`` of ``conf/model/dqn.yaml``, defined (type, range, doc) by
    :class:`DQNHyperparameters`."""

    #: ``compile_step: auto``: never on a CPU, where the compiled loss measured no faster than the
    #: eager one (slower with the Adam step compiled too) and its first step compiles for seconds.
    #: On a GPU (CUDA graphs) from 50,000 planned steps: CUDA graphs save the kernel launches of
    #: each small step against a compilation of about a minute (not yet measured on a GPU). The
    #: figures and how they were taken: docs/benchmarks.md, "training speed" (issue 41).
    compile_pays_after: ClassVar[dict[str, int]] = {"cuda": 50_000}

    def __init__(
        self,
        state_dim: int,
        hidden_sizes: Sequence[int],
        activation: Activation,
        num_envs: int,
        steps_per_call: int,
        seed: int,
        gamma: float,
        lr: float,
        batch_size: int,
        replay_capacity: int,
        min_replay_size: int,
        target_update_interval: int,
        epsilon_start: float,
        epsilon_end: float,
        epsilon_decay: float,
        max_grad_norm: float | None,
        compile_step: CompileStep,
    ) -> None:
        super().__init__(state_dim=state_dim, num_envs=num_envs, seed=seed, compile_step=compile_step)
        self.save_hyperparameters()  # plain values (defined_by): checkpoints load with weights_only=True
        # The same values as their definition types them (validated already: defined_by)
        self.hp = DQNHyperparameters.model_construct(**self.hparams)
        self.automatic_optimization = False  # several gradient steps per training_step
        self.q_net = build_mlp(self.obs_dim, hidden_sizes, NUM_ACTIONS, activation)
        self.target_net = copy.deepcopy(self.q_net)
        self.target_net.requires_grad_(False)
        self.replay: ReplayBuffer | None = None
        self._explore_generator = torch.Generator(device="cpu")

    # ---------------------------------------------------------------------------- the policy
    def forward(self, obs: Tensor) -> Tensor:
        """(B, state_dim + 1) observations -> (B, 3) Q-values."""
        return self.q_net(obs)

    @property
    def acting_network(self) -> nn.Sequential:
        return self.q_net

    def greedy_action(self, obs: Tensor) -> Tensor:
        return self.q_net(obs).argmax(dim=-1)

    def epsilon(self, step: int) -> float:
        hp = self.hp
        return epsilon_at(step, hp.epsilon_start, hp.epsilon_end, hp.epsilon_decay)

    def updates_per_batch(self) -> int:
        return self.hp.steps_per_call

    @torch.no_grad()
    def act(self, obs: Tensor, epsilon: float) -> Tensor:
        """Epsilon-greedy actions (B,) on the module's device."""
        greedy = self.greedy_action(obs)
        batch = obs.shape[0]
        explore = torch.rand(batch, generator=self._explore_generator) < epsilon
        random_actions = torch.randint(0, NUM_ACTIONS, (batch,), generator=self._explore_generator)
        return torch.where(explore.to(obs.device), random_actions.to(obs.device), greedy)

    # ------------------------------------------------------------------------------ training
    def on_train_start(self) -> None:
        self.replay = ReplayBuffer(self.hp.replay_capacity, self.obs_dim, self.device, self.seed)
        self._explore_generator.manual_seed(self.seed)
        self._obs = self.training_env().reset(seed=self.seed)
        super().on_train_start()  # a resumed fit: all of it put back (restore_agent_state)

    def agent_state(self) -> dict[str, Any]:
        """Besides :class:`TradingAgent`'s: the replay buffer and the exploration generator."""
        return {"replay": self.replay_buffer().state_dict(), "explore_generator": self._explore_generator.get_state()}

    def restore_agent_state(self, state: dict[str, Any]) -> None:
        self.replay_buffer().load_state_dict(state["replay"])
        self._explore_generator.set_state(state["explore_generator"])

    def replay_buffer(self) -> ReplayBuffer:
        """The replay buffer, which ``on_train_start`` builds on the module's device."""
        if self.replay is None:
            raise RuntimeError("DQNAgent: no replay buffer; on_train_start builds it")
        return self.replay

    @torch.no_grad()
    def collect_step(self, epsilon: float) -> tuple[Tensor, Tensor]:
        """One epsilon-greedy step of the training envs, its transitions written to the replay
        buffer; returns ``(reward, done)`` per env. The acting half of a training step (the
        benchmark times it alone)."""
        env = self.training_env()
        obs = self.env_obs(self.observation())
        actions = self.act(obs, epsilon)
        next_obs, reward, terminated, truncated, info = env.step(actions.to(env.device))
        # final_obs is the state each transition reached (before any auto-reset); only a
        # terminated episode stops the bootstrap, a truncated one bootstraps from final_obs.
        self.replay_buffer().add(obs, actions, reward, info["final_obs"], terminated)
        self._obs = next_obs
        return reward, terminated | truncated

    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        """``steps_per_call`` agent steps (fewer where ``trainer.max_steps`` comes first); logs
        the last one's metrics on a logged step and returns its loss (None while filling)."""
        steps = self.updates_per_batch()
        max_steps = self.trainer.max_steps
        if max_steps is not None and max_steps >= 0:
            steps = max(1, min(steps, max_steps - self.global_step))
        optimizer = self.optimizers()
        for _ in range(steps - 1):  # steps >= 1
            self.agent_step(optimizer)
        epsilon, loss, q_taken = self.agent_step(optimizer)  # the last one, whose metrics are logged
        log_on_step(self.trainer, self.global_step)  # the logging axis and its cadence count agent steps
        if self.log_due(batch_idx, optimizer_steps=0):  # the steps a logger sees
            self.log("train/epsilon", epsilon, on_step=True, on_epoch=False, batch_size=1)
            for key, value in self.pending_metrics().items():
                self.log(key, value, on_step=True, on_epoch=False, batch_size=1)
            if loss is not None:
                assert q_taken is not None  # None with the loss only (while the buffer fills)
                batch_size = self.hp.batch_size
                self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=batch_size)
                self.log("train/q_mean", q_taken.mean(), on_step=True, on_epoch=False, batch_size=batch_size)
        return loss

    def agent_step(self, optimizer: Any) -> tuple[float, Tensor | None, Tensor | None]:
        """One agent step: act and store (:meth:`collect_step`), one gradient step once the
        buffer holds ``min_replay_size`` transitions, then the target update due at the new
        ``global_step``, with ``optimizer`` (Lightning's wrapper of the Adam; :meth:`update`). Returns
        ``(epsilon, loss, q_taken)``, the last two detached (None while the buffer fills)."""
        hp = self.hp
        replay = self.replay_buffer()
        epsilon = self.epsilon(self.global_step)
        reward, done = self.collect_step(epsilon)
        self.note_step(self.training_env().num_envs, self.track_episodes(reward, done))
        loss: Tensor | None = None
        q_taken: Tensor | None = None
        if len(replay) >= hp.min_replay_size:
            sample = replay.sample(hp.batch_size)
            loss, q_taken = self.step_function(double_dqn_batch_loss)(
                self.q_net, self.target_net, sample.obs, sample.actions, sample.rewards, sample.next_obs, sample.dones, hp.gamma
            )
        # Counted in global_step either way; without gradients (filling) Adam changes nothing.
        self.update(optimizer, loss)
        if loss is not None:
            assert q_taken is not None  # computed with the loss
            loss, q_taken = loss.detach(), q_taken.detach()
        self.maybe_update_target(self.global_step)
        return epsilon, loss, q_taken

    def maybe_update_target(self, step: int) -> bool:
        """Copy the online weights into the target network when ``step`` (training steps
        completed) is a positive multiple of ``target_update_interval``; returns whether it did."""
        if step > 0 and step % self.hp.target_update_interval == 0:
            self.target_net.load_state_dict(self.q_net.state_dict())
            return True
        return False

    def clip_update_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self.clip_grad_norm(params, self.hp.max_grad_norm)

    def configure_optimizers(self) -> OptimizerLRScheduler:
        return make_optimizer(self.q_net.parameters(), "adam", lr=self.hp.lr)
