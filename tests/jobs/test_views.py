"""Jobs read from the store: grouping, states (STALE included), plan matching, a job found by
its id or the launch file before the store knows it."""

from __future__ import annotations

import pytest

from foxhunt.jobs.launch_file import LaunchFile, PlannedCell, jobs_dir
from foxhunt.jobs.views import JobNotFound, find_job, group_jobs, load_jobs
from foxhunt.runs.cell import CellKey
from foxhunt.runs.stored import StoredRun
from jobs_store import HOUR_MS, NOW_MS, dead_pid


def test_every_job_is_found_with_the_state_the_store_and_processes_say(jobs, jobs_store):
    states = {key: job.state for key, job in jobs.items()}
    byhand = jobs_store.runs["byhand"]
    assert states == {
        "aaaa1111": "FINISHED", "aaaa2222": "FAILED", "bbbb3333": "KILLED", "cccc4444": "RUNNING",
        "dddd5555": "STALE", "eeee6666": "RUNNING", byhand: "RUNNING",
    }  # fmt: skip
    assert jobs_store.runs["single"] not in {r.run_id for job in jobs.values() for r in job.runs}


def test_a_finished_job_has_its_parent_cells_plan_and_best_sharpe(jobs, jobs_store):
    job = jobs["aaaa1111"]
    assert job.parent.run_id == jobs_store.runs["finished"]
    assert [c.name for c in job.cells()] == ["dqn-es-fp32", "dqn-nq-fp32", "tft-es-fp32", "tft-nq-fp32"]
    assert job.counts() == {"FINISHED": 4}
    assert job.best_sharpe() == pytest.approx(1.4)
    assert job.models == ["dqn", "tft"] and job.assets == ["es", "nq"]
    assert job.duration_s(NOW_MS) == pytest.approx(2 * 3600, abs=1)
    assert job.overrides == ["label=finished"] and job.command == "foxhunt-train -m finished"


def test_stale_is_a_running_run_whose_process_is_gone_and_only_on_this_host(jobs):
    stale = jobs["dddd5555"]
    assert stale.parent.status == "RUNNING" and stale.state == "STALE"  # the store is unchanged
    assert [c.state for c in stale.cells()] == ["STALE"]
    # its duration stops at the last thing it wrote, not now
    assert stale.runs[0].duration_s(NOW_MS) < 60
    remote = [j for j in jobs.values() if j.parent is not None and j.parent.tags.get("sweep_id") == "sweep-byhand"][0]
    assert remote.runs[0].state == "RUNNING"  # another host: cannot be checked from here


def test_weighted_progress_counts_planned_cells_that_have_not_started(jobs):
    job = jobs["cccc4444"]
    cells = job.cells()
    assert [(c.name, c.state) for c in cells] == [("tft-zn-fp32", "RUNNING"), ("dqn-zn-fp32", "PENDING")]
    assert cells[0].step() == 40
    # tft (weight 4) half done, dqn (weight 1) not started: 0.5 * 4 / 5
    assert job.fraction() == pytest.approx(0.4)


def test_a_job_whose_parent_is_not_tagged_yet_is_found_by_its_cells_job_id(jobs_store):
    job = find_job(jobs_store.uri, "eeee6666")
    assert job.parent is not None and job.parent.run_id == jobs_store.runs["untagged"]
    assert [r.run_id for r in job.runs] == [jobs_store.runs["untagged/dqn-es"]]


def test_find_job_by_prefix_and_clear_errors(jobs_store, tmp_path):
    assert find_job(jobs_store.uri, "bbbb").job_id == "bbbb3333"
    assert find_job(jobs_store.uri, jobs_store.runs["byhand"][:10]).parent.run_id == jobs_store.runs["byhand"]
    with pytest.raises(JobNotFound, match="ambiguous: aaaa1111, aaaa2222"):
        find_job(jobs_store.uri, "aaaa")
    with pytest.raises(JobNotFound, match="no job 'zzzz'"):
        find_job(jobs_store.uri, "zzzz", root=tmp_path)


def test_a_job_not_in_the_store_yet_is_starting_then_failed_from_its_launch_file(jobs_store, tmp_path):
    import os
    import socket

    import psutil

    def launch_file(pid):
        return LaunchFile(
            job_id="ffff7777", pid=pid, host=socket.gethostname(), command=["foxhunt-train", "-m"],
            overrides=["model=dqn"], log=str(tmp_path / "ffff7777.log"), tracking_uri=jobs_store.uri,
            root=str(tmp_path), sweep_dir=str(tmp_path / "sweep"),
            started_ms=int(psutil.Process(pid).create_time() * 1000) if pid == os.getpid() else NOW_MS,
            plan=[PlannedCell(CellKey("dqn", "es", "fp32", "42"), 8, 0.5)],
        )  # fmt: skip

    path = jobs_dir(tmp_path) / "ffff7777.json"
    launch_file(os.getpid()).write(path)
    job = find_job(jobs_store.uri, "ffff", root=tmp_path)
    assert job.state == "STARTING" and [c.state for c in job.cells()] == ["PENDING"]
    launch_file(dead_pid()).write(path)
    assert find_job(jobs_store.uri, "ffff7777", root=tmp_path).state == "FAILED"


def test_no_store_means_no_jobs(tmp_path):
    assert load_jobs(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}") == []


def test_a_walk_forward_cell_is_one_cell_of_its_job_not_its_folds():
    def stored_run(run_id, parent=None, **tags):
        base = {"job_id": "ffff7777", "model": "dqn", "asset": "es", "precision": "fp32", "seed": "42"}
        if parent:
            base["mlflow.parentRunId"] = parent
        return StoredRun(run_id, run_id, "foxhunt", "FINISHED", NOW_MS - HOUR_MS, NOW_MS, {**base, **tags}, {})

    runs = [
        stored_run("sweep", **{"foxhunt.run_kind": "sweep"}),
        stored_run("cell", "sweep", **{"foxhunt.role": "cell"}),
        stored_run("fold0", "cell", **{"foxhunt.role": "fold", "fold": "0"}),
        stored_run("fold1", "cell", **{"foxhunt.role": "fold", "fold": "1"}),
    ]
    (job,) = group_jobs(runs)
    assert job.parent.run_id == "sweep" and [r.run_id for r in job.runs] == ["cell"]
    (alone,) = group_jobs(runs[1:])  # a walk-forward run without a sweep: one cell, not a job of folds
    assert alone.parent is None and [r.run_id for r in alone.runs] == ["cell"]


def test_a_job_whose_supervisor_died_alone_is_running_while_a_cell_trains():
    """kill -9 of the supervisor alone: its parent run (the supervisor's pid) is STALE while the
    cell's training goes on; the job showed STALE and 'train stop' said 'nothing to stop' (found
    by a helper probing the job CLI). A damaged job.plan tag is no plan, not an error for every job."""
    from types import SimpleNamespace

    from foxhunt.jobs.views import _stored_plan, job_state

    parent = SimpleNamespace(state="STALE")
    assert job_state(parent, [SimpleNamespace(state="RUNNING")]) == "RUNNING"
    assert job_state(parent, [SimpleNamespace(state="KILLED")]) == "STALE"
    for text in ("not json", "[1,2]", '[{"model":"dqn"}]', "{}", "[" * 100_000):
        assert _stored_plan(text) == []
