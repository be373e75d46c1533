"""The supervisor on its own (no training): a job that dies before reaching the store still
gets a run, FAILED with its log's last lines, or KILLED when it was stopped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from foxhunt.jobs.job_lock import LOCK_FD_FLAG, JobLock, JobLockHeld
from foxhunt.jobs.launch_file import LaunchFile, jobs_dir
from foxhunt.jobs.views import find_job
from foxhunt.runs.environment import JOB_ID_ENV


def launch(
    root: Path, job_id: str, code: str, lock: JobLock | None = None, filed: list[str] | None = None, as_train: bool = False
) -> tuple[subprocess.Popen, Path]:
    """The supervisor of a job that runs ``code`` (the launcher's argument); ``filed``: another
    command in the launch file (what a planted file says)."""
    folder = jobs_dir(root)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"{job_id}.log"
    command = [sys.executable, "-c", code]
    if as_train:  # run as foxhunt-train (a script of that name), the program a job trains with
        (root / "foxhunt-train").write_text(code)
        command = [sys.executable, str(root / "foxhunt-train")]
    launch_file = LaunchFile(
        job_id=job_id, pid=0, host=socket.gethostname(), command=filed or command, overrides=["model=x"],
        log=str(log), tracking_uri=f"sqlite:///{root / 'mlruns' / 'mlflow.db'}", root=str(root),
        sweep_dir=str(root / "sweep"), started_ms=int(time.time() * 1000), plan=[], experiment="unit",
    )  # fmt: skip
    path = folder / f"{job_id}.json"
    launch_file.write(path)
    handed = [LOCK_FD_FLAG, str(lock.fd)] if lock is not None else []
    with open(log, "a") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "foxhunt.jobs.supervisor", str(path), *handed, "--", *command], cwd=root, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(lock.fd,) if lock is not None else (),
            env={**os.environ, JOB_ID_ENV: job_id},  # as foxhunt train start launches it: the job's id for all it starts
        )  # fmt: skip
    if lock is not None:
        lock.name_holder(process.pid, "the job's supervisor")
    launch_file.pid = process.pid
    launch_file.write(path)
    return process, log


def _training_pid(log: Path) -> int:
    """The pid the job's training prints as ``training <pid>``, once its log says it (within 60 s)."""
    deadline = time.monotonic() + 60
    while "training" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    return int(log.read_text().split("training", 1)[1].split()[0])


def test_a_job_that_dies_before_the_store_gets_a_failed_run_with_its_error(tmp_path):
    crash = "print('ModuleNotFoundError: No module named nowhere'); raise SystemExit(3)"
    process, _ = launch(tmp_path, "dead0001", crash)
    assert process.wait(timeout=120) == 3
    job = find_job(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}", "dead0001", root=tmp_path)
    assert job.state == "FAILED" and job.parent.experiment == "unit"
    assert "ModuleNotFoundError: No module named nowhere" in job.error
    assert job.overrides == ["model=x"] and job.pid == process.pid


def test_what_runs_is_the_launchers_command_never_the_launch_files(tmp_path):
    """The launch file sits in outputs/jobs, written twice by the launcher: a command swapped into
    it between the writes ran (found by probing the job CLI as an attacker)."""
    planted = tmp_path / "PWNED"
    process, log = launch(tmp_path, "swap0001", "print('the launcher s command', flush=True)",
                          filed=["sh", "-c", f"touch {planted}"])  # fmt: skip
    assert process.wait(timeout=120) == 0
    assert "the launcher s command" in log.read_text() and not planted.exists()


def test_without_a_command_the_supervisor_runs_nothing(tmp_path):
    path = jobs_dir(tmp_path) / "none0001.json"
    done = subprocess.run(
        [sys.executable, "-m", "foxhunt.jobs.supervisor", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and done.stderr.startswith("usage: python -m foxhunt.jobs.supervisor <launch file .json>")


def test_sigterm_to_the_group_ends_the_job_killed(tmp_path):
    process, log = launch(tmp_path, "stop0001", "import time; print('training', flush=True); time.sleep(120)")
    deadline = time.monotonic() + 60
    while "training" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=120) == 128 + signal.SIGTERM
    job = find_job(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}", "stop0001", root=tmp_path)
    assert job.state == "KILLED" and job.parent.tags["stop_reason"] == "SIGTERM"
    assert "SIGTERM received, waiting for training to stop" in log.read_text()


def test_the_job_lock_is_held_by_training_too_until_the_last_of_them_exits(tmp_path):
    """The supervisor hands the job's lock to training: with the supervisor killed alone, the
    job still cannot be launched again while its training runs."""
    with JobLock.acquire(tmp_path, "lock0001", "test") as lock:
        process, log = launch(
            tmp_path, "lock0001", "import os, time; print('training', os.getpid(), flush=True); time.sleep(120)", lock
        )
    training = _training_pid(log)
    os.kill(process.pid, signal.SIGKILL)  # the supervisor alone
    process.wait(timeout=30)
    try:
        with pytest.raises(JobLockHeld, match="gone: a process it started still holds the lock"):
            JobLock.acquire(tmp_path, "lock0001", "test")
    finally:
        os.kill(training, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:  # the orphaned training process is reaped by init: the lock goes with it
        try:
            JobLock.acquire(tmp_path, "lock0001", "test").close()
            break
        except JobLockHeld:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_a_job_whose_supervisor_was_killed_alone_is_stopped_through_its_group(tmp_path):
    """kill -9 of the supervisor alone left training running in the job's process group, and
    'foxhunt train stop' answered 'its process is gone: it is stale, resume it' while resume
    answered 'RUNNING: stop it first' (found by probing the job CLI as an attacker)."""
    import psutil

    from foxhunt.jobs.launch import stop
    from foxhunt.jobs.views import Job
    from foxhunt.runs.status import Status

    code = "import os, time; print('training', os.getpid(), flush=True); time.sleep(120)"
    process, log = launch(tmp_path, "orph0001", code, as_train=True)
    training = _training_pid(log)
    os.kill(process.pid, signal.SIGKILL)  # the supervisor alone
    process.wait(timeout=60)
    launch_file = LaunchFile.read(jobs_dir(tmp_path) / "orph0001.json")
    job = Job("orph0001", None, [], [], Status.RUNNING, launch_file)  # as the store shows it: its cell's run RUNNING

    result = stop(job, f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}", timeout_s=30, force=True, poll_s=0.1)

    assert result.exited and not result.forced  # SIGTERM to the group reached training
    assert not psutil.pid_exists(training) or psutil.Process(training).status() == psutil.STATUS_ZOMBIE
