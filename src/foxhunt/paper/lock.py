"""One session per ledger: an exclusive ``fcntl.flock`` on the ledger file itself, taken when
the ledger is opened and held until it is closed, and who holds it when it is refused.

The lock is on the file's own inode, not on a side file: a second name of the file or a rename
meets the same lock. The kernel drops a flock when its holder's file is closed, so also when the
process dies (kill -9, a crash, an OOM kill): a lock cannot go stale, and nothing has to guess
from a pid file whether its holder still lives. The holder is named from the kernel's own table
of locks (Linux's ``/proc/locks``: its pid; ``/proc/<pid>/stat``: when it started) and this
host (a flock is held on one host).

Within one process the held files are kept in :data:`_HELD` and a second take of one of them is
refused from there, before the file is opened again: closing any descriptor of a file drops the
process's POSIX locks on it, SQLite's own among them.

Written by hand on ``fcntl`` and ``os``: a lock on a file a library then opens by name (SQLite)
is not what lock-file packages (filelock, portalocker) do.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import socket
from pathlib import Path

_HELD: dict[tuple[int, int], str] = {}  # (device, inode) of a file held by this process -> its holder


class Held(Exception):
    """The file is held by another session; ``holder``: who (pid, host, since when)."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


class FileLock:
    """The exclusive lock on one existing-or-new regular file (module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.fd: int | None = None
        self.key: tuple[int, int] | None = None

    def take(self) -> os.stat_result:
        """Open (making it when absent, never through a symbolic link) and lock the file; its
        stat. :class:`Held` when another session holds it; ``OSError`` from opening it."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and (st.st_dev, st.st_ino) in _HELD:
            raise Held(_HELD[(st.st_dev, st.st_ino)])
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        if key in _HELD:  # renamed into place since the check above: close this descriptor only
            os.close(fd)
            raise Held(_HELD[key])
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Held(holder_of(st)) from None
        self.fd, self.key = fd, key
        _HELD[key] = describe(os.getpid())
        return st

    def release(self) -> None:
        """Drop the lock (closing the descriptor); the file stays."""
        if self.fd is not None:
            if self.key is not None:  # set with fd
                _HELD.pop(self.key, None)
            os.close(self.fd)
            self.fd = self.key = None


def holder_of(st: os.stat_result) -> str:
    """Who holds a flock on the file of ``st``, from ``/proc/locks`` (else: unknown)."""
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split()  # "1: FLOCK  ADVISORY  WRITE 7914 fe:00:2146399 0 EOF" ("->" marks a waiter)
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[-3] == inode and parts[-4].isdigit():
            return describe(int(parts[-4]))
    return f"a process on {socket.gethostname()} this one cannot see (no /proc/locks entry names it)"


def describe(pid: int) -> str:
    """``pid <pid> on <host> since <start, UTC>``."""
    return f"pid {pid} on {socket.gethostname()} since {_started(pid)}"


def _started(pid: int) -> str:
    """When process ``pid`` started (UTC, to the second), from ``/proc``; ``an unknown time`` elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat: start time in clock ticks after boot
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime "))
        at = boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, StopIteration):
        return "an unknown time"
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
