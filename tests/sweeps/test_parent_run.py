"""The sweep's parent run: which earlier one ``resume=true`` reopens, and the process tags that
let the job commands show a sweep started by hand as STALE once its process is gone.

The callback's parent-run step is driven directly (no Hydra process) on one tmp SQLite store,
one experiment per test (creating a store takes seconds).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from foxhunt.jobs.views import find_job, load_jobs
from foxhunt.runs.cell import CellKey, CellResult
from foxhunt.sweeps.callback import SweepCallback


@dataclass
class Store:
    uri: str
    experiment: str
    root: Path

    def parent(self, folder: str, resume: bool = False, end: str | None = "KILLED") -> str:
        """Start (or, with ``resume``, reopen) the parent run of the sweep in ``folder``."""
        callback = self.callback(folder, resume)
        if end is not None:
            MlflowClient(self.uri).set_terminated(callback.parent_run_id, end)
        time.sleep(0.01)  # distinct start times: "newest" is well defined
        return callback.parent_run_id

    def callback(self, folder: str, resume: bool = False) -> SweepCallback:
        """The callback of the sweep in ``folder`` with its parent run started (or reopened)."""
        sweep_dir = self.root / "sweeps" / folder
        config = self.config(folder, resume)
        callback = SweepCallback()
        callback.sweep_dir = sweep_dir
        callback.parent_run_id = callback._start_parent_run(config)
        return callback

    def config(self, folder: str, resume: bool = False):
        sweep_dir = self.root / "sweeps" / folder
        return OmegaConf.create({
            "hydra": {
                "overrides": {"task": ["model=dqn,ppo", "asset=es", "trainer=smoke", *(["resume=true"] * resume)]},
                "sweeper": {"params": None},
                "sweep": {"dir": str(sweep_dir)},
            },
            "logger": {"enabled": True, "tracking_uri": self.uri, "experiment": self.experiment,
                       "artifact_location": str(self.root / "mlruns" / "artifacts")},
            "resume": resume,
            "strategy": {"name": "sequential"},
        })  # fmt: skip


@pytest.fixture(scope="module")
def store_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("parent_runs")


@pytest.fixture
def store(store_root, request, monkeypatch) -> Store:
    monkeypatch.delenv("FOXHUNT_JOB_ID", raising=False)  # a sweep started by hand
    name = request.node.name[:50]
    return Store(f"sqlite:///{store_root / 'mlruns' / 'mlflow.db'}", name, store_root / name)


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_resume_reopens_the_parent_of_its_own_sweep_folder_not_the_newest_with_the_same_overrides(store):
    first = store.parent("job-a")
    second = store.parent("job-b")  # same overrides: same sweep_hash
    client = MlflowClient(store.uri)
    assert client.get_run(first).data.tags["sweep_hash"] == client.get_run(second).data.tags["sweep_hash"]

    # foxhunt train start --resume <job a> passes job a's folder (hydra.sweep.dir)
    assert store.parent("job-a", resume=True, end=None) == first
    reopened = client.get_run(first)
    assert reopened.info.status == "RUNNING" and reopened.data.tags["pid"] == str(os.getpid())
    assert client.get_run(second).info.status == "KILLED"


def test_resume_in_a_new_folder_falls_back_to_the_newest_parent_of_the_same_sweep_not_owned_by_another_job(store, monkeypatch):
    by_hand = store.parent("by-hand")
    owned = store.parent("job-b")
    client = MlflowClient(store.uri)
    client.set_tag(owned, "job_id", "bbbb2222")
    # by hand in a new folder: the newest parent of the same sweep, whoever owns it
    assert store.parent("new-1", resume=True) == owned
    # job cccc3333 in a new folder: not job bbbb2222's parent
    monkeypatch.setenv("FOXHUNT_JOB_ID", "cccc3333")
    assert store.parent("new-2", resume=True) == by_hand
    client.set_tag(by_hand, "job_id", "dddd4444")
    assert store.parent("new-3", resume=True) not in (by_hand, owned)  # a new parent run


def test_a_sweep_started_by_hand_is_stale_once_its_process_is_gone(store):
    parent = store.parent("by-hand", end=None)  # still RUNNING
    client = MlflowClient(store.uri)
    tags = client.get_run(parent).data.tags
    assert tags["pid"] == str(os.getpid()) and tags["host"] == socket.gethostname()
    assert tags["mlflow.source.name"] == "foxhunt-train -m"  # the runs table's Source

    def job():
        (found,) = [j for j in load_jobs(store.uri) if j.parent is not None and j.parent.experiment == store.experiment]
        return found

    # listed from the start, before its first cell has a run; alive: its process is this one
    assert (job().job_id, job().state, job().pid, job().host) == (parent, "RUNNING", os.getpid(), socket.gethostname())
    client.set_tag(parent, "pid", str(_dead_pid()))  # as after kill -9 of the sweep
    assert job().state == "STALE" and find_job(store.uri, parent[:12]).state == "STALE"
    assert client.get_run(parent).info.status == "RUNNING"  # the store is unchanged


def _result(asset: str, status: str = "FINISHED") -> CellResult:
    error = None if status == "FINISHED" else "ValueError: loss is NaN"
    return CellResult(CellKey("dqn", asset, "fp32", "42"), status=status, error=error)


def test_a_resumed_sweep_logs_its_summary_at_the_next_step_not_again_at_an_earlier_one(store):
    """A failed sweep's summary is at step 0; resumed, the sweep's summary goes to step 1 (each
    launch's end at its own step, the latest the sweep's state now), never a second value at
    step 0."""
    first = store.callback("failed-then-resumed")
    ok, bad = _result("es"), _result("nq", "FAILED")
    first._end_parent_run(first_config := store.config("failed-then-resumed"), [ok, bad], [bad], 5.0, [])
    client = MlflowClient(store.uri)
    assert client.get_run(first.parent_run_id).info.status == "FAILED"

    resumed = store.callback("failed-then-resumed", resume=True)
    assert resumed.parent_run_id == first.parent_run_id
    resumed._end_parent_run(store.config("failed-then-resumed", resume=True), [ok, _result("nq")], [], 3.0, [])
    run = client.get_run(first.parent_run_id)
    assert run.info.status == "FINISHED" and first_config.resume is False
    history = {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
               for key in ("sweep/cells", "sweep/cells_failed", "sweep/wall_s")}  # fmt: skip
    assert history == {"sweep/cells": [(0, 2.0), (1, 2.0)], "sweep/cells_failed": [(0, 1.0), (1, 0.0)],
                       "sweep/wall_s": [(0, 5.0), (1, 3.0)]}  # fmt: skip
    assert run.data.metrics["sweep/cells_failed"] == 0.0  # the runs table shows the sweep as it ended last
