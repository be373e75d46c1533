"""Reduced sizes of the four models for fast memory tests (same code paths as the default sizes)."""

from __future__ import annotations

#: The tests compare accounted figures: keep the fits on the CPU on a machine with a GPU too.
CPU = ["trainer.accelerator=cpu"]

SMALL = {
    "dqn": [
        "model.module.hidden_sizes=[16]",
        "model.module.replay_capacity=256",
        "model.module.min_replay_size=8",
        "model.env.num_envs=4",
    ],
    "ppo": [
        "model.module.policy_hidden_sizes=[16]",
        "model.module.value_hidden_sizes=[16]",
        "model.env.num_envs=4",
        "model.module.rollout_steps=8",
        "model.module.update_epochs=1",
    ],
    "mamba2": [
        "model.module.d_model=16",
        "model.module.n_layers=1",
        "model.module.d_state=8",
        "model.module.headdim=8",
        "model.module.chunk_size=16",
        "model.window.seq_len=20",
    ],
    "tft": [
        "model.module.hidden_size=16",
        "model.module.num_heads=2",
        "model.module.lstm_layers=1",
        "model.window.seq_len=20",
    ],
}
#: The config key each model's activations scale with, and two batch sizes to check it at.
BATCHES = {
    "dqn": ("model.module.batch_size", (16, 48)),
    "ppo": ("model.module.minibatch_size", (8, 32)),
    "mamba2": ("model.window.batch_size", (16, 48)),
    "tft": ("model.window.batch_size", (16, 48)),
}


def prefixed(models=tuple(SMALL)) -> list[str]:
    """The reduced sizes as ``foxhunt memory validate`` per-model overrides."""
    return [f"{name}:{item}" for name in models for item in SMALL[name]]
