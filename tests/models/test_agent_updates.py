"""The agents' direct updates (TradingAgent.update): the torch optimizer stepped without Lightning's
wrapper where nothing listens to it, counted in global_step as the wrapper counts it, the same updates
bit for bit; Lightning's wrapper wherever a callback, a grad scaler or a profiler needs it."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from agent_data import build_agent, cpu_trainer, env_datamodule, model_config, random_dataset
from lightning.pytorch.plugins.precision import MixedPrecision

from foxhunt.models.agent import direct_updates_allowed

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
