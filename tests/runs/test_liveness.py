"""Is a RUNNING run still running: its process on this host checked (gone, a zombie, or a
reused pid that is no foxhunt command: STALE), a run on another host left as the store says."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from foxhunt.runs.liveness import process_alive, run_state
from foxhunt.runs.status import Status
from foxhunt.runs.stored import StoredRun
from waiting import wait_until

HOST = socket.gethostname()


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def running(pid, host=HOST, start_ms=None, status="RUNNING"):
    start = int(time.time() * 1000) if start_ms is None else start_ms
    tags = {"host": host} if pid is None else {"host": host, "pid": str(pid)}
    return StoredRun("r", "n", "e", status, start, None, tags, {})


@pytest.fixture
def sleeper():
    """A process created now that is no foxhunt command."""
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def test_no_pid_or_a_gone_one_is_not_alive_and_this_process_is():
    assert [process_alive(pid) for pid in (None, 0, -1, dead_pid())] == [False] * 4
    assert process_alive(os.getpid())


def test_a_zombie_is_not_alive():
    child = subprocess.Popen(["true"])
    wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, "the child is a zombie")
    try:
        assert not process_alive(child.pid)
    finally:
        child.wait()


def test_a_process_created_after_the_run_was_last_seen_counts_only_if_it_is_foxhunt(sleeper):
    created_ms = psutil.Process(sleeper.pid).create_time() * 1000
    assert process_alive(sleeper.pid)  # no last sign of life to compare with
    assert process_alive(sleeper.pid, since_ms=int(created_ms))  # created before the run was last seen
    assert not process_alive(sleeper.pid, since_ms=int(created_ms) - 60_000)  # a reused pid
    foxhunt = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "foxhunt-train"])
    try:  # until the child has exec'd, its command line is the forking parent's
        wait_until(lambda: "foxhunt-train" in psutil.Process(foxhunt.pid).cmdline(), "the child's own command line")
        assert process_alive(foxhunt.pid, since_ms=int(created_ms) - 60_000)  # a resumed run's new process
    finally:
        foxhunt.kill()
        foxhunt.wait()


@given(status=st.sampled_from([s for s in Status if s != Status.RUNNING]), pid=st.sampled_from([None, 0, os.getpid()]))
def test_a_run_that_is_not_running_keeps_its_status_whatever_its_process(status, pid):
    assert run_state(running(pid, status=status)) == status


def test_a_running_run_is_stale_when_its_process_on_this_host_is_gone(sleeper):
    assert run_state(running(os.getpid())) == Status.RUNNING
    assert run_state(running(dead_pid())) == Status.STALE
    assert run_state(running(None)) == Status.STALE  # no pid tag: nothing runs it
    assert run_state(running("abc")) == Status.STALE
    # the pid lives but was created long after the run was last seen: reused, not the run's
    assert run_state(running(sleeper.pid, start_ms=int(time.time() * 1000) - 3_600_000)) == Status.STALE


def test_a_run_on_another_host_is_never_declared_stale_from_here():
    assert run_state(running(dead_pid(), host="other-host")) == Status.RUNNING
    assert run_state(running(dead_pid(), host="node7"), host="node7") == Status.STALE  # checked on its own host
