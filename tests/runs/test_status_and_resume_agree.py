"""``foxhunt train status`` and ``resume=true`` read a run the same way: the same checkpoint
(interrupted.ckpt, else last.ckpt: never best.ckpt nor a breach checkpoint, however new) and the
same liveness (a dead or reused pid on this host is STALE and resumable; a run on another host
is RUNNING, as the store says, and left alone)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foxhunt.cli import app
from foxhunt.runs.environment import store_uri
from foxhunt.runs.resume import BUSY, RESUME, plan_resume
from foxhunt.runs.store import RunStore

JOB = "abcd0001"
HOUR_MS = 3600 * 1000


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def checkpoints(folder: Path, *names: str) -> None:
    """Write ``names`` into ``folder/checkpoints``, each newer than the one before."""
    (folder / "checkpoints").mkdir(parents=True)
    for age, name in enumerate(reversed(names)):
        path = folder / "checkpoints" / name
        path.write_bytes(name.encode())
        os.utime(path, (time.time() - 100 * (age + 1), time.time() - 100 * (age + 1)))


@pytest.fixture
def store(tmp_path):
    """A job whose cells ended, or did not, in every way that matters here."""
    uri = store_uri(tmp_path)
    runs = RunStore(uri)
    experiment = runs.ensure_experiment("foxhunt", str(tmp_path / "mlruns" / "artifacts"))
    start = int(time.time() * 1000) - HOUR_MS  # an hour ago: any process started since is newer
    parent = runs.create(experiment, "sweep-x", {"foxhunt.run_kind": "sweep", "job_id": JOB})
    sleeper = subprocess.Popen(["sleep", "120"])  # a live process that is no foxhunt command
    cells = {
        # name: (config hash, host, pid, status, checkpoint files, oldest first)
        "dqn": ("h-dqn", socket.gethostname(), dead_pid(), "KILLED", ("last.ckpt", "best.ckpt", "memory_breach.ckpt")),
        "ppo": ("h-ppo", socket.gethostname(), dead_pid(), "RUNNING", ("last.ckpt",)),
        "tft": ("h-tft", socket.gethostname(), sleeper.pid, "RUNNING", ("interrupted.ckpt", "last.ckpt")),
        "mamba2": ("h-mamba2", "another-host", dead_pid(), "RUNNING", ("last.ckpt",)),
    }
    for model, (digest, host, pid, status, files) in cells.items():
        folder = tmp_path / "outputs" / model
        checkpoints(folder, *files)
        tags = {"mlflow.parentRunId": parent, "job_id": JOB, "model": model, "asset": "es", "precision": "fp32",
                "seed": "42", "config_hash": digest, "host": host, "pid": str(pid), "output_dir": str(folder)}  # fmt: skip
        run_id = runs.client.create_run(experiment, run_name=f"{model}-es-fp32", tags=tags, start_time=start).info.run_id
        if status != "RUNNING":
            runs.end(run_id, status)
    runs.end(parent, "KILLED")
    yield tmp_path, uri
    sleeper.kill()
    sleeper.wait()


def test_status_and_resume_choose_the_same_checkpoint_and_liveness(store):
    root, uri = store
    result = CliRunner().invoke(app, ["train", "status", JOB, "--json", "--root", str(root)])
    assert result.exit_code == 0, result.output
    shown = {cell["name"].split("-")[0]: cell for cell in json.loads(result.output)["cells"]}

    def resume(model: str):
        return plan_resume(uri, "foxhunt", f"h-{model}", root / "download")

    # KILLED: last.ckpt, the newest resumable one, not the newer best or breach checkpoints
    assert shown["dqn"]["state"] == "KILLED" and Path(shown["dqn"]["checkpoint"]).name == "last.ckpt"
    assert (resume("dqn").action, str(resume("dqn").checkpoint)) == (RESUME, shown["dqn"]["checkpoint"])
    # RUNNING, its process gone: STALE, continued from its checkpoint
    assert shown["ppo"]["state"] == "STALE"
    assert (resume("ppo").action, str(resume("ppo").checkpoint)) == (RESUME, shown["ppo"]["checkpoint"])
    # RUNNING, its pid now another program's (started after the run was last seen): STALE too,
    # and the newer of interrupted.ckpt and last.ckpt
    assert shown["tft"]["state"] == "STALE" and Path(shown["tft"]["checkpoint"]).name == "last.ckpt"
    assert (resume("tft").action, str(resume("tft").checkpoint)) == (RESUME, shown["tft"]["checkpoint"])
    # RUNNING on another host: shown as the store says, and resume does not start it again, saying where
    assert shown["mamba2"]["state"] == "RUNNING" and shown["mamba2"]["checkpoint"] is None
    plan = resume("mamba2")
    assert plan.action == BUSY and "on another-host, pid" in plan.describe()
