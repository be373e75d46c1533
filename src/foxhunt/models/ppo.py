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
head 0.01, value head 1.0), each with its own Adam optimizer (``policy_lr``, ``value_lr``;
``adam_eps`` as in CleanRL). Gradients are clipped to ``max_grad_norm`` per network (each
optimizer's parameters; CleanRL clips the two jointly under one optimizer).

Lightning counts every optimizer step in ``trainer.global_step``: one training step advances it
by ``2 x update_epochs x (num_envs x rollout_steps / minibatch_size)`` (2 optimizers; 40 with
the defaults). Automatic gradient clipping (``trainer.gradient_clip_val``) must stay unset;
Lightning rejects it under manual optimization, and this model clips by itself.

Action sampling uses the global torch RNG (seeded by ``seed_everything``), as CleanRL does.

Logged per training step: ``train/loss`` (total), ``train/policy_loss``, ``train/value_loss``,
``train/entropy`` (means over the update's minibatches), ``train/approx_kl``,
``train/clip_fraction`` (means over the minibatches), ``train/explained_variance`` (of the
rollout's values for its returns), ``train/episode_reward``, ``train/env_steps_per_s``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.distributions import Categorical

from foxhunt.data.env import NUM_ACTIONS
from foxhunt.models.agent import TradingAgent, build_mlp, orthogonal_init_

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
    if not (
        values.shape == terminated.shape == truncated.shape == final_values.shape == rewards.shape
    ) or next_value.shape != rewards.shape[1:]:
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


def clipped_surrogate_loss(
    new_logprob: Tensor, old_logprob: Tensor, advantages: Tensor, clip: float
) -> Tensor:
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


class PPOAgent(TradingAgent):
    """Proximal Policy Optimization with GAE, separate policy and value networks.

    Args (all from ``conf/model/ppo.yaml``, ``model.module``):
        state_dim: features per bar; the networks take ``state_dim + 1`` inputs.
        policy_hidden_sizes, value_hidden_sizes: hidden widths of the two MLPs.
        activation: hidden activation (see :data:`foxhunt.models.agent.ACTIVATIONS`).
        num_envs: parallel envs of a rollout.
        seed: seeds the env's episode starts.
        rollout_steps: steps per env per rollout (batch = num_envs x rollout_steps).
        minibatch_size: transitions per gradient step (must divide the batch).
        update_epochs: passes over the rollout batch per training step.
        gamma, gae_lambda: discount and GAE lambda.
        clip_coef: surrogate clipping range.
        vf_coef, ent_coef: weights of the value loss and the entropy bonus.
        max_grad_norm: gradient clipping (total norm, per network).
        policy_lr, value_lr, adam_eps: the two Adam optimizers.
    """

    def __init__(
        self,
        state_dim: int,
        policy_hidden_sizes: Sequence[int],
        value_hidden_sizes: Sequence[int],
        activation: str,
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
        max_grad_norm: float,
        policy_lr: float,
        value_lr: float,
        adam_eps: float,
    ) -> None:
        super().__init__(state_dim=state_dim, num_envs=num_envs, seed=seed)
        # plain ints, not an OmegaConf ListConfig: checkpoints must load with weights_only=True
        policy_hidden_sizes = [int(h) for h in policy_hidden_sizes]
        value_hidden_sizes = [int(h) for h in value_hidden_sizes]
        self.save_hyperparameters()
        self.automatic_optimization = False
        for name, value in (
            ("rollout_steps", rollout_steps),
            ("minibatch_size", minibatch_size),
            ("update_epochs", update_epochs),
        ):
            if int(value) < 1:
                raise ValueError(f"model.module.{name}={value!r}: must be >= 1")
        self.batch_size = int(num_envs) * int(rollout_steps)
        if self.batch_size % int(minibatch_size) != 0:
            raise ValueError(
                f"model.module.minibatch_size={minibatch_size}: must divide the rollout batch "
                f"num_envs x rollout_steps = {num_envs} x {rollout_steps} = {self.batch_size}"
            )
        for name, value in (("gamma", gamma), ("gae_lambda", gae_lambda)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"model.module.{name}={value!r}: must be in [0, 1]")
        if not clip_coef > 0:
            raise ValueError(f"model.module.clip_coef={clip_coef!r}: must be > 0")
        if not max_grad_norm > 0:
            raise ValueError(f"model.module.max_grad_norm={max_grad_norm!r}: must be > 0")
        self.policy_net = orthogonal_init_(
            build_mlp(self.obs_dim, policy_hidden_sizes, NUM_ACTIONS, activation),
            HIDDEN_GAIN,
            POLICY_HEAD_GAIN,
        )
        self.value_net = orthogonal_init_(
            build_mlp(self.obs_dim, value_hidden_sizes, 1, activation), HIDDEN_GAIN, VALUE_HEAD_GAIN
        )
        self._obs: Tensor | None = None

    # ---------------------------------------------------------------------------- the policy
    def forward(self, obs: Tensor) -> Tensor:
        """(B, state_dim + 1) observations -> (B, 3) policy logits."""
        return self.policy_net(obs)

    def value(self, obs: Tensor) -> Tensor:
        """(B, state_dim + 1) observations -> (B,) state values."""
        return self.value_net(obs).squeeze(-1)

    def greedy_action(self, obs: Tensor) -> Tensor:
        return self.policy_net(obs).argmax(dim=-1)

    # ------------------------------------------------------------------------------ training
    def on_train_start(self) -> None:
        super().on_train_start()
        self._obs = self.train_env.reset(seed=self.seed)

    @torch.no_grad()
    def collect_rollout(self) -> dict[str, Tensor]:
        """``rollout_steps`` steps of the training envs; returns (T, N, ...) tensors on the
        module's device plus the GAE ``advantages`` and ``returns``."""
        hp = self.hparams
        env = self.train_env
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
            obs = self.env_obs(self._obs)
            dist = Categorical(logits=self.policy_net(obs))
            action = dist.sample()
            obs_buf[t], actions[t], logprobs[t] = obs, action, dist.log_prob(action)
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
        next_value = self.value(self.env_obs(self._obs))
        advantages, returns = compute_gae(
            rewards, values, terminated, truncated, final_values, next_value,
            hp.gamma, hp.gae_lambda,
        )
        rollout = {
            "obs": obs_buf, "actions": actions, "logprobs": logprobs, "values": values,
            "advantages": advantages, "returns": returns,
        }
        if finished_returns:
            rollout["episode_returns"] = torch.cat(finished_returns)
        return rollout

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        hp = self.hparams
        policy_opt, value_opt = self.optimizers()
        rollout = self.collect_rollout()
        b_obs = rollout["obs"].reshape(-1, self.obs_dim)
        b_actions = rollout["actions"].reshape(-1)
        b_logprobs = rollout["logprobs"].reshape(-1)
        b_advantages = rollout["advantages"].reshape(-1)
        b_returns = rollout["returns"].reshape(-1)
        b_values = rollout["values"].reshape(-1)

        sums = {"loss": 0.0, "policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0,
                "approx_kl": 0.0, "clip_fraction": 0.0}
        updates = 0
        for _ in range(hp.update_epochs):
            order = torch.randperm(self.batch_size, device=self.device)
            for start in range(0, self.batch_size, hp.minibatch_size):
                mb = order[start : start + hp.minibatch_size]
                dist = Categorical(logits=self.policy_net(b_obs[mb]))
                new_logprob = dist.log_prob(b_actions[mb])
                entropy = dist.entropy().mean()
                new_value = self.value(b_obs[mb])
                log_ratio = new_logprob - b_logprobs[mb]
                with torch.no_grad():
                    ratio = log_ratio.exp()
                    approx_kl = ((ratio - 1.0) - log_ratio).mean()  # Schulman's k3 estimator
                    clip_fraction = ((ratio - 1.0).abs() > hp.clip_coef).float().mean()
                mb_adv = b_advantages[mb]
                # unbiased std (torch default), + a floor against a constant minibatch
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + torch.finfo(mb_adv.dtype).eps)
                policy_loss = clipped_surrogate_loss(
                    new_logprob, b_logprobs[mb], mb_adv, hp.clip_coef
                )
                value_loss = 0.5 * ((new_value - b_returns[mb]) ** 2).mean()
                loss = policy_loss - hp.ent_coef * entropy + hp.vf_coef * value_loss

                policy_opt.zero_grad()
                value_opt.zero_grad()
                self.manual_backward(loss)
                for opt in (policy_opt, value_opt):
                    self.clip_gradients(
                        opt, gradient_clip_val=hp.max_grad_norm, gradient_clip_algorithm="norm"
                    )
                policy_opt.step()
                value_opt.step()

                for key, value in (
                    ("loss", loss), ("policy_loss", policy_loss), ("value_loss", value_loss),
                    ("entropy", entropy), ("approx_kl", approx_kl),
                    ("clip_fraction", clip_fraction),
                ):
                    sums[key] += float(value.detach())
                updates += 1

        log = {f"train/{key}": total / updates for key, total in sums.items()}
        log["train/explained_variance"] = explained_variance(b_values, b_returns)
        if "episode_returns" in rollout:
            log["train/episode_reward"] = float(rollout["episode_returns"].mean())
        rate = self.env_steps_per_s(self.batch_size)
        if rate is not None:
            log["train/env_steps_per_s"] = rate
        self.log_dict(log, on_step=True, on_epoch=False, batch_size=self.batch_size)
        return torch.tensor(log["train/loss"])

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        hp = self.hparams
        return [
            torch.optim.Adam(self.policy_net.parameters(), lr=hp.policy_lr, eps=hp.adam_eps),
            torch.optim.Adam(self.value_net.parameters(), lr=hp.value_lr, eps=hp.adam_eps),
        ]
