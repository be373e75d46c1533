"""The agents' compiled step (model.module.compile_step): where auto compiles, and that a compiled fit
takes the eager fit's updates within a stated tolerance and resumes exactly. The compiled fits are
few and small (one compile per family: a new agent of the same sizes reuses the graph)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from agent_data import build_agent, cpu_trainer, env_datamodule, model_config, random_dataset

SMALL = {"dqn": {"hidden_sizes": [32]}, "ppo": {"policy_hidden_sizes": [32], "value_hidden_sizes": [32]}}
# DQN: 24 agent steps fill the buffer, 16 learn; PPO: 2 training steps of 20 minibatches.
FIT_STEPS = {"dqn": 40, "ppo": 40}
# inductor fuses and reorders the loss's float32 arithmetic (its backward included): the weights of
# a short compiled fit stay within this of the eager fit's (measured: at most 1.5e-8 (DQN), 3e-8 (PPO) apart after 40 steps).
ATOL, RTOL = 1e-5, 1e-4


def _cfg(name: str, compile_step: str):
    env = {"steps_per_epoch": 1000, "episode_len": 20}
    return model_config(name, seed=2, env=env, compile_step=compile_step, **SMALL[name])


def _fit(name: str, compile_step: str, max_steps: int, ckpt_path=None, rng_state=None):
    dataset = random_dataset(seed=5)
    cfg = _cfg(name, compile_step)
    torch.manual_seed(2)
    agent = build_agent(cfg)
    if rng_state is not None:  # PPO samples from the global generator: foxhunt's run checkpoints it, this bare fit does not
        torch.set_rng_state(rng_state)
    trainer = cpu_trainer(max_steps=max_steps, limit_val_batches=0)
    trainer.fit(agent, datamodule=env_datamodule(dataset, cfg), ckpt_path=ckpt_path)
    return agent, trainer


@pytest.mark.parametrize("name", ["dqn", "ppo"])
@pytest.mark.parametrize(
    ("compile_step", "device", "planned", "compiles"),
    [("never", "cpu", 10**9, False), ("always", "cpu", 1, True), ("auto", "meta", 10**9, False)],
)
def test_always_and_never_hold_everywhere_auto_nowhere_unmeasured(name, compile_step, device, planned, compiles):
    agent = build_agent(_cfg(name, compile_step))
    assert agent.compiles_on(device, planned) is compiles


@pytest.mark.parametrize(
    ("name", "device", "threshold"), [("ppo", "cpu", 50_000), ("ppo", "cuda", 50_000), ("dqn", "cuda", 50_000)]
)
def test_auto_compiles_where_measured_faster_once_the_fit_pays_the_compile_back(name, device, threshold):
    agent = build_agent(_cfg(name, "auto"))
    assert not agent.compiles_on(device, threshold - 1)
    assert agent.compiles_on(device, threshold)
    assert agent.compiles_on(device, float("inf"))


def test_auto_never_compiles_dqn_on_a_cpu():
    assert not build_agent(_cfg("dqn", "auto")).compiles_on("cpu", float("inf"))


class PlannedUpdates(L.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        self.planned = pl_module.planned_updates()


@pytest.mark.parametrize("name", ["dqn", "ppo"])
def test_planned_updates_count_the_fits_gradient_steps(name):
    per_batch = 25 if name == "dqn" else 20  # steps_per_call 25; PPO 10 epochs x 64 / 32
    dataset = random_dataset(seed=5)
    cfg = _cfg(name, "auto")
    agent = build_agent(cfg)
    assert agent.updates_per_batch() == per_batch
    assert agent.planned_updates() == 0  # outside a fit
    by_steps = PlannedUpdates()
    cpu_trainer(max_steps=per_batch, callbacks=[by_steps], limit_val_batches=0).fit(
        agent, datamodule=env_datamodule(dataset, cfg)
    )
    by_epochs = PlannedUpdates()
    trainer = cpu_trainer(max_steps=-1, max_epochs=2, limit_train_batches=1, limit_val_batches=0, callbacks=[by_epochs])
    trainer.fit(build_agent(cfg), datamodule=env_datamodule(dataset, cfg))
    assert (by_steps.planned, by_epochs.planned) == (per_batch, 2 * 1 * per_batch)


@pytest.mark.parametrize("value", ["yes", True, 1])
def test_a_bad_compile_step_is_one_line_naming_the_key(value, tmp_path):
    from configs import compose_train_config
    from foxhunt.config.schema import ConfigError, validate

    cfg = compose_train_config(["model=ppo", f"model.module.compile_step={value}"], tmp_path)
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert str(error.value) == f"model.module.compile_step={value!r}: must be one of auto, always, never"


@pytest.mark.parametrize("name", ["dqn", "ppo"])
def test_a_compiled_fit_takes_the_eager_updates_and_resumes_exactly(name, tmp_path):
    steps = FIT_STEPS[name]
    eager, _ = _fit(name, "never", steps)
    compiled, compiled_trainer = _fit(name, "always", steps)
    assert compiled._compiled_step and not eager._compiled_step
    assert compiled_trainer.global_step == steps
    for (key, x), y in zip(compiled.state_dict().items(), eager.state_dict().values()):
        torch.testing.assert_close(x, y, atol=ATOL, rtol=RTOL, msg=key)
    if name == "dqn":
        torch.testing.assert_close(compiled.replay.obs, eager.replay.obs, atol=0, rtol=0)  # the same actions taken

    # stopped half-way and resumed from its checkpoint: the compiled fit never stopped, bit for bit
    half = steps // 2
    _, first = _fit(name, "always", half)
    path = tmp_path / "half.ckpt"
    first.save_checkpoint(path)
    resumed, resumed_trainer = _fit(name, "always", steps, ckpt_path=path, rng_state=torch.get_rng_state())
    assert resumed_trainer.global_step == steps
    for (key, x), y in zip(resumed.state_dict().items(), compiled.state_dict().values()):
        assert torch.equal(x, y), key


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["dqn", "ppo"])
def test_cuda_graphs_step_takes_the_eager_updates(name):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    results = []
    for compile_step in ("never", "always"):
        dataset = random_dataset(seed=5)
        cfg = _cfg(name, compile_step)
        torch.manual_seed(2)
        agent = build_agent(cfg)
        trainer = cpu_trainer(max_steps=FIT_STEPS[name], limit_val_batches=0, accelerator="gpu")
        trainer.fit(agent, datamodule=env_datamodule(dataset, cfg))
        assert agent._compiled_step is (compile_step == "always")
        results.append({key: value.cpu() for key, value in agent.state_dict().items()})
    for key, value in results[1].items():
        torch.testing.assert_close(value, results[0][key], atol=ATOL, rtol=RTOL, msg=key)
