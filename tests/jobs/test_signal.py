"""`foxhunt train stop` reaches every process of a sweep that does not lead its own group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from foxhunt.jobs.launch import _signal

# A parent that shares the test's process group and starts a child; both record SIGTERM.
TREE = r"""
import os, signal, subprocess, sys, time
out = sys.argv[1]
def record(name):
    def handler(*_):
        open(os.path.join(out, name), "w").close()
        sys.exit(0)
    return handler
if len(sys.argv) > 2:
    signal.signal(signal.SIGTERM, record("child"))
    open(os.path.join(out, "child_ready"), "w").close()
    time.sleep(60)
else:
    signal.signal(signal.SIGTERM, record("parent"))
    child = subprocess.Popen([sys.executable, __file__, out, "child"])
    time.sleep(60)
"""


def _wait_for(path: Path, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.05)
    return False


def test_sigterm_reaches_the_children_of_a_process_that_leads_no_group(tmp_path):
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path)])  # same group as pytest
    try:
        assert _wait_for(tmp_path / "child_ready")
        assert os.getpgid(parent.pid) != parent.pid
        (child,) = psutil.Process(parent.pid).children()
        _signal(parent.pid, signal.SIGTERM)
        assert _wait_for(tmp_path / "child") and _wait_for(tmp_path / "parent")
        parent.wait(timeout=20)
        assert not psutil.pid_exists(child.pid) or child.status() == psutil.STATUS_ZOMBIE
    finally:
        for process in psutil.Process(os.getpid()).children(recursive=True):
            if process.pid == parent.pid or process.ppid() == parent.pid:
                process.kill()
