"""Waiting for what a test asserts, with a deadline: the one way tests here meet another process.

A subprocess, a signal handler or a supervisor acts on its own schedule; on a loaded machine
(the full suite on 2 cores) it can take seconds longer than when a test runs alone. A test
that checks such an outcome at one instant races; :func:`wait_until` polls for it until a
generous deadline instead, so the test is as fast as the outcome and fails only when the
outcome never comes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import psutil

T = TypeVar("T")
DEADLINE_S = 60.0  # far above what any outcome here takes under load; reached only on a failure
POLL_S = 0.05


def wait_until(outcome: Callable[[], T], what: str, timeout: float = DEADLINE_S, poll: float = POLL_S) -> T:
    """``outcome()`` once it is truthy; ``AssertionError`` naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = outcome()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(poll)


def process_gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for its parent to reap it counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
