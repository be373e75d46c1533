"""``foxhunt memory compare``: the report's fields, its MLflow run, and int8 inference copies."""

from __future__ import annotations

import math

import pytest
import torch
from mlflow.tracking import MlflowClient
from precision_helpers import load_policy

from foxhunt.config.schema import ConfigError
from foxhunt.precision.inference import int8_inference_model
from foxhunt.training.memory_compare import REPORT_JSON, REPORT_TEXT, run_compare


def test_compare_reports_every_field_and_logs_the_report_to_mlflow(tmp_path):
    overrides = ["model=dqn", "data.source.days=3", "model.module.min_replay_size=8",
                 "precision.compile_optimizer=false"]  # fmt: skip
    report = run_compare(overrides, steps=4, warmup=1, latency_calls=10, latency_warmup=2, root=tmp_path)

    rows = {row.name: row for row in report.components}
    assert list(rows) == ["parameters", "gradients", "optimizer state", "activations", "other", "temporaries", "total"]
    assert rows["parameters"].int8_mb < 0.3 * rows["parameters"].fp32_mb
    assert rows["optimizer state"].int8_mb < 0.3 * rows["optimizer state"].fp32_mb
    assert rows["gradients"].reduction_mb == pytest.approx(0.0, abs=1e-9)  # fp32 gradients in both
    assert rows["total"].fp32_mb == pytest.approx(sum(r.fp32_mb for r in report.components[:-1]))
    assert rows["parameters"].reduction_pct == pytest.approx(100 * (1 - rows["parameters"].int8_mb / rows["parameters"].fp32_mb))
    assert report.params_optimizer_pct == pytest.approx(26.9, abs=0.2)  # as the hand count of the DQN
    for field in (report.step_ms, report.throughput, report.latency_p50_ms, report.latency_p99_ms):
        assert set(field) == {"fp32", "int8"} and all(v > 0 for v in field.values())
    assert report.latency_p99_ms["int8"] >= report.latency_p50_ms["int8"]
    assert report.step_time_ratio == pytest.approx(report.step_ms["int8"] / report.step_ms["fp32"])
    assert report.throughput["fp32"] == pytest.approx(4 / (report.step_ms["fp32"] / 1e3))  # 4 envs per step
    assert report.accuracy_metric == "val/mean_reward" and all(math.isfinite(v) for v in report.accuracy.values())
    assert report.inference_config == "weight_only" and report.int8_tensors == 4  # 2 layers x (online, target)

    text = report.text()
    for needle in ("fp32 MB", "int8 MB", "reduction MB", "reduction %", "training step, median ms",
                   "inference b=1, p50 ms", "inference b=1, p99 ms", "val/mean_reward (val)",
                   "parameters + optimizer state: int8 =", "optimizer state  fp32 |#"):  # fmt: skip
        assert needle in text, needle

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("foxhunt").experiment_id])
    assert run.info.run_name == "dqn-es-compare" and run.info.status == "FINISHED"
    assert run.data.metrics["compare/params_optimizer_pct"] == pytest.approx(report.params_optimizer_pct)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {REPORT_TEXT, REPORT_JSON, "int8", "fp32"} <= artifacts
    assert "int8/quantized_layers.txt" in {a.path for a in client.list_artifacts(run.info.run_id, "int8")}


def test_compare_refuses_a_precision_override(tmp_path):
    with pytest.raises(ConfigError, match="precision=bf16: the compare command sets precision itself"):
        run_compare(["precision=bf16"], steps=1, warmup=1, latency_calls=1, latency_warmup=0, root=tmp_path)


@pytest.mark.parametrize("trained_in", ["fp32", "int8"])
@pytest.mark.parametrize("config", ["weight_only", "dynamic_activation"])
def test_int8_inference_copy_of_a_trained_model_is_close_and_leaves_the_model_alone(build, trained_in, config):
    from foxhunt.precision.inference import int8_matmul_error
    from foxhunt.precision.quantize import is_int8_weight, quantize_model

    policy = load_policy("int8", min_quantized_numel=256)
    model, _ = build("tft", "model.module.hidden_size=16", "model.module.lstm_layers=1")
    if trained_in == "int8":
        quantize_model(model, policy)
    model.eval()
    batch = {"static": torch.randn(2, 4), "known": torch.randn(2, 60, 8), "observed": torch.randn(2, 50, 4)}
    with torch.no_grad():
        expected = model(batch)
    copy = int8_inference_model(model, policy, config)
    with torch.inference_mode():
        got = copy(batch)
    assert type(copy.attention.query.weight).__name__ == "Int8Tensor"  # torchao's inference weight
    assert type(copy.quantile_head.linear.weight) is torch.nn.Parameter  # the head stays fp32
    assert is_int8_weight(copy.encoder_lstm.weight_ih_l0)
    # where int8 x int8 products are inexact (a CPU without VNNI) the copy falls back to weight_only
    assert copy.int8_config == (config if int8_matmul_error("cpu") is None else "weight_only")
    torch.testing.assert_close(got, expected, atol=0.05, rtol=0.05)
    assert is_int8_weight(model.attention.query.weight) == (trained_in == "int8")  # original untouched
