"""resume=true: which earlier run of the same config a cell skips, resumes or ignores."""

from __future__ import annotations

import os

import pytest
from mlflow.tracking import MlflowClient

from foxhunt.runs.resume import FRESH, RESUME, SKIP, plan_resume
from foxhunt.runs.tracked_run import TrackedRun


@pytest.fixture
def store(tmp_path):
    return f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}", str(tmp_path / "mlruns" / "artifacts")


def _run(store, digest: str, end: type[BaseException] | None, extra_tags=None) -> str:
    uri, artifacts = store
    tags = {"config_hash": digest, **(extra_tags or {})}
    try:
        with TrackedRun(uri, "unit", artifacts, "dqn-es-fp32", tags) as run:
            run.log_metrics({"test/sharpe": 0.7})
            if end is not None:
                raise end("stopped")
    except BaseException:
        pass
    return run.run_id


def test_no_earlier_run_trains_from_scratch(store, tmp_path):
    assert plan_resume(store[0], "unit", "h", tmp_path).action == FRESH


def test_a_finished_run_is_skipped_with_its_metrics(store, tmp_path):
    _run(store, "h", KeyboardInterrupt)
    finished = _run(store, "h", None)
    _run(store, "other", None)
    plan = plan_resume(store[0], "unit", "h", tmp_path)
    assert (plan.action, plan.run_id, plan.metrics) == (SKIP, finished, {"test/sharpe": 0.7})
    assert plan.wall_s is not None and plan.wall_s >= 0


def test_an_interrupted_run_resumes_from_its_newest_local_checkpoint(store, tmp_path):
    output = tmp_path / "cell"
    (output / "checkpoints").mkdir(parents=True)
    last = output / "checkpoints" / "last.ckpt"
    interrupted = output / "checkpoints" / "interrupted.ckpt"
    last.write_bytes(b"a")
    interrupted.write_bytes(b"b")
    os.utime(last, (1, 1))  # older
    killed = _run(store, "h", KeyboardInterrupt, {"output_dir": str(output)})
    plan = plan_resume(store[0], "unit", "h", tmp_path / "download")
    assert (plan.action, plan.run_id, plan.checkpoint, plan.previous_status) == (RESUME, killed, interrupted, "KILLED")


def test_a_failed_run_resumes_from_its_logged_checkpoint_when_the_folder_is_gone(store, tmp_path):
    checkpoint = tmp_path / "last.ckpt"
    checkpoint.write_bytes(b"weights")
    failed = _run(store, "h", RuntimeError, {"output_dir": str(tmp_path / "gone")})
    MlflowClient(store[0]).log_artifact(failed, str(checkpoint), "checkpoints")
    plan = plan_resume(store[0], "unit", "h", tmp_path / "download")
    assert (plan.action, plan.run_id, plan.previous_status) == (RESUME, failed, "FAILED")
    assert plan.checkpoint.read_bytes() == b"weights" and plan.checkpoint.is_relative_to(tmp_path / "download")


def test_a_run_without_checkpoint_or_still_alive_is_not_resumed(store, tmp_path):
    _run(store, "h", RuntimeError)  # failed before any checkpoint
    assert plan_resume(store[0], "unit", "h", tmp_path).action == FRESH
    uri, _ = store
    client = MlflowClient(uri)
    output = tmp_path / "live"
    (output / "checkpoints").mkdir(parents=True)
    (output / "checkpoints" / "last.ckpt").write_bytes(b"x")
    live = _run(store, "h2", None, {"output_dir": str(output), "pid": str(os.getppid())})
    client.update_run(live, status="RUNNING")  # its process (this test's parent) is alive on this host
    assert plan_resume(uri, "unit", "h2", tmp_path).action == FRESH
    client.set_tag(live, "pid", "999999999")  # a dead process: the run is stale
    assert plan_resume(uri, "unit", "h2", tmp_path).action == RESUME
