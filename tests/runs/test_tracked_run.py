"""A run in the store: one SQLite store, flattened params, and a run status for every ending."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from foxhunt.runs.store import PARAM_VALUE_LIMIT, RunStore, param_value
from foxhunt.runs.tracked_run import TrackedRun, flatten


@pytest.fixture
def store(tmp_path):
    return f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}", str(tmp_path / "mlruns" / "artifacts")


def _run(store, name="tft-es-fp32"):
    uri, artifacts = store
    return TrackedRun(uri, "unit", artifacts, name, {"model": "tft", "asset": "es"})


def test_flatten_gives_dotted_keys_and_keeps_lists():
    nested = {"model": {"module": {"lr": 0.001, "hidden": [256, 256]}, "name": "dqn"}, "seed": 1}
    assert dict(flatten(nested)) == {
        "model.module.lr": 0.001,
        "model.module.hidden": [256, 256],
        "model.name": "dqn",
        "seed": 1,
    }


def test_param_values_are_truncated_to_mlflows_limit():
    assert param_value("x" * 10) == "x" * 10
    long = param_value("y" * (PARAM_VALUE_LIMIT + 50))
    assert len(long) == PARAM_VALUE_LIMIT and long.endswith("...")


def test_experiment_is_created_once_with_the_training_view_tag(store):
    uri, artifacts = store
    first = RunStore(uri).ensure_experiment("unit", artifacts)
    assert RunStore(uri).ensure_experiment("unit", artifacts) == first
    experiment = MlflowClient(uri).get_experiment(first)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert experiment.artifact_location.endswith("mlruns/artifacts")


def test_finished_run_has_params_config_and_tags(store):
    with _run(store) as run:
        run.log_config({"model": {"module": {"lr": 0.001}}, "seed": 7}, "seed: 7\n")
        run.log_metrics({"test/sharpe": 1.25})
    data = MlflowClient(store[0]).get_run(run.run_id)
    assert data.info.status == "FINISHED"
    assert data.info.run_name == "tft-es-fp32"
    assert data.data.params == {"model.module.lr": "0.001", "seed": "7"}
    assert data.data.metrics["test/sharpe"] == 1.25
    assert data.data.tags["model"] == "tft" and data.data.tags["asset"] == "es"
    names = [a.path for a in MlflowClient(store[0]).list_artifacts(run.run_id)]
    assert "config.yaml" in names


def test_failing_run_is_marked_failed_with_its_error(store):
    with pytest.raises(RuntimeError, match="loss is NaN"):
        with _run(store) as run:
            raise RuntimeError("loss is NaN\nat step 3")
    data = MlflowClient(store[0]).get_run(run.run_id)
    assert data.info.status == "FAILED"
    assert data.data.tags["error"] == "RuntimeError: loss is NaN at step 3"
    assert "error.txt" in [a.path for a in MlflowClient(store[0]).list_artifacts(run.run_id)]


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_stopped_run_is_marked_killed(store, stop):
    with pytest.raises(stop):
        with _run(store) as run:
            raise stop()
    assert MlflowClient(store[0]).get_run(run.run_id).info.status == "KILLED"


def test_nested_run_carries_its_parent(store):
    uri, artifacts = store
    parent_id = MlflowClient(uri).create_run(RunStore(uri).ensure_experiment("unit", artifacts)).info.run_id
    with TrackedRun(uri, "unit", artifacts, "dqn-es-fp32", {"model": "dqn"}, parent_run_id=parent_id) as run:
        pass
    assert MlflowClient(uri).get_run(run.run_id).data.tags["mlflow.parentRunId"] == parent_id


def test_reopened_run_continues_and_ends_finished(store):
    uri, artifacts = store
    with pytest.raises(KeyboardInterrupt):
        with _run(store) as first:
            first.log_config({"seed": 7, "paths": {"output_dir": "/a"}}, "seed: 7\n")
            first.log_metrics({"train/loss": 2.0}, step=1)
            raise KeyboardInterrupt()
    client = MlflowClient(uri)
    client.set_tag(first.run_id, "error", "old error")
    # reopened under another name (a search's retry resumes its failed trial's run as trial<N+1>): the run takes it,
    # as it takes the retry's tags (it kept the first name while tagged with the retry's trial)
    name = "tft-es-fp32-trial2"
    with TrackedRun(uri, "unit", artifacts, name, {"model": "tft", "trial": "2"}, resume_run_id=first.run_id) as again:
        assert client.get_run(first.run_id).info.status == "RUNNING"
        # a changed folder must not trip MLflow's "params cannot change" rule
        again.log_config({"seed": 7, "paths": {"output_dir": "/b"}}, "seed: 7\n")
        again.log_metrics({"train/loss": 1.0}, step=2)
    assert again.run_id == first.run_id
    data = client.get_run(first.run_id)
    assert data.info.status == "FINISHED"
    assert data.data.tags["resume_count"] == "1" and "error" not in data.data.tags
    assert (data.info.run_name, data.data.tags["mlflow.runName"], data.data.tags["trial"]) == (name, name, "2")
    assert "stop_reason" not in data.data.tags  # the first attempt's KeyboardInterrupt is not why this one ended
    assert data.data.params["paths.output_dir"] == "/a"
    assert [m.value for m in client.get_metric_history(first.run_id, "train/loss")] == [2.0, 1.0]
    assert len(client.search_runs([data.info.experiment_id])) == 1


def test_system_metrics_are_logged_while_the_block_runs_and_their_thread_ends_with_it(store, capfd):
    """The run's System metrics tab: MLflow's system/* series, sampled while the block runs; no
    sampling thread outlives it, nothing printed (MLflow's info lines about it are quieted)."""
    import threading
    import time
    import warnings

    with warnings.catch_warnings(record=True) as caught, _run(store) as run:
        warnings.simplefilter("always")
        with run.system_metrics(0.2):
            time.sleep(1.0)
        assert not [t for t in threading.enumerate() if t.name == "SystemMetricsMonitor"]
        with run.system_metrics(None):  # off: no thread, nothing logged
            assert not [t for t in threading.enumerate() if t.name == "SystemMetricsMonitor"]
    logged = set(RunStore(store[0]).get(run.run_id).metrics)
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= logged
    history = MlflowClient(store[0]).get_metric_history(run.run_id, "system/cpu_utilization_percentage")
    assert len(history) >= 2 and [m.step for m in history] == list(range(len(history)))
    assert [str(w.message) for w in caught if "mlflow" in str(w.filename)] == []
    assert "system metrics" not in capfd.readouterr().err.lower()
