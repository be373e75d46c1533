"""A server a command runs in the foreground as a child process group, and stops whole.

``foxhunt ui`` runs ``mlflow ui``, which starts a server with workers of its own. Ended by a
signal, a command that only waited for its child would leave that tree listening on the port;
:func:`run_foreground` starts the child in a process group of its own and, when the command
gets SIGTERM, SIGINT or SIGHUP, sends the signal to the whole group, waits up to
``grace_s`` for it to exit, then kills what is left. It returns the child's exit status, or 0
when the stop was asked for (a stopped server is no failure).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run_foreground(command: Sequence[str], env: dict[str, str], grace_s: float) -> int:
    """Run ``command`` until it exits or this process is asked to stop (module doc)."""
    child = subprocess.Popen(list(command), env=env, start_new_session=True)
    stopped: list[int] = []

    def forward(signum, _frame) -> None:
        stopped.append(signum)
        _signal_group(child.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        code: int | None = None
        while code is None:
            try:
                code = child.wait(timeout=grace_s if stopped else None)
            except subprocess.TimeoutExpired:  # asked to stop and still there after the grace
                _signal_group(child.pid, signal.SIGKILL)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _signal_group(child.pid, signal.SIGKILL)  # workers that outlived their parent
    return 0 if stopped else code


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
