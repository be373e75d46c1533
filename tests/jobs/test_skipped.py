"""A cell ``resume=true`` skips for an earlier FINISHED run of another job or sweep has no run in
the new job: the sweep job tags the new parent run, and ``foxhunt train status`` shows the cell
SKIPPED, with the earlier run's id and metrics, instead of PENDING for ever."""

from __future__ import annotations

import io
import json

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from rich.console import Console

from foxhunt.jobs.display import counts_text, status_table
from foxhunt.jobs.listing import job_to_dict
from foxhunt.jobs.views import find_job, group_jobs, now_ms
from foxhunt.runs.config_hash import config_hash
from foxhunt.runs.environment import sqlite_path
from foxhunt.runs.sqlite_reader import SqliteReader
from foxhunt.runs.status import Status
from foxhunt.runs.store import ClientReader, RunStore
from foxhunt.training.cell import run_cell
from jobs_store import plan


@pytest.fixture
def setting(compose_cfg):
    """Job aaaa1111 trained dqn-es (FINISHED); job bbbb2222 plans dqn-es and dqn-nq, no run yet."""
    cfg = compose_cfg(["model=dqn", "asset=es", "trainer=smoke", "resume=true"])
    digest = config_hash(cfg)
    uri = cfg.logger.tracking_uri
    experiment = RunStore(uri).ensure_experiment(cfg.logger.experiment, cfg.logger.artifact_location)
    client = MlflowClient(uri)

    def parent(job_id, extra=None):
        tags = {"foxhunt.run_kind": "sweep", "job_id": job_id, **(extra or {})}
        return client.create_run(experiment, run_name=f"sweep-{job_id}", tags=tags).info.run_id

    first = parent("aaaa1111")
    tags = {"mlflow.parentRunId": first, "job_id": "aaaa1111", "config_hash": digest,
            "model": "dqn", "asset": "es", "precision": "fp32", "seed": "42"}  # fmt: skip
    earlier = client.create_run(experiment, run_name="dqn-es-fp32", tags=tags).info.run_id
    metrics = {"val/sharpe": 1.25, "train/loss": 0.5, "memory/peak_mb": 120.0, "test/sharpe": 0.75}
    client.log_batch(earlier, metrics=[Metric(k, v, now_ms(), 8) for k, v in metrics.items()])
    client.set_terminated(earlier, "FINISHED")
    client.set_terminated(first, "FINISHED")
    second = parent("bbbb2222", {"job.plan": plan(("dqn", "es", 1.0), ("dqn", "nq", 1.0))})
    return cfg, digest, uri, first, earlier, second


def test_a_cell_skipped_for_another_jobs_run_shows_skipped_with_that_run(setting):
    cfg, digest, uri, _, earlier, second = setting
    outcome = run_cell(cfg, parent_run_id=second)
    assert outcome.status == Status.SKIPPED and outcome.run_id == earlier and outcome.metrics["val/sharpe"] == 1.25

    job = find_job(uri, "bbbb")
    skipped, pending = job.cells()
    assert (skipped.name, skipped.state, skipped.run) == ("dqn-es-fp32", "SKIPPED", None)
    assert skipped.skipped.run_id == earlier
    assert (pending.name, pending.state) == ("dqn-nq-fp32", "PENDING")
    assert job.counts() == {"SKIPPED": 1, "PENDING": 1} and job.fraction() == pytest.approx(0.5)
    assert job.best_sharpe() == 1.25 and job.models == ["dqn"]

    cell = job_to_dict(job, now_ms())["cells"][0]
    json.dumps(cell)
    assert (cell["state"], cell["run_id"], cell["skipped_from"]) == ("SKIPPED", None, earlier)
    assert (cell["val_sharpe"], cell["loss"], cell["peak_mb"], cell["progress"]) == (1.25, 0.5, 120.0, 1.0)

    console = Console(file=io.StringIO(), width=250)
    console.print(status_table(job, now_ms()))
    console.print(counts_text(job))
    shown = console.file.getvalue()
    row = next(line for line in shown.splitlines() if "dqn-es-fp32" in line)
    assert "SKIPPED" in row and f"skipped: FINISHED earlier in run {earlier}" in row and "1.25" in row
    assert "1 skipped 1 pending" in shown

    # the direct reader and MlflowClient see the same skip
    client_job = [j for j in group_jobs(ClientReader(RunStore(uri)).job_runs("bbbb")) if j.job_id == "bbbb2222"][0]
    sqlite_job = [j for j in group_jobs(SqliteReader(sqlite_path(uri)).job_runs("bbbb")) if j.job_id == "bbbb2222"][0]
    assert client_job.skipped == sqlite_job.skipped == job.skipped


def test_a_cell_skipped_for_its_own_sweeps_run_is_shown_as_that_run(setting):
    cfg, digest, uri, first, earlier, _ = setting
    outcome = run_cell(cfg, parent_run_id=first)  # a resume of job aaaa1111
    assert outcome.status == Status.SKIPPED
    assert not any(k.startswith("foxhunt.skipped.") for k in MlflowClient(uri).get_run(first).data.tags)
    (cell,) = find_job(uri, "aaaa").cells()
    assert (cell.state, cell.run.run_id, cell.skipped) == ("FINISHED", earlier, None)
