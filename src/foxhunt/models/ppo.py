"""PPO agent for the trading env: a readable single-file reference implementation.

Follows CleanRL's ``ppo.py`` (Huang et al., "The 37 Implementation Details of Proximal Policy
Optimization", 2022) with the rollout collected from the batched torch env inside
``training_step``. Written by hand rather than taken from an RL library for the same reasons as
:mod:`foxhunt.models.dqn`: the env is a torch batch stepped inside the LightningModule, and the
agent is checkpointed, logged and memory-measured like every other foxhunt model.

One ``training_step`` = one rollout + its update epochs (manual optimization):

1. **Rollout.** ``rollout_steps`` steps of the ``num_envs`` envs with actions sampled from the
   policy: a batch of ``num_envs x rollout_steps`` transitions (8 x 8 = 64 by default).
2. **Advantages.** GAE(gamma, lambda) over the rollout (:func:`compute_gae`). The env only
   truncates episodes (time limit); a truncated step is the end of its episode for GAE, but its
   TD target bootstraps from ``V(final_obs)``, the value of the state the episode reached,
   instead of 0. A terminated step (if an env ever reports one) bootstraps from 0.
   Returns = advantages + values.
3. **Update.** ``update_epochs`` passes over the batch in shuffled minibatches of
   ``minibatch_size``; per minibatch: advantages normalized (mean 0, std 1), clipped surrogate
   policy loss (:func:`clipped_surrogate_loss`), value loss ``0.5 * (V(s) - R)^2``, entropy
   bonus; total ``loss = policy_loss - ent_coef * entropy + vf_coef * value_loss``.

Policy and value are separate MLPs with orthogonal initialization (hidden gain sqrt(2), policy
head 0.01, value head 1.0), updated by one Adam with two parameter groups, the policy's at
``policy_lr`` and the value's at ``value_lr`` (``adam_eps`` as in CleanRL). Adam's update is
per parameter, so this is the same update as two optimizers, in one optimizer step: Lightning's
wrapper around each step costs about as much as a small network's fused Adam step. Gradients
are clipped to ``max_grad_norm`` per network (each parameter group by its own norm; CleanRL
clips the two jointly; null: no clipping, as DQN's), before each step (``clip_update_gradients``: in
``on_before_optimizer_step``, after Lightning has unscaled them under a grad scaler (16-mixed), or inline in a
direct update where nothing listens to Lightning's optimizer wrapper, :meth:`TradingAgent.update`).

Lightning counts every optimizer step in ``trainer.global_step``: one training step advances it
by ``update_epochs x (num_envs x rollout_steps / minibatch_size)`` (20 with the defaults).
Automatic gradient clipping (``trainer.gradient_clip_val``) must stay unset; Lightning rejects
it under manual optimization, and this model clips by itself.

Action sampling uses the global torch RNG (seeded by ``seed_everything``), as CleanRL does.

Logged on the training steps a logger sees (``TradingAgent.log_due``): ``train/loss``
(total), ``train/policy_loss``, ``train/value_loss``, ``train/entropy`` (means over the
update's minibatches), ``train/approx_kl``, ``train/clip_fraction`` (means over the
minibatches), ``train/explained_variance`` (of the rollout's values for its returns),
``train/episode_reward`` and ``train/env_steps_per_s`` (since the previous logged step).
The minibatch loss is :func:`ppo_minibatch_losses`, a pure function the benchmark's bare loop
(``foxhunt.bench.rl``) runs too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar

import torch
from pydantic import Field, model_validator
from torch import Tensor

from foxhunt.config.model_schemas import MAX_BATCH, MAX_LAYERS, MAX_STEPS, MAX_WIDTH, Related, defined_by
from foxhunt.models.agent import Activation, AgentHyperparameters, CompileStep, TradingAgent, build_mlp, orthogonal_init_
from foxhunt.precision.optim import make_optimizer
from foxhunt.trading.env import NUM_ACTIONS

#: Orthogonal-init gains of the PPO reference implementations (not tunables: part of the method).
HIDDEN_GAIN = math.sqrt(2.0)
POLICY_HEAD_GAIN = 0.01
VALUE_HEAD_GAIN = 1.0


def compute_gae(
    rewards: Tensor,
    values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    final_values: Tensor,
    next_value: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over a rollout of T steps of N envs.

    Args:
        rewards, values: (T, N) reward of step t and V(s_t) of the state it acted in.
        terminated: (T, N) bool, the episode ended at step t in a terminal state (bootstrap 0).
        truncated: (T, N) bool, the episode was cut at step t (time limit): it bootstraps from
            ``final_values[t]`` = V(final state reached), and GAE does not continue past it.
        final_values: (T, N) V of the final observation where truncated (ignored elsewhere).
        next_value: (N,) V of the observation after the rollout's last step (the first state
            of the new episode where that step ended one, which is then not used).
        gamma, lam: discount and GAE lambda.

    Returns (advantages, returns), both (T, N): with ``V_next`` = 0 where terminated,
    ``final_values[t]`` where truncated, else ``values[t + 1]`` (``next_value`` for the last
    step), ``delta_t = r_t + gamma * V_next - V(s_t)`` and ``A_t = delta_t + gamma * lam *
    (1 - done_t) * A_{t+1}`` (``done = terminated | truncated``); returns = A + values.
    """
    steps = rewards.shape[0]
    if (
        not (values.shape == terminated.shape == truncated.shape == final_values.shape == rewards.shape)
        or next_value.shape != rewards.shape[1:]
    ):
        raise ValueError(
            f"compute_gae: rewards, values, terminated, truncated, final_values must be (T, N) "
            f"and next_value (N,), got {tuple(rewards.shape)}, {tuple(values.shape)}, "
            f"{tuple(terminated.shape)}, {tuple(truncated.shape)}, {tuple(final_values.shape)}, "
            f"{tuple(next_value.shape)}"
        )
    terminated = terminated.to(values.dtype)
    truncated = truncated.to(values.dtype)
    done = torch.clamp(terminated + truncated, max=1.0)
    advantages = torch.zeros_like(values)
    last_advantage = torch.zeros_like(next_value)
    for t in reversed(range(steps)):
        following = next_value if t == steps - 1 else values[t + 1]
        # Where the episode ended, the successor state is the final one: V = 0 if terminal,
        # V(final_obs) if cut by the time limit; otherwise it is the next rollout state.
        cut = truncated[t] * (1.0 - terminated[t])
        bootstrap = (1.0 - done[t]) * following + cut * final_values[t]
        delta = rewards[t] + gamma * bootstrap - values[t]
        last_advantage = delta + gamma * lam * (1.0 - done[t]) * last_advantage
        advantages[t] = last_advantage
    return advantages, advantages + values


def clipped_surrogate_loss(new_logprob: Tensor, old_logprob: Tensor, advantages: Tensor, clip: float) -> Tensor:
    """PPO's clipped surrogate objective as a loss (to minimize), averaged over the batch.

    ``ratio = exp(new_logprob - old_logprob)``; loss = mean(max(-A * ratio, -A * clamp(ratio,
    1 - clip, 1 + clip))) = -mean(min(ratio * A, clamp(ratio) * A)).
    """
    ratio = torch.exp(new_logprob - old_logprob)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
    return torch.max(unclipped, clipped).mean()


def explained_variance(predicted: Tensor, target: Tensor) -> float:
    """``1 - Var(target - predicted) / Var(target)``; NaN when the target is constant."""
    target_var = torch.var(target)
    if float(target_var) == 0.0:
        return float("nan")
    return float(1.0 - torch.var(target - predicted) / target_var)


def categorical_log_prob_entropy(logits: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
    """``(log_prob(actions), entropy)`` of the categorical distribution with ``logits`` (B, A).

    The formulas of ``torch.distributions.Categorical`` (log-probabilities ``logits -
    logsumexp``, entropy ``-sum(p * log p)`` with log p clamped at the dtype's minimum), without
    building the distribution: its argument checks cost more than this math at minibatch 32
    (about a third of the loss's forward and backward; measured by foxhunt.bench.rl).
    """
    normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
    log_prob = normalized.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    clamped = normalized.clamp(min=torch.finfo(normalized.dtype).min)
    entropy = -(clamped * torch.softmax(normalized, dim=-1)).sum(dim=-1)
    return log_prob, entropy


def sample_categorical(logits: Tensor) -> tuple[Tensor, Tensor]:
    """Actions (B,) drawn from ``Categorical(logits=logits)`` and their log-probabilities.

    Draws exactly what ``Categorical(logits=logits).sample()`` draws (one ``torch.multinomial``
    call on the same probabilities, consuming the same random numbers).
    """
    normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
    actions = torch.multinomial(torch.softmax(normalized, dim=-1), 1, True).squeeze(-1)
    return actions, normalized.gather(-1, actions.unsqueeze(-1)).squeeze(-1)


#: Statistics :func:`ppo_minibatch_losses` returns, in order (``train/<name>`` metrics).
PPO_STATS = ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")


def ppo_minibatch_losses(
    policy_net: torch.nn.Module,
    value_net: torch.nn.Module,
    obs: Tensor,
    actions: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    returns: Tensor,
    clip_coef: float,
    vf_coef: float,
    ent_coef: float,
    with_stats: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """The PPO loss of one minibatch and its statistics.

    Advantages are normalized over the minibatch (mean 0, unbiased std 1, plus the dtype's eps
    against a constant minibatch); ``loss = clipped surrogate - ent_coef * entropy + vf_coef *
    0.5 * mean((V(s) - R)^2)``. Returns ``(loss, stats)`` with ``stats`` the detached (6,)
    tensor of :data:`PPO_STATS` (approx_kl is Schulman's k3 estimator; clip_fraction the share
    of ratios outside ``1 +- clip_coef``), or None without ``with_stats`` (a step that logs
    nothing skips their ten small operations). Shared by ``PPOAgent.training_step`` and the
    bare loop of ``foxhunt.bench.rl``, so both take the same gradient steps.
    """
    new_logprob, entropy = categorical_log_prob_entropy(policy_net(obs), actions)
    entropy = entropy.mean()
    new_value = value_net(obs).squeeze(-1)
    normalized = (advantages - advantages.mean()) / (advantages.std() + torch.finfo(advantages.dtype).eps)
    policy_loss = clipped_surrogate_loss(new_logprob, old_logprob, normalized, clip_coef)
    value_loss = 0.5 * ((new_value - returns) ** 2).mean()
    loss = policy_loss - ent_coef * entropy + vf_coef * value_loss
    if not with_stats:
        return loss, None
    with torch.no_grad():
        log_ratio = new_logprob - old_logprob
        ratio = log_ratio.exp()
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clip_fraction = ((ratio - 1.0).abs() > clip_coef).float().mean()
    stats = torch.stack([loss, policy_loss, value_loss, entropy, approx_kl, clip_fraction]).detach()
    return loss, stats


# ------------------------------------------------------------------------- hyperparameters
class PPOHyperparameters(AgentHyperparameters):
    """PPO's ``model.module`` (conf/model/ppo.yaml): the agents' shared keys and these."""

    policy_hidden_sizes: Annotated[list[Annotated[int, Field(ge=1, le=MAX_WIDTH)]],
                                   Field(min_length=1, strict=False, description="hidden widths of the policy network")]  # fmt: skip
    value_hidden_sizes: Annotated[list[Annotated[int, Field(ge=1, le=MAX_WIDTH)]],
                                  Field(min_length=1, strict=False, description="hidden widths of the value network")]  # fmt: skip
    rollout_steps: Annotated[int, Field(ge=1, le=MAX_STEPS, description="steps of each env per rollout (the batch: num_envs x rollout_steps)")]  # fmt: skip
    minibatch_size: Annotated[int, Field(ge=1, le=MAX_BATCH, description="transitions per gradient step (divides the rollout batch)")]  # fmt: skip
    update_epochs: Annotated[int, Field(ge=1, le=MAX_LAYERS, description="passes over the rollout batch per training step")]
    gae_lambda: Annotated[float, Field(ge=0, le=1, description="GAE lambda (0: one-step TD advantages, 1: the rollout's returns)")]  # fmt: skip
    clip_coef: Annotated[float, Field(gt=0, le=100, description="the surrogate's clipping range of the probability ratio")]
    vf_coef: Annotated[float, Field(ge=0, le=100, description="weight of the value loss")]
    ent_coef: Annotated[float, Field(ge=0, le=100, description="weight of the entropy bonus")]
    policy_lr: Annotated[float, Field(gt=0, le=10, description="Adam learning rate of the policy network")]
    value_lr: Annotated[float, Field(gt=0, le=10, description="Adam learning rate of the value network")]
    adam_eps: Annotated[float, Field(gt=0, le=1, description="Adam's epsilon")]

    @model_validator(mode="after")
    def _minibatches_split_the_rollout(self) -> PPOHyperparameters:
        rollout = self.num_envs * self.rollout_steps
        if rollout % self.minibatch_size:
            raise Related("minibatch_size",
                          f"must divide the rollout batch model.env.num_envs x model.module.rollout_steps ({rollout})")  # fmt: skip
        return self


@defined_by(PPOHyperparameters)
class PPOAgent(TradingAgent):
    """Proximal Policy Optimization with GAE, separate policy and value networks. Its arguments
    are ``model.module`` of ``conf/model/ppo.yaml``, defined (type, range, doc) by
    :class:`PPOHyperparameters`."""

    #: ``compile_step: auto`` on a CPU from 50,000 planned gradient steps: the compiled minibatch
    #: loss (forward, loss, backward; Adam eager) measured faster than the eager one, by a fraction
    #: of a millisecond a step, against a first step that compiles for seconds (inductor's on-disk
    #: cache warm) to tens of seconds (cold): paid back within 50,000 steps. On a GPU (CUDA graphs)
    #: from 50,000 too: CUDA graphs save each step's kernel launches against a compilation of about
    #: a minute (not yet measured on a GPU). The figures: docs/benchmarks.md, "training speed".
    compile_pays_after: ClassVar[dict[str, int]] = {"cpu": 50_000, "cuda": 50_000}

    def __init__(
        self,
        state_dim: int,
        policy_hidden_sizes: Sequence[int],
        value_hidden_sizes: Sequence[int],
        activation: Activation,
        num_envs: int,
        seed: int,
        rollout_steps: int,
        minibatch_size: int,
        update_epochs: int,
        gamma: float,
        gae_lambda: float,
        clip_coef: float,
        vf_coef: float,
        ent_coef: float,
        max_grad_norm: float | None,
        policy_lr: float,
        value_lr: float,
        adam_eps: float,
        compile_step: CompileStep,
    ) -> None:
        super().__init__(state_dim=state_dim, num_envs=num_envs, seed=seed, compile_step=compile_step)
        self.save_hyperparameters()  # plain values (defined_by): checkpoints load with weights_only=True
        # The same values as their definition types them (validated already: defined_by)
        self.hp = PPOHyperparameters.model_construct(**self.hparams)
        self.automatic_optimization = False
        self.batch_size = num_envs * rollout_steps
        self.policy_net = orthogonal_init_(
            build_mlp(self.obs_dim, policy_hidden_sizes, NUM_ACTIONS, activation),
            HIDDEN_GAIN,
            POLICY_HEAD_GAIN,
        )
        self.value_net = orthogonal_init_(
            build_mlp(self.obs_dim, value_hidden_sizes, 1, activation), HIDDEN_GAIN, VALUE_HEAD_GAIN
        )
        # The latest rollout, an attribute (not a local of training_step) so that
        # foxhunt.memory counts it as model-owned state; released when the next step starts.
        self.rollout: dict[str, Tensor] | None = None

    # ---------------------------------------------------------------------------- the policy
    def forward(self, obs: Tensor) -> Tensor:
        """(B, state_dim + 1) observations -> (B, 3) policy logits."""
        return self.policy_net(obs)

    def value(self, obs: Tensor) -> Tensor:
        """(B, state_dim + 1) observations -> (B,) state values."""
        return self.value_net(obs).squeeze(-1)

    def updates_per_batch(self) -> int:
        return self.hp.update_epochs * (self.batch_size // self.hp.minibatch_size)

    @property
    def acting_network(self) -> torch.nn.Sequential:
        return self.policy_net

    def greedy_action(self, obs: Tensor) -> Tensor:
        return self.policy_net(obs).argmax(dim=-1)

    # ------------------------------------------------------------------------------ training
    def on_train_start(self) -> None:
        self._obs = self.training_env().reset(seed=self.seed)
        super().on_train_start()  # a resumed fit: the envs, the observation and the returns put back

    @torch.no_grad()
    def collect_rollout(self) -> dict[str, Tensor]:
        """``rollout_steps`` steps of the training envs; returns (T, N, ...) tensors on the
        module's device plus the GAE ``advantages`` and ``returns``."""
        hp = self.hp
        env = self.training_env()
        steps, n = hp.rollout_steps, env.num_envs
        dev = self.device
        obs_buf = torch.zeros(steps, n, self.obs_dim, device=dev)
        actions = torch.zeros(steps, n, dtype=torch.int64, device=dev)
        logprobs = torch.zeros(steps, n, device=dev)
        rewards = torch.zeros(steps, n, device=dev)
        values = torch.zeros(steps, n, device=dev)
        terminated = torch.zeros(steps, n, dtype=torch.bool, device=dev)
        truncated = torch.zeros(steps, n, dtype=torch.bool, device=dev)
        final_values = torch.zeros(steps, n, device=dev)
        finished_returns = []
        for t in range(steps):
            obs = self.env_obs(self.observation())
            action, logprob = sample_categorical(self.policy_net(obs))
            obs_buf[t], actions[t], logprobs[t] = obs, action, logprob
            values[t] = self.value(obs)
            next_obs, reward, term, trunc, info = env.step(action.to(env.device))
            rewards[t] = reward.to(dev, torch.float32)
            terminated[t], truncated[t] = term.to(dev), trunc.to(dev)
            if bool(trunc.any()):
                # final_obs equals obs where the episode did not end; only truncated ones count
                final_values[t] = self.value(self.env_obs(info["final_obs"])) * truncated[t]
            finished = self.track_episodes(reward, term | trunc)
            if finished is not None:
                finished_returns.append(finished)
            self._obs = next_obs
        next_value = self.value(self.env_obs(self.observation()))
        advantages, returns = compute_gae(
            rewards,
            values,
            terminated,
            truncated,
            final_values,
            next_value,
            hp.gamma,
            hp.gae_lambda,
        )
        rollout = {
            "obs": obs_buf,
            "actions": actions,
            "logprobs": logprobs,
            "values": values,
            "advantages": advantages,
            "returns": returns,
        }
        if finished_returns:
            rollout["episode_returns"] = torch.cat(finished_returns)
        return rollout

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        hp = self.hp
        optimizer = self.optimizers()
        self.rollout = None  # release the previous rollout before collecting the next
        rollout = self.rollout = self.collect_rollout()
        b_values = rollout["values"].reshape(-1)
        b_returns = rollout["returns"].reshape(-1)
        batch_tensors = (
            rollout["obs"].reshape(-1, self.obs_dim),
            rollout["actions"].reshape(-1),
            rollout["logprobs"].reshape(-1),
            rollout["advantages"].reshape(-1),
            b_returns,
        )
        minibatches = self.updates_per_batch()
        log = self.log_due(batch_idx, optimizer_steps=minibatches)  # before: stats only if logged
        totals = torch.zeros(len(PPO_STATS), device=self.device)
        updates = 0
        loss: Tensor | None = None  # the last minibatch's
        for _ in range(hp.update_epochs):
            # Shuffle each tensor once per epoch; the minibatches are slices (views) of it.
            order = torch.randperm(self.batch_size, device=self.device)
            shuffled = [tensor[order] for tensor in batch_tensors]
            for start in range(0, self.batch_size, hp.minibatch_size):
                loss, stats = self.step_function(ppo_minibatch_losses)(
                    self.policy_net,
                    self.value_net,
                    *(tensor[start : start + hp.minibatch_size] for tensor in shuffled),
                    clip_coef=hp.clip_coef,
                    vf_coef=hp.vf_coef,
                    ent_coef=hp.ent_coef,
                    # compiled: one graph, the statistics fused in it, rather than a second graph
                    # compiled at the first logged step
                    with_stats=log or self._compiled_step,
                )
                self.update(optimizer, loss)  # clipped first
                if log and stats is not None:
                    totals += stats  # summed as tensors: no host sync per minibatch
                updates += 1

        self.note_step(self.batch_size, rollout.get("episode_returns"))
        assert loss is not None  # update_epochs >= 1 and minibatch_size divides the rollout: one update at least
        if not log:
            return loss.detach()
        means = totals / updates
        metrics = {f"train/{key}": value for key, value in zip(PPO_STATS, means.tolist())}
        metrics["train/explained_variance"] = explained_variance(b_values, b_returns)
        metrics.update(self.pending_metrics())
        self.log_dict(metrics, on_step=True, on_epoch=False, batch_size=self.batch_size)
        return means[0]

    def clip_update_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        for group in optimizer.param_groups:  # the policy's, then the value's: each its own norm
            self.clip_grad_norm(group["params"], self.hp.max_grad_norm)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        hp = self.hp
        groups = [
            {"params": list(self.policy_net.parameters()), "lr": hp.policy_lr},
            {"params": list(self.value_net.parameters()), "lr": hp.value_lr},
        ]
        return make_optimizer(groups, "adam", lr=hp.policy_lr, eps=hp.adam_eps)
