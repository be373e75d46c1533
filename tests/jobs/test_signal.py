"""`foxhunt train stop` reaches every process of a sweep that does not lead its own group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil

from foxhunt.jobs.launch import _signal
from waiting import process_gone, wait_until

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


def test_sigterm_reaches_the_children_of_a_process_that_leads_no_group(tmp_path):
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path)])  # same group as pytest
    try:
        wait_until((tmp_path / "child_ready").exists, "the child started")
        assert os.getpgid(parent.pid) != parent.pid
        (child,) = psutil.Process(parent.pid).children()
        _signal(parent.pid, signal.SIGTERM)
        wait_until((tmp_path / "child").exists, "the child's SIGTERM handler ran")
        wait_until((tmp_path / "parent").exists, "the parent's SIGTERM handler ran")
        parent.wait(timeout=60)
        # the handler's file comes before the exit: the child's interpreter still has to shut down
        wait_until(lambda: process_gone(child.pid), "the child exited")
    finally:
        for process in psutil.Process(os.getpid()).children(recursive=True):
            if process.pid == parent.pid or process.ppid() == parent.pid:
                process.kill()
