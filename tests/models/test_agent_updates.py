"""The agents' direct updates (TradingAgent.update): the torch optimizer stepped without Lightning's
wrapper where nothing listens to it, counted in global_step as the wrapper counts it, the same updates
bit for bit; Lightning's wrapper wherever a callback, a grad scaler or a profiler needs it."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from agent_data import build_agent, cpu_trainer, env_datamodule, model_config, random_dataset
from lightning.pytorch.plugins.precision import MixedPrecision

from foxhunt.models.agent import TradingAgent, direct_updates_allowed, step_optimizer

# DQN: 30 agent steps, 24 filling the buffer and 6 learning (the 25th step stores its 100th transition, then learns); PPO: 2 training steps of 20 minibatches.
FIT_STEPS = {"dqn": 30, "ppo": 40}


class SeesEveryUpdate(L.Callback):
    """A callback on the update hooks: its fit goes through Lightning's wrapper, and it sees each update."""

    def __init__(self) -> None:
        self.backwards = 0
        self.steps = 0

    def on_after_backward(self, trainer, pl_module) -> None:
        self.backwards += 1

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.steps += 1


def _fit(name: str, callbacks: list) -> tuple:
    dataset = random_dataset(seed=5)
    cfg = model_config(name, seed=2, env={"steps_per_epoch": 1000, "episode_len": 20})
    torch.manual_seed(2)
    agent = build_agent(cfg)
    trainer = cpu_trainer(max_steps=FIT_STEPS[name], limit_val_batches=0, callbacks=callbacks)
    trainer.fit(agent, datamodule=env_datamodule(dataset, cfg))
    return agent, trainer


@pytest.mark.parametrize("name", ["dqn", "ppo"])
def test_direct_updates_take_the_updates_of_lightnings_wrapper_bit_for_bit(name):
    direct, direct_trainer = _fit(name, [])
    listener = SeesEveryUpdate()
    wrapped, wrapped_trainer = _fit(name, [listener])
    assert direct._direct_updates and not wrapped._direct_updates
    assert listener.steps == FIT_STEPS[name]  # the wrapper's hooks ran on every update of the listened fit
    assert listener.backwards == (FIT_STEPS[name] - 24 if name == "dqn" else FIT_STEPS[name])
    assert direct_trainer.global_step == wrapped_trainer.global_step == FIT_STEPS[name]
    progress = [t.fit_loop.epoch_loop.manual_optimization.optim_step_progress.total for t in (direct_trainer, wrapped_trainer)]
    assert progress[0].ready == progress[0].completed == progress[1].ready == progress[1].completed == FIT_STEPS[name]
    for (key, x), y in zip(direct.state_dict().items(), wrapped.state_dict().values()):
        assert torch.equal(x, y), key
    states = [t.optimizers[0].state_dict()["state"] for t in (direct_trainer, wrapped_trainer)]
    assert states[0].keys() == states[1].keys() and len(states[0]) > 0
    for key in states[0]:
        for field in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(states[0][key][field], states[1][key][field]), (key, field)
    for key in direct_trainer.callback_metrics:
        if key != "train/env_steps_per_s":  # a wall-clock rate
            assert torch.equal(direct_trainer.callback_metrics[key], wrapped_trainer.callback_metrics[key]), key


def test_a_grad_scaler_a_profiler_or_a_listening_callback_keeps_lightnings_wrapper():
    agent = build_agent(model_config("dqn", seed=0))
    options = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False)
    assert direct_updates_allowed(L.Trainer(**options), agent)
    assert direct_updates_allowed(L.Trainer(precision="bf16-mixed", **options), agent)  # autocast only: no scaler
    scaled = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    assert not direct_updates_allowed(L.Trainer(plugins=[scaled], **options), agent)
    assert not direct_updates_allowed(L.Trainer(profiler="simple", **options), agent)
    assert not direct_updates_allowed(L.Trainer(callbacks=[SeesEveryUpdate()], **options), agent)


def _gradients(scale: float, dtype: torch.dtype = torch.float32) -> list[torch.nn.Parameter]:
    """The parameters of an agent-sized MLP with seeded random gradients of about ``scale``."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(17, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3)).to(dtype)
    generator = torch.Generator().manual_seed(1)
    for p in net.parameters():
        p.grad = (torch.randn(p.shape, generator=generator) * scale).to(dtype)
    return list(net.parameters())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_clip_grad_norm_is_torchs_bit_for_bit(dtype):
    """TradingAgent.clip_grad_norm's CPU path (no grouping, no scaling where the coefficient is
    exactly 1) leaves every gradient as torch's clip_grad_norm_ does: below, at and above max_norm,
    at norms a rounding away from it, and with a non-finite norm."""
    norm = float(torch.nn.utils.get_total_norm([p.grad for p in _gradients(1.0, dtype)]))
    cases = [(scale, max_norm) for scale in (1e-3, 1.0, 1e3, float("inf")) for max_norm in (0.5, 10.0)]
    cases += [(1.0, norm * (1 + k * 1e-8)) for k in range(-200, 201, 7)]  # max_norm within float32 roundings of the norm
    for scale, max_norm in cases:
        ours, theirs = _gradients(scale, dtype), _gradients(scale, dtype)
        TradingAgent.clip_grad_norm(ours, max_norm)
        torch.nn.utils.clip_grad_norm_(theirs, max_norm)
        for a, b in zip(ours, theirs):
            assert torch.equal(a.grad, b.grad) or (a.grad.isnan().all() and b.grad.isnan().all()), (scale, max_norm)


def _optimized(kind: type[torch.optim.Optimizer], fused: bool) -> tuple[list[torch.nn.Parameter], torch.optim.Optimizer]:
    """Two parameter groups (different learning rates, as PPO's) of seeded parameters and their Adam(W)."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in ((64, 17), (64,), (3, 64), (3,))]
    groups = [{"params": params[:2], "lr": 1e-3}, {"params": params[2:], "lr": 3e-4}]
    return params, kind(groups, lr=1e-3, eps=1e-5, weight_decay=0.01, fused=fused)


@pytest.mark.parametrize("kind", [torch.optim.Adam, torch.optim.AdamW])
@pytest.mark.parametrize("fused", [True, False])
def test_step_optimizer_is_the_optimizers_step_bit_for_bit(kind, fused):
    """step_optimizer (the fused kernel called directly once every state exists; optimizer.step()
    otherwise) leaves the parameters and states of optimizer.step(): the first step, steps where a
    parameter has no gradient, and a step with a hook registered (which takes optimizer.step())."""
    ours, ours_optimizer = _optimized(kind, fused)
    theirs, theirs_optimizer = _optimized(kind, fused)
    generator = torch.Generator().manual_seed(3)
    seen: list[int] = []
    for step in range(8):
        grads = [torch.randn(p.shape, generator=generator) for p in ours]
        for params in (ours, theirs):
            for i, p in enumerate(params):
                p.grad = None if step in (3, 4) and i == 1 else grads[i].clone()
        if step == 6:
            handle = ours_optimizer.register_step_post_hook(lambda *_: seen.append(step))
        step_optimizer(ours_optimizer)
        theirs_optimizer.step()
        if step == 6:
            handle.remove()
        for a, b in zip(ours, theirs):
            assert torch.equal(a, b), (step, kind, fused)
    assert seen == [6]
    for state_a, state_b in zip(ours_optimizer.state_dict()["state"].values(), theirs_optimizer.state_dict()["state"].values()):
        assert state_a.keys() == state_b.keys() and all(torch.equal(state_a[k], state_b[k]) for k in state_a)
