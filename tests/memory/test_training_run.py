"""A foxhunt-train run carries its measured memory into MLflow: ``memory/*`` metrics and both
report artifacts (``memory_report.md``, ``memory_report.png``). PPO, whose rollout is
model-owned state, at reduced sizes."""

from __future__ import annotations

from mlflow.tracking import MlflowClient
from small_models import CPU, SMALL

from foxhunt.training.cell import train

# PPO's rollout as collect_rollout allocates it: num_envs x rollout_steps x (obs 17 float32,
# action int64, logprob, value, advantage, return float32)
ROLLOUT_BYTES = 4 * 8 * (17 * 4 + 8 + 4 * 4)


def test_a_training_run_logs_memory_metrics_and_both_reports(compose_cfg, tmp_path):
    cfg = compose_cfg(["model=ppo", "trainer=smoke", "data.source.days=7", "evaluation.plot_equity=false", *CPU, *SMALL["ppo"]])
    train(cfg)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("foxhunt").experiment_id])
    metrics = run.data.metrics
    for name in ("params", "grads", "optimizer", "model_state", "activations", "peak", "device_peak", "headroom"):
        assert f"memory/{name}_mb" in metrics, name
    assert metrics["memory/model_state_mb"] * 1024 * 1024 >= ROLLOUT_BYTES  # the rollout is counted
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id)}
    assert {"memory_report.md", "memory_report.png"} <= artifacts


def test_the_footprint_is_the_allocator_peak_torchs_memtracker_sees(tmp_path):
    """memory validate's measuring fit against an independent check: torch's MemTracker over a
    steady training step by hand (the optimizer state alive, Lightning's order: zero_grad, then
    backward, then the AdamW step), for both forecasters, within 1%."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from foxhunt.memory.training_run import measure_run
    from foxhunt.models.forecaster import quantile_loss
    from foxhunt.training.parts import MEASURING_RUNS, build_parts, measuring_config

    for model in ("mamba2", "tft"):
        # fp32 as the hand-made step below (the TFT's default precision=auto picks bf16 on a bf16 CPU)
        overrides = [*CPU, *SMALL[model], "precision=fp32"]
        cfg = measuring_config(model, overrides, root_dir=tmp_path, output_dir=tmp_path / "out")
        measured = measure_run(cfg, MEASURING_RUNS, workdir=tmp_path / "fit")
        assert measured.breakdown.temporaries_bytes > 0  # what live tensors and saved activations miss
        parts = build_parts(cfg)
        net = parts.model.train()
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-3)
        batch = next(iter(parts.datamodule.train_dataloader()))

        def step():
            loss = quantile_loss(net(batch).float(), batch["target"], net.quantile_levels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        step()  # the optimizer state exists from here on
        tracker = MemTracker()
        tracker.track_external(net, optimizer)
        with tracker:
            step()
        independent = sum(int(d["Total"]) for d in tracker.get_tracker_snapshot("peak").values())
        assert abs(measured.footprint.bytes - independent) <= 0.01 * independent, (model, measured.footprint.bytes, independent)
