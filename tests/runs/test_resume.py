"""resume=true: which earlier run of the same config a cell skips, resumes or ignores."""

from __future__ import annotations

import os
import socket

import pytest
from mlflow.tracking import MlflowClient

from foxhunt.runs.resume import BUSY, FRESH, RESUME, SETTLED_REASON, SKIP, plan_resume
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


def test_a_run_without_checkpoint_is_not_resumed_and_one_still_alive_is_not_started_again(store, tmp_path):
    _run(store, "h", RuntimeError)  # failed before any checkpoint
    assert plan_resume(store[0], "unit", "h", tmp_path).action == FRESH
    uri, _ = store
    client = MlflowClient(uri)
    output = tmp_path / "live"
    (output / "checkpoints").mkdir(parents=True)
    (output / "checkpoints" / "last.ckpt").write_bytes(b"x")
    live = _run(store, "h2", None, {"output_dir": str(output), "pid": str(os.getppid())})
    client.update_run(live, status="RUNNING")  # its process (this test's parent) is alive on this host
    busy = plan_resume(uri, "unit", "h2", tmp_path)
    assert (busy.action, busy.run_id) == (BUSY, live)  # never a second process on the cell
    assert busy.describe() == (f"skipped: still running (run {live} on {socket.gethostname()}, pid {os.getppid()}); "
                               "not started a second time")  # fmt: skip
    client.set_tag(live, "pid", "999999999")  # a dead process: the run is stale
    assert plan_resume(uri, "unit", "h2", tmp_path).action == RESUME


def test_a_stale_run_not_continued_is_settled_killed(store, tmp_path):
    """A run RUNNING without its process and without a checkpoint: the new attempt trains from
    scratch, and the stale run ends KILLED instead of staying RUNNING forever."""
    uri, _ = store
    stale = _run(store, "h3", None, {"output_dir": str(tmp_path / "none"), "pid": "999999999"})
    MlflowClient(uri).update_run(stale, status="RUNNING")
    assert plan_resume(uri, "unit", "h3", tmp_path).action == FRESH
    run = MlflowClient(uri).get_run(stale)
    assert run.info.status == "KILLED" and run.data.tags["stop_reason"] == SETTLED_REASON


def test_a_cell_of_folds_reopens_its_interrupted_run_without_a_checkpoint(store, tmp_path):
    uri, _ = store
    killed = _run(store, "h4", KeyboardInterrupt)
    assert plan_resume(uri, "unit", "h4", tmp_path).action == FRESH  # a single run needs its checkpoint
    plan = plan_resume(uri, "unit", "h4", tmp_path, needs_checkpoint=False)
    assert (plan.action, plan.run_id, plan.checkpoint) == (RESUME, killed, None)


def test_a_logged_best_checkpoint_is_downloaded_beside_the_one_resumed_from(store, tmp_path):
    """Resumed from its logged copy (its folder gone): the run's best.ckpt comes too, beside it,
    where the checkpoint stamp callback carries it into the new folder (the best score survives)."""
    failed = _run(store, "h5", RuntimeError, {"output_dir": str(tmp_path / "gone")})
    client = MlflowClient(store[0])
    for name, content in (("last.ckpt", b"last"), ("best.ckpt", b"best")):
        (tmp_path / name).write_bytes(content)
        client.log_artifact(failed, str(tmp_path / name), "checkpoints")
    plan = plan_resume(store[0], "unit", "h5", tmp_path / "download")
    assert plan.checkpoint.read_bytes() == b"last"
    assert (plan.checkpoint.parent / "best.ckpt").read_bytes() == b"best"
