"""Launch files are read back checked by content (foxhunt.jobs.launch_file.LaunchFile.read): a file
in outputs/jobs that is not one foxhunt wrote (wrong types, a pipe, a link, JSON nested without
end) is skipped by the readers, never a traceback, a hang or a signal to a pid it names."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foxhunt.cli import app
from foxhunt.jobs.launch_file import LaunchFile, jobs_dir
from foxhunt.jobs.views import log_tail
from foxhunt.runs.environment import store_uri
from foxhunt.runs.store import RunStore


def _fields(root: Path, job_id: str = "good0001") -> dict:
    return LaunchFile(
        job_id=job_id, pid=0, host=socket.gethostname(), command=["foxhunt-train", "-m", "model=dqn"], overrides=["model=dqn"],
        log=str(jobs_dir(root) / f"{job_id}.log"), tracking_uri=store_uri(root), root=str(root),
        sweep_dir=str(root / "sweep"), started_ms=int(time.time() * 1000), plan=[],
    ).to_dict()  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"started_ms": 1e40}, "started_ms: '1e+40' is not a int"),
        ({"job_id": 5}, "job_id: '5' is not a str"),
        ({"pid": "abc"}, "pid: 'abc' is not a int"),
        ({"pid": [1]}, "pid: '[1]' is not a int"),
        ({"pid": True}, "pid: 'True' is not a int"),
        ({"pid": 1 << 40}, "out of range"),
        ({"started_ms": -5}, "out of range"),
        ({"command": ["sh", 5]}, "command: not a list of strings"),
        ({"plan": ["x"]}, "plan: not a list of cells"),
        ({"extra": 1}, "fields foxhunt does not write: extra"),
        ({"job_id": "../x"}, "job_id: '../x' is not a job id"),
        ({"job_id": "good0002"}, "holds job good0002, not the job it is named after"),
    ],
)
def test_a_field_not_as_foxhunt_writes_it_is_refused_by_name(tmp_path, changes, why):
    path = jobs_dir(tmp_path) / "good0001.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**_fields(tmp_path), **changes}))
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace("[", r"\[").replace("+", r"\+")):
        LaunchFile.read(path)


def _special_files(folder: Path) -> None:
    """A pipe, a link to a pipe, JSON nested 100,000 deep, a file too large: each named as a launch file."""
    folder.mkdir(parents=True, exist_ok=True)
    os.mkfifo(folder / "pipe0001.json")
    (folder / "link0001.json").symlink_to(folder / "pipe0001.json")
    (folder / "deep0001.json").write_text("[" * 100_000)
    (folder / "huge0001.json").write_text(" " * (2 << 20))


def test_pipes_links_deep_and_huge_files_are_not_launch_files(tmp_path):
    folder = jobs_dir(tmp_path)
    _special_files(folder)
    for name in ("pipe0001", "link0001", "deep0001", "huge0001"):
        with pytest.raises((ValueError, OSError)):
            LaunchFile.read(folder / f"{name}.json")  # at once: a pipe opened without O_NONBLOCK waits for a writer
    os.mkfifo(folder / "job.log")
    assert log_tail(folder / "job.log", 5) == ""  # a pipe as a job's log: nothing, at once


def test_train_list_and_status_go_on_past_files_that_are_not_launch_files(tmp_path):
    """`foxhunt train list` failed for every job (RecursionError, blamed on the store) or hung on a
    pipe; `status` of a job whose launch file had a huge started_ms or an integer id was a traceback."""
    RunStore(store_uri(tmp_path)).ensure_experiment("foxhunt")
    folder = jobs_dir(tmp_path)
    _special_files(folder)
    (folder / "oddt0001.json").write_text(json.dumps({**_fields(tmp_path, "oddt0001"), "started_ms": 1e40}))
    LaunchFile(**{**_fields(tmp_path), "plan": []}).write(folder / "good0001.json")
    results: dict = {}

    def run() -> None:
        results["list"] = CliRunner().invoke(app, ["train", "list", "--root", str(tmp_path), "--json"])
        results["status"] = CliRunner().invoke(app, ["train", "status", "oddt0001", "--root", str(tmp_path)])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "foxhunt train list or status hung on a pipe in outputs/jobs"
    listed, status = results["list"], results["status"]
    assert listed.exit_code == 0 and listed.exception is None, listed.output
    # a job only its launch file knows (killed before its first run reached the store): listed, as status shows it
    assert [job["job_id"] for job in json.loads(listed.stdout)["jobs"]] == ["good0001"], listed.stdout
    assert status.exception is None or isinstance(status.exception, SystemExit), status.output
    assert "Traceback" not in status.output


def test_a_tracking_server_that_is_down_is_one_line_in_seconds_not_minutes(tmp_path, monkeypatch):
    """MLflow's HTTP client retries 7 times with backoff: `foxhunt train list` on a server that is
    down hung for minutes; a command a user waits on tries twice, 10 s each (foxhunt.commands.train_jobs)."""
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.setenv(name, "x")  # recorded as unset before the test: the command's defaults are undone after it
        monkeypatch.delenv(name)
    results: dict = {}
    thread = threading.Thread(target=lambda: results.update(out=CliRunner().invoke(
        app, ["train", "list", "--root", str(tmp_path), "--tracking-uri", "http://127.0.0.1:1"])), daemon=True)  # fmt: skip
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "foxhunt train list waited on a tracking server that is down"
    result = results["out"]
    assert result.exit_code == 2 and "cannot read the MLflow store http://127.0.0.1:1" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
