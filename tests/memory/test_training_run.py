"""A foxhunt-train run carries its measured memory into MLflow: ``memory/*`` metrics and both
report artifacts (``memory_report.md``, ``memory_report.png``). PPO, whose rollout is
model-owned state, at reduced sizes."""

from __future__ import annotations

from mlflow.tracking import MlflowClient
from small_fleet import CPU, SMALL

from foxhunt.train import train

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
