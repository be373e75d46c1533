"""The job CLI end to end, as a user drives it: real ``foxhunt train`` processes launching real
sweeps (``foxhunt-train -m``) into a fresh MLflow store under ``tmp_path``; every state the CLI
shows is checked against what ``MlflowClient`` (and so the MLflow UI) reads.

DQN smoke cells (seconds of training each): the cost is mostly process start-up (imports of
torch, lightning and mlflow in the supervisor and the sweep).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from foxhunt.runs.checkpoints import INTERRUPTED_CHECKPOINT
from foxhunt.runs.liveness import process_alive

# One torch thread: the suite's other pytest-xdist worker trains on the second core (a sweep of
# torch's default two threads on two busy cores waits on its own spinning threads).
TINY = ["model=dqn", "trainer=smoke", "data.source.days=7", "evaluation.plot_equity=false", "strategy.torch_threads=1"]
# trainer=smoke's 8 training batches of DQN's steps_per_call (25) agent steps: the step unit of every
# metric of a DQN run, its agent steps (foxhunt.runs.steps.log_on_step)
STEPS = 8 * 25
# Long enough to be stopped mid-training, short enough to finish soon after a resume: one epoch
# of 80 training_step calls (2,000 agent steps), progress reported every 10. Measured 2026-12-04
# on 2 cores: 200 batches of 4 agent steps trained in 3.6 s on a quiet machine, less than a status
# poll and the stop command's start-up take on a loaded one, so a shorter job sometimes finished
# before its stop arrived (FINISHED, not KILLED).
LONGER = [*TINY, "asset=es", "trainer.limit_train_batches=80", "model.env.steps_per_epoch=80"]


def cli(root: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "FOXHUNT_ROOT": str(root), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "foxhunt.cli", "train", *args], cwd=root, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def start(root: Path, *args: str) -> tuple[str, int]:
    out = cli(root, "start", *args)
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]  # "job <id> started: N cells, pid <pid>"
    return first.split()[1], int(first.rsplit(" ", 1)[1])


def status(root: Path, job_id: str) -> dict:
    out = cli(root, "status", job_id, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def wait_until_training(root: Path, job_id: str, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = status(root, job_id)
        if any(c["state"] == "RUNNING" and c["progress"] > 0 for c in data["cells"]):
            return data
        assert data["state"] in ("STARTING", "RUNNING"), data
        time.sleep(1)
    raise AssertionError(f"job {job_id} did not start training in {timeout} s: {data}")


def store_view(root: Path, job_id: str) -> dict[str, tuple[str, str]]:
    """run id -> (name, status) of the job's runs, as MlflowClient reads them."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("foxhunt")
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.job_id = '{job_id}'")
    return {r.info.run_id: (r.info.run_name, r.info.status) for r in runs}


def agrees_with_store(root: Path, data: dict) -> None:
    """Every run the CLI shows has the status MlflowClient reads (STALE: the store's RUNNING)."""
    store = store_view(root, data["job_id"])
    shown = {data["parent_run_id"]: data["state"], **{c["run_id"]: c["state"] for c in data["cells"] if c["run_id"]}}
    assert set(shown) == set(store)
    for run_id, state in shown.items():
        assert store[run_id][1] == ("RUNNING" if state == "STALE" else state), (run_id, state, store[run_id])


def test_start_watch_list_a_tiny_job(tmp_path):
    job_id, _ = start(tmp_path, *TINY, "asset=es,nq")
    watched = cli(tmp_path, "watch", job_id, "--interval", "1")
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert "dqn-es-fp32" in watched.stdout and "dqn-nq-fp32" in watched.stdout and "100%" in watched.stdout

    data = status(tmp_path, job_id)
    assert data["state"] == "FINISHED" and [c["state"] for c in data["cells"]] == ["FINISHED", "FINISHED"]
    assert all(c["step"] == STEPS and c["peak_mb"] is not None for c in data["cells"])
    agrees_with_store(tmp_path, data)
    assert data["overrides"] == [*TINY, "asset=es,nq"] and data["pid"] and data["host"]
    assert data["command"].startswith("foxhunt-train -m model=dqn")

    listed = json.loads(cli(tmp_path, "list", "--json", "--model", "dqn", "--asset", "nq").stdout)
    assert [j["job_id"] for j in listed["jobs"]] == [job_id]
    table = cli(tmp_path, "list").stdout
    assert job_id in table and "2 finished" in table


def test_stop_saves_a_checkpoint_marks_killed_and_resume_finishes(tmp_path):
    job_id, pid = start(tmp_path, *LONGER)
    running = wait_until_training(tmp_path, job_id)
    cell_run = running["cells"][0]["run_id"]

    stopped = cli(tmp_path, "stop", job_id, "--timeout", "60")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not process_alive(pid)
    data = status(tmp_path, job_id)
    assert data["state"] == "KILLED" and data["cells"][0]["state"] == "KILLED"
    assert data["cells"][0]["checkpoint"].endswith(INTERRUPTED_CHECKPOINT)
    assert Path(data["cells"][0]["checkpoint"]).is_file()
    assert 0 < data["cells"][0]["progress"] < 1
    agrees_with_store(tmp_path, data)
    assert cli(tmp_path, "watch", job_id).returncode == 3  # KILLED

    # two resumes at once: one launches, the other is refused in one line (the job's lock, or
    # the state the winner's launch left); never two launches of one job
    env = {**os.environ, "FOXHUNT_ROOT": str(tmp_path), "COLUMNS": "200"}
    racing = [subprocess.Popen([sys.executable, "-m", "foxhunt.cli", "train", "start", "--resume", job_id], cwd=tmp_path,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    outcomes = sorted((p.wait(timeout=240), *p.communicate()) for p in racing)
    assert [code for code, _, _ in outcomes] == [0, 2], outcomes
    refusal = outcomes[1][2].strip()
    assert len(refusal.splitlines()) == 1 and refusal.startswith(f"foxhunt train: job {job_id} is "), refusal
    assert "being launched or run by another process (pid " in refusal or "stop it first" in refusal, refusal
    assert (tmp_path / "outputs" / "jobs" / f"{job_id}.log").read_text().count("=== resume ") == 1  # one launch
    assert cli(tmp_path, "watch", job_id, "--interval", "1").returncode == 0
    data = status(tmp_path, job_id)
    assert data["state"] == "FINISHED" and data["cells"][0]["state"] == "FINISHED"
    assert data["cells"][0]["run_id"] == cell_run  # continued in the same run
    agrees_with_store(tmp_path, data)


@pytest.mark.slow
def test_a_job_killed_with_sigkill_is_stale_and_resumable(tmp_path):
    # kill -9 leaves no interrupted.ckpt: the resume uses last.ckpt, written at each epoch's end
    # (DQN optimizes manually: Lightning defers step-based checkpoints to validation)
    job_id, pid = start(tmp_path, *TINY, "asset=es", "trainer.limit_train_batches=20", "trainer.max_epochs=10")
    deadline = time.monotonic() + 180
    while (
        not (data := wait_until_training(tmp_path, job_id))["cells"][0]["step"] >= 25
    ):  # past the first epoch's last.ckpt (20 batches)
        assert time.monotonic() < deadline, data
        time.sleep(0.5)
    cell_run = data["cells"][0]["run_id"]
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)

    data = status(tmp_path, job_id)
    assert data["state"] == "STALE" and data["cells"][0]["state"] == "STALE"
    agrees_with_store(tmp_path, data)  # the store still says RUNNING: nothing changed it
    assert cli(tmp_path, "watch", job_id, "--interval", "0.2").returncode == 4
    assert job_id in cli(tmp_path, "list", "--status", "stale").stdout

    assert cli(tmp_path, "start", "--resume", job_id).returncode == 0
    assert cli(tmp_path, "watch", job_id, "--interval", "1").returncode == 0
    data = status(tmp_path, job_id)
    assert data["state"] == "FINISHED" and data["cells"][0]["state"] == "FINISHED"
    assert data["cells"][0]["run_id"] == cell_run  # continued from last.ckpt in the same run
    agrees_with_store(tmp_path, data)
