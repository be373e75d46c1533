"""Section 1: RL training throughput of foxhunt's PPO and DQN against Stable-Baselines3 and the limit.

Three sides, at the default config's hyperparameters (``conf/model/{ppo,dqn}.yaml``), on the training split
of the same market dataset, interleaved per repeat, each training on the settings' ``device`` (``cuda``:
the networks and the replay on the GPU, the env on the CPU as in a fit; the clock read after a
synchronize; ``compile_step=always`` then compiles with CUDA graphs):

- **foxhunt**: the agent trained by a Lightning ``Trainer`` as ``foxhunt-train`` builds it (the
  model's own logging at ``trainer.log_every_n_steps``), without the MLflow logger and the
  callbacks (section 4 measures those); its torch-vectorized :class:`~foxhunt.trading.env.TradingEnv`.
- **Stable-Baselines3**: its PPO / DQN on the same environment through the gymnasium wrapper
  (:class:`~foxhunt.trading.env.TradingGymEnv`, one per env, in SB3's ``DummyVecEnv`` with its
  ``Monitor``, as ``make_vec_env`` builds them), with the same network sizes and activation,
  rollout (n_envs x n_steps), minibatch, epochs, replay, learning start, target interval (SB3
  counts env steps: interval x n_envs) and gradient steps per env step. Differences SB3 cannot
  express: one Adam for policy and value (foxhunt: one each, with their own learning rates),
  joint gradient clipping, plain (not double) DQN targets; they change no work per step.
- **bare loop** (the limit): only the gradient steps, with the agent's own networks, optimizers
  (cleared and stepped as the agent does, :func:`foxhunt.models.agent.clear_gradients` and
  :func:`~foxhunt.models.agent.step_optimizer`), clipping
  and loss functions (:func:`foxhunt.models.ppo.ppo_minibatch_losses`,
  :func:`foxhunt.models.dqn.double_dqn_loss`) on fixed random batches of the same sizes: no
  environment, no rollout, no replay writes, no Lightning, no logging.

- **env side alone** (for the decomposition, no goal): foxhunt's own acting and environment
  work of the same training steps, outside Lightning and without gradient steps (DQN:
  epsilon-greedy action, env step, replay write; PPO: ``collect_rollout``, GAE included). The
  report derives the ceiling any framework could reach against the bare loop while doing this
  work, ``bare time / (bare time + env time)``, and what is left for the framework's loop.

Throughput is env steps per second over the timed training steps (after ``warmup_steps``):
PPO does ``num_envs x rollout_steps`` env steps and ``update_epochs x batch / minibatch``
gradient steps per training step; DQN ``num_envs`` env steps and one gradient step per agent
step (``rl.dqn`` counts agent steps; foxhunt's DQN runs ``model.module.steps_per_call`` of them
per ``training_step`` call, so its side times ``ceil(steps / steps_per_call)`` calls).
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from hydra.utils import get_class
from omegaconf import OmegaConf

from foxhunt.bench.context import BenchContext
from foxhunt.bench.measure import (
    Clock,
    Timing,
    first_step_timer,
    interleaved,
    median,
    paired_ratio,
    paired_ratios,
    torch_threads,
    train_batch_timer,
)
from foxhunt.bench.report import Row
from foxhunt.models.agent import ACTIVATIONS, TradingAgent, clear_gradients, step_optimizer
from foxhunt.models.dqn import ReplayBuffer, double_dqn_loss
from foxhunt.models.ppo import categorical_log_prob_entropy, ppo_minibatch_losses
from foxhunt.trading.env import NUM_ACTIONS, TradingEnv, TradingGymEnv
from foxhunt.training.parts import build_datamodule, build_model, build_precision

# Lazy imports: (b) stable_baselines3, the peer: the optional bench extra (foxhunt[bench]); without it its rows are skipped

ALGORITHMS = ("ppo", "dqn")


def sb3_available() -> bool:
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return False
    return True


def env_steps_per_training_step(cfg) -> int:
    """Env steps of one training step of the settings (PPO: a rollout; DQN: an agent step)."""
    steps = int(cfg.model.env.num_envs)
    if cfg.model.name == "ppo":
        steps *= int(cfg.model.module.rollout_steps)
    return steps


def steps_per_call(cfg) -> int:
    """Training steps of the settings one foxhunt ``training_step`` call takes."""
    return int(cfg.model.module.get("steps_per_call", 1)) if cfg.model.name == "dqn" else 1


def compiles_in_long_fits(cfg, device: str) -> bool:
    """Whether ``compile_step: auto`` compiles the agent of ``cfg`` on ``device`` in a fit long
    enough (its ``compile_pays_after``; on a GPU with CUDA graphs): the benchmark's fits are short,
    so auto runs them eager, and the compiled side is measured apart (``compile_step: always``)."""
    agent_class: type[TradingAgent] = get_class(cfg.model.module._target_)
    return device in agent_class.compile_pays_after


# ----------------------------------------------------------------------------------- foxhunt
def foxhunt_run(cfg, dataset, warmup: int, steps: int, compile_step: str | None = None, device: str = "cpu") -> Timing:
    """Train a fresh agent on ``device`` for ``warmup + steps`` training steps; time the last
    ``steps`` (rounded up to whole ``training_step`` calls); ``extra['first_step_s']``: the first
    training step's wall time. ``compile_step``: that ``model.module.compile_step`` (None: the config's)."""
    per_call = steps_per_call(cfg)
    warmup, steps = -(-warmup // per_call), -(-steps // per_call)  # training_step calls
    cfg = cfg.copy()
    OmegaConf.update(cfg, "model.env.steps_per_epoch", max(int(cfg.model.env.steps_per_epoch), warmup + steps))
    if compile_step is not None:
        OmegaConf.update(cfg, "model.module.compile_step", compile_step)
    pl.seed_everything(cfg.seed, verbose=False)
    datamodule = build_datamodule(cfg, dataset)
    model = build_model(cfg)
    timer = train_batch_timer(warmup, device)
    first = first_step_timer()
    trainer = pl.Trainer(
        accelerator=device,
        devices=1,
        max_epochs=1,
        limit_train_batches=warmup + steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        callbacks=[timer, first],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=int(cfg.trainer.log_every_n_steps),
        plugins=[build_precision(cfg, accelerator=device)],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=datamodule)
    if timer.timed != steps:
        raise RuntimeError(f"bench rl: timed {timer.timed} training steps, expected {steps}")
    return timer.clock.timing(work=steps * per_call * env_steps_per_training_step(cfg), first_step_s=first.seconds)


# ----------------------------------------------------------------------------------- SB3
def sb3_model(cfg, dataset, device: str = "cpu") -> Any:
    """Stable-Baselines3's PPO or DQN for ``cfg.model`` on the gymnasium wrapper of the env, its
    networks on ``device``."""
    from stable_baselines3 import DQN, PPO
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    datamodule = build_datamodule(cfg, dataset)
    features, close = datamodule.split_tensors("train")
    num_envs = int(cfg.model.env.num_envs)

    def factory(index: int):
        def build():
            env = TradingEnv(
                features,
                close,
                dataset.asset,
                num_envs=1,
                episode_len=int(cfg.model.env.episode_len),
                commission_usd=datamodule.commission_usd,
                slippage_ticks=datamodule.slippage_ticks,
                seed=int(cfg.seed) + index,
            )
            return Monitor(TradingGymEnv(env))

        return build

    venv = DummyVecEnv([factory(i) for i in range(num_envs)])
    m = cfg.model.module
    activation = ACTIVATIONS[m.activation]
    if cfg.model.name == "ppo":
        return PPO(
            "MlpPolicy",
            venv,
            n_steps=int(m.rollout_steps),
            batch_size=int(m.minibatch_size),
            n_epochs=int(m.update_epochs),
            learning_rate=float(m.policy_lr),
            gamma=float(m.gamma),
            gae_lambda=float(m.gae_lambda),
            clip_range=float(m.clip_coef),
            ent_coef=float(m.ent_coef),
            vf_coef=float(m.vf_coef),
            max_grad_norm=float(m.max_grad_norm),
            policy_kwargs={
                "net_arch": {"pi": list(m.policy_hidden_sizes), "vf": list(m.value_hidden_sizes)},
                "activation_fn": activation,
                "optimizer_kwargs": {"eps": float(m.adam_eps)},
            },
            device=device,
            seed=int(cfg.seed),
            verbose=0,
        )
    return DQN(
        "MlpPolicy",
        venv,
        learning_rate=float(m.lr),
        buffer_size=int(m.replay_capacity),
        learning_starts=int(m.min_replay_size),
        batch_size=int(m.batch_size),
        gamma=float(m.gamma),
        train_freq=1,
        gradient_steps=1,
        target_update_interval=int(m.target_update_interval) * num_envs,
        exploration_initial_eps=float(m.epsilon_start),
        exploration_final_eps=float(m.epsilon_end),
        max_grad_norm=float(m.max_grad_norm) if m.max_grad_norm is not None else float("inf"),
        policy_kwargs={"net_arch": list(m.hidden_sizes), "activation_fn": activation},
        device=device,
        seed=int(cfg.seed),
        verbose=0,
    )


def sb3_run(cfg, dataset, warmup: int, steps: int, device: str = "cpu") -> Timing:
    """SB3 learns ``warmup`` training steps' worth of env steps, then ``steps``' worth, timed."""
    model = sb3_model(cfg, dataset, device)
    per_step = env_steps_per_training_step(cfg)
    model.learn(total_timesteps=warmup * per_step)
    clock = Clock(device)
    clock.start()
    model.learn(total_timesteps=steps * per_step, reset_num_timesteps=False)
    clock.stop()
    return clock.timing(work=steps * per_step)


# ----------------------------------------------------------------------------------- bare loop
def bare_run(cfg, warmup: int, steps: int, device: str = "cpu") -> Timing:
    """Only the gradient steps of ``warmup + steps`` training steps on ``device``; the last
    ``steps`` timed."""
    pl.seed_everything(cfg.seed, verbose=False)
    agent = build_model(cfg).to(device)
    update = _bare_ppo_update(agent) if cfg.model.name == "ppo" else _bare_dqn_update(agent)
    for _ in range(warmup):
        update()
    clock = Clock(device)
    clock.start()
    for _ in range(steps):
        update()
    clock.stop()
    return clock.timing(work=steps * env_steps_per_training_step(cfg))


# ----------------------------------------------------------------------------------- env side
def env_run(cfg, dataset, warmup: int, steps: int, device: str = "cpu") -> Timing:
    """foxhunt's acting and env work of ``warmup + steps`` training steps, the last ``steps``
    timed: the agent's own methods (its networks on ``device``) on the training env of
    ``build_datamodule``, no Lightning."""
    pl.seed_everything(cfg.seed, verbose=False)
    datamodule = build_datamodule(cfg, dataset)
    datamodule.setup("fit")
    agent = build_model(cfg).to(device)
    agent.train_env = datamodule.make_env("train", num_envs=agent.num_envs, seed=agent.seed)
    agent.on_train_start()  # what the fit does first: env reset (DQN: empty replay buffer)
    if cfg.model.name == "ppo":
        step = agent.collect_rollout
    else:
        done_steps = itertools.count()
        step = lambda: agent.collect_step(agent.epsilon(next(done_steps)))  # noqa: E731
    with torch.no_grad():
        for _ in range(warmup):
            step()
        clock = Clock(device)
        clock.start()
        for _ in range(steps):
            step()
        clock.stop()
    return clock.timing(work=steps * env_steps_per_training_step(cfg))


def _bare_ppo_update(agent):
    hp = agent.hparams
    optimizer = agent.configure_optimizers()
    policy_params, value_params = list(agent.policy_net.parameters()), list(agent.value_net.parameters())
    generator = torch.Generator().manual_seed(int(hp.seed))
    size, device = agent.batch_size, agent.device
    obs = torch.randn(size, agent.obs_dim, generator=generator).to(device)
    actions = torch.randint(0, NUM_ACTIONS, (size,), generator=generator).to(device)
    with torch.no_grad():
        logprobs, _ = categorical_log_prob_entropy(agent.policy_net(obs), actions)
    advantages = torch.randn(size, generator=generator).to(device)
    returns = torch.randn(size, generator=generator).to(device)
    batch = (obs, actions, logprobs, advantages, returns)

    def update() -> None:
        for _ in range(hp.update_epochs):
            order = torch.randperm(size, device=device)
            shuffled = [tensor[order] for tensor in batch]
            for start in range(0, size, hp.minibatch_size):
                obs_b, actions_b, logprobs_b, advantages_b, returns_b = (
                    tensor[start : start + hp.minibatch_size] for tensor in shuffled
                )
                loss, _ = ppo_minibatch_losses(
                    agent.policy_net,
                    agent.value_net,
                    obs_b,
                    actions_b,
                    logprobs_b,
                    advantages_b,
                    returns_b,
                    clip_coef=hp.clip_coef,
                    vf_coef=hp.vf_coef,
                    ent_coef=hp.ent_coef,
                    with_stats=False,
                )
                clear_gradients(optimizer)
                loss.backward()
                agent.clip_grad_norm(policy_params, hp.max_grad_norm)
                agent.clip_grad_norm(value_params, hp.max_grad_norm)
                step_optimizer(optimizer)

    return update


def _bare_dqn_update(agent):
    hp = agent.hparams
    optimizer = agent.configure_optimizers()
    params = list(agent.q_net.parameters())
    replay = ReplayBuffer(hp.replay_capacity, agent.obs_dim, agent.device, int(hp.seed))
    generator = torch.Generator().manual_seed(int(hp.seed))
    count = int(hp.replay_capacity)
    replay.add(
        torch.randn(count, agent.obs_dim, generator=generator),
        torch.randint(0, NUM_ACTIONS, (count,), generator=generator),
        torch.randn(count, generator=generator),
        torch.randn(count, agent.obs_dim, generator=generator),
        torch.zeros(count),
    )
    step = [0]

    def update() -> None:
        loss, _ = double_dqn_loss(agent.q_net, agent.target_net, replay.sample(hp.batch_size), hp.gamma)
        clear_gradients(optimizer)
        loss.backward()
        agent.clip_grad_norm(params, hp.max_grad_norm)
        step_optimizer(optimizer)
        step[0] += 1
        if step[0] % hp.target_update_interval == 0:
            agent.target_net.load_state_dict(agent.q_net.state_dict())

    return update


# ----------------------------------------------------------------------------------- section
def run_section(ctx: BenchContext) -> tuple[list[Row], list[str]]:
    """Rows of section 1 at every thread count; notes (e.g. SB3 missing)."""
    settings = ctx.settings
    goals = settings.goals
    device = str(settings.device)
    with_sb3 = sb3_available()
    notes = [] if with_sb3 else ["Stable-Baselines3 is not installed (pip install '.[bench]'): no SB3 rows"]
    rows: list[Row] = []
    for algo in ALGORITHMS:
        cfg = ctx.compose(algo)
        dataset = ctx.dataset(cfg)
        node = settings.rl[algo]
        warmup, steps = int(node.warmup_steps), int(node.steps)
        runners = {"foxhunt": lambda: foxhunt_run(cfg, dataset, warmup, steps, device=device)}
        compiled = compiles_in_long_fits(cfg, device)
        if compiled:  # auto's choice in a long fit: its steady state apart, its compile time apart
            runners["compiled"] = lambda: foxhunt_run(cfg, dataset, warmup, steps, compile_step="always", device=device)
        if with_sb3:
            runners["sb3"] = lambda: sb3_run(cfg, dataset, warmup, steps, device)
        runners["bare"] = lambda: bare_run(cfg, warmup, steps, device)
        runners["env"] = lambda: env_run(cfg, dataset, warmup, steps, device)
        for threads in settings.threads:
            ctx.log(f"rl: {algo} at {threads} thread(s), {settings.repeats} interleaved repeats")
            with torch_threads(int(threads)):
                results = interleaved(runners, int(settings.repeats))
            rates = {side: [t.rate for t in timings] for side, timings in results.items()}
            cpu_rates = {side: [t.cpu_rate for t in timings] for side, timings in results.items()}
            samples = {side: [t.to_dict() for t in timings] for side, timings in results.items()}
            for ours, prefix in (("foxhunt", ""), ("compiled", "compiled ")):
                for side, label, goal in (
                    ("sb3", "Stable-Baselines3", goals.rl_vs_sb3),
                    ("bare", "bare gradient-step loop", goals.rl_vs_bare),
                ):
                    if ours not in results or side not in results:
                        continue
                    rows.append(
                        Row.paired(
                            paired_ratios(rates[ours], rates[side], float(settings.confidence)),
                            section="rl",
                            name=f"{algo.upper()} {prefix}vs {label}",
                            threads=int(threads),
                            unit="env-steps/s",
                            foxhunt=median(rates[ours]),
                            reference=median(rates[side]),
                            goal_op=">=",
                            goal=float(goal),
                            cpu_figure=paired_ratio(cpu_rates[ours], cpu_rates[side]),
                            samples={ours: samples[ours], side: samples[side]},
                            note=_path_note(ours),
                        )
                    )
            if compiled:
                rows.append(_compile_time_row(algo, int(threads), results, first_in_process=threads == settings.threads[0]))
            rows.extend(_decomposition_rows(algo, int(threads), results, float(settings.confidence)))
    return rows, notes


def _path_note(side: str) -> str:
    if side == "compiled":
        return "compile_step=always: the compiled loss of a long fit (auto's choice there), steady state; compile time apart"
    return "the default config: direct updates, compile_step=auto (eager in a fit this short)"


def _compile_time_row(algo: str, threads: int, results: dict[str, list[Timing]], first_in_process: bool) -> Row:
    """The compiled side's compile time: its first training step's wall time less an eager
    fit's first step (the first repeat's: later fits in the process reuse the compiled graph;
    inductor's on-disk cache may make even the first one warm). At a later thread count the graph
    was compiled earlier in this process: what remains is dynamo's guards and any recompile."""
    compiled, eager = results["compiled"][0].extra["first_step_s"], results["foxhunt"][0].extra["first_step_s"]
    seconds = compiled - eager
    when = (
        "the first compile of this process"
        if first_in_process
        else "the graph compiled earlier in this process (guards, recompiles only)"
    )
    return Row(
        section="rl",
        name=f"{algo.upper()} compile time (first compiled training step - first eager one)",
        threads=threads,
        unit="s",
        foxhunt=seconds,
        reference=None,
        figure=seconds,
        figure_kind="value",
        goal_op=None,
        goal=None,
        note=f"first compiled step {compiled:.2f} s, first eager step {eager:.3f} s, first repeat at these threads: {when}",
    )


def _decomposition_rows(algo: str, threads: int, results: dict[str, list[Timing]], confidence: float) -> list[Row]:
    """Where foxhunt's step time goes, per repeat (seconds per env step, medians): the bare
    gradient steps, the env side, and the rest (Lightning's loop, hooks and logging); with
    Stable-Baselines3 measured, the best ratio to it that foxhunt's gradient step and env side
    allow (no framework at all)."""
    per_step = {side: [t.wall_s / t.work for t in results[side]] for side in ("foxhunt", "bare", "env")}
    extra: list[Row] = []
    if "sb3" in results:
        sb3_per_step = [t.wall_s / t.work for t in results["sb3"]]
        floor_per_step = [b + e for b, e in zip(per_step["bare"], per_step["env"])]
        extra.append(
            Row.paired(
                paired_ratios(sb3_per_step, floor_per_step, confidence),
                section="rl",
                name=f"{algo.upper()} ceiling vs Stable-Baselines3 ((bare + env side) rate / SB3's)",
                threads=threads,
                unit="env-steps/s",
                foxhunt=1.0 / median(floor_per_step),
                reference=1.0 / median(sb3_per_step),
                goal_op=None,
                goal=None,
                note="the best ratio to Stable-Baselines3 any framework can reach with foxhunt's eager gradient step and env side",
            )
        )
    ceiling = median([b / (b + e) for b, e in zip(per_step["bare"], per_step["env"])])
    rest = median([(f - b - e) / f for f, b, e in zip(per_step["foxhunt"], per_step["bare"], per_step["env"])])
    env_share = median([e / f for f, e in zip(per_step["foxhunt"], per_step["env"])])
    base: dict[str, Any] = {
        "section": "rl",
        "threads": threads,
        "unit": "ratio",
        "figure_kind": "ratio",
        "reference": None,
        "goal_op": None,
        "goal": None,
    }
    return [
        Row(
            name=f"{algo.upper()} ceiling vs bare (bare / (bare + env side))",
            foxhunt=ceiling,
            figure=ceiling,
            note="the best ratio to the bare loop any framework can reach doing this env work",
            **base,
        ),
        Row(
            name=f"{algo.upper()} env side share of foxhunt's step",
            foxhunt=env_share,
            figure=env_share,
            note="acting + env step + replay write (PPO: rollout + GAE), timed alone",
            **base,
        ),
        Row(
            name=f"{algo.upper()} framework share of foxhunt's step",
            foxhunt=rest,
            figure=rest,
            note=(
                "foxhunt step - bare gradient steps - env side: Lightning's loop, hooks, logging; an upper bound "
                "on them, as whatever else makes a fit slower than its parts timed alone counts here too"
            ),
            **base,
        ),
        *extra,
    ]
