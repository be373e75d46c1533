"""Every model trains a smoke run through ``foxhunt-train``'s ``train`` at ``precision=int8`` and
``precision=bf16``: fit, validation, checkpoint, test from the best checkpoint, backtest."""

from __future__ import annotations

import math

import pytest

from foxhunt.training.cell import train

# Small enough for seconds on CPU; every model keeps layers big enough to be int8
# (min_quantized_numel lowered below), and DQN learns within the few steps.
SMALL = {
    "dqn": ["model.module.hidden_sizes=[64,64]", "model.module.min_replay_size=8"],
    "ppo": ["model.module.policy_hidden_sizes=[64]", "model.module.value_hidden_sizes=[64]",
            "model.module.update_epochs=1"],
    "mamba2": ["model.module.d_model=32", "model.module.n_layers=1"],
    "tft": ["model.module.hidden_size=16", "model.module.lstm_layers=1"],
}  # fmt: skip
FAST = ["trainer=smoke", "logger=none", "data.source.days=3", "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "evaluation.plot_equity=false"]  # fmt: skip
INT8 = ["precision=int8", "precision.min_quantized_numel=256", "precision.compile_optimizer=false"]


@pytest.mark.parametrize("model", list(SMALL))
def test_int8_smoke_run_trains_int8_layers_and_logs_the_list(compose_cfg, tmp_path, model):
    metrics = train(compose_cfg([f"model={model}", *FAST, *INT8, *SMALL[model]]))
    assert math.isfinite(metrics["test/sharpe"]) and math.isfinite(metrics["test/pnl"])
    assert "test/pnl" in metrics
    listing = (tmp_path / "outputs" / "run" / "quantized_layers.txt").read_text()
    assert "precision: int8 (weights int8, optimizer states fp8)" in listing
    count = int(listing.split("# int8 (")[1].split(")")[0])
    assert count >= 2, listing


@pytest.mark.parametrize("model", list(SMALL))
def test_bf16_smoke_run(compose_cfg, tmp_path, model):
    metrics = train(compose_cfg([f"model={model}", *FAST, "precision=bf16", *SMALL[model]]))
    assert "test/pnl" in metrics and "val/sharpe" in metrics
    assert not (tmp_path / "outputs" / "run" / "quantized_layers.txt").exists()
