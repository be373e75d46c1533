"""A sweep's worker ends when the sweep's own process dies: the watcher sends it SIGTERM (a
graceful stop), says it is orphaned, and ends it after the grace period whatever it does; a
process that is not a child of the sweep is never watched."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from foxhunt.runs.environment import SWEEP_PID_ENV
from foxhunt.sweeps import orphans
from waiting import process_gone, wait_until

# A worker of the sweep: watched with a 0.5 s grace, it ignores SIGTERM (as a cell busy saving
# its checkpoint might), so only the watcher's forced exit ends it.
WORKER = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from foxhunt.sweeps import orphans
    out = Path(sys.argv[1])
    signal.signal(signal.SIGTERM, lambda *_: (out / "sigterm").write_text(str(orphans.orphaned())))
    os.environ["FOXHUNT_SWEEP_PID"] = str(os.getppid())
    (out / "watched").write_text(str(orphans.watch_sweep_process(0.5)))
    while True:
        time.sleep(0.05)
""")
# The sweep's process: starts the worker, names it, then waits to be killed.
SWEEP = textwrap.dedent("""
    import subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
    print(worker.pid, flush=True)
    time.sleep(120)
""")


def test_the_sweep_pid_is_read_from_the_environment(monkeypatch):
    for value, pid in (("4242", 4242), ("", None), ("x1", None), ("-3", None)):
        monkeypatch.setenv(SWEEP_PID_ENV, value)
        assert orphans.sweep_pid() == pid, value
    monkeypatch.delenv(SWEEP_PID_ENV)
    assert orphans.sweep_pid() is None


def test_only_a_child_of_the_sweep_is_watched(monkeypatch):
    monkeypatch.delenv(SWEEP_PID_ENV, raising=False)
    assert not orphans.watch_sweep_process(1.0)  # no sweep named
    monkeypatch.setenv(SWEEP_PID_ENV, str(os.getpid()))
    assert not orphans.watch_sweep_process(1.0)  # the sweep's own process (Hydra's basic launcher)
    monkeypatch.setenv(SWEEP_PID_ENV, str(os.getppid() + 1))
    monkeypatch.setenv(orphans.SLURM_JOB_ENV, "42")
    assert not orphans.watch_sweep_process(1.0)  # not its child (a SLURM task on another node)
    monkeypatch.setenv(SWEEP_PID_ENV, str(os.getppid()))  # its child, but unwatched:
    assert not orphans.watch_sweep_process(None)  # strategy.orphan_grace_s: null
    assert not orphans.orphaned()


def test_a_worker_whose_sweep_is_killed_gets_sigterm_then_ends_after_the_grace(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    sweep = subprocess.Popen([sys.executable, "-c", SWEEP, WORKER, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    worker = int(sweep.stdout.readline())
    try:
        assert (
            wait_until(lambda: (tmp_path / "watched").is_file() and (tmp_path / "watched").read_text(), "the worker is watched")
            == "True"
        )
        assert not (tmp_path / "sigterm").exists()  # the sweep lives: nothing happens
        sweep.kill()  # kill -9: the worker is orphaned
        sweep.wait()
        sigterm = wait_until(
            lambda: (tmp_path / "sigterm").is_file() and (tmp_path / "sigterm").read_text(), "SIGTERM reached the worker"
        )
        assert sigterm == "True"  # orphaned() is already true when the stop request arrives
        wait_until(lambda: process_gone(worker), "the worker that ignored SIGTERM ended after the grace")
    finally:
        sweep.kill()
        if not process_gone(worker):
            os.kill(worker, 9)


# A worker whose sweep's process died before its job began: re-parented already, it starts nothing.
LATE = textwrap.dedent("""
    import os, sys
    from foxhunt.sweeps import orphans
    os.environ.pop(orphans.SLURM_JOB_ENV, None)
    os.environ["FOXHUNT_SWEEP_PID"] = sys.argv[1]
    print(orphans.watch_sweep_process(0.5), orphans.orphaned())
""")


def test_a_worker_its_sweep_left_before_its_job_began_starts_nothing(tmp_path):
    """loky workers orphaned while importing were not watched (their parent was no longer the
    sweep's process) and trained their trials minutes after the kill, racing the relaunch (found
    by a helper): a local worker whose sweep's process is gone is orphaned at once."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid no process holds now (the sweep's, killed)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", LATE, str(gone.pid)], capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout.split() == ["False", "True"], done.stderr[-2000:]  # not watched: orphaned already
    assert "is gone before this worker's job began" in done.stderr
