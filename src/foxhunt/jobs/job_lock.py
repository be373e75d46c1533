"""One launch of a job at a time: an OS lock on ``<root>/outputs/jobs/<job_id>.lock``.

``foxhunt train start`` takes a new job's lock; ``start --resume J`` takes J's before it reads
the job's state for the last time, so two resumes of one job cannot both see it stopped and
both launch it (the second one is refused in one line naming the holder). The launcher hands
the lock to the job's supervisor (an inherited descriptor), which hands it to training: it is
held from the moment a launch decides to run the job until the last process of that launch
exits.

The lock is ``fcntl.flock`` on an open file: the kernel drops it when the last process holding
that open file exits, however it exits (``kill -9`` included), so it cannot go stale and
nothing has to clean it up. The file's content (pid, host, what, since) is only there to name
the holder in the refusal; it is read as text and trusted for nothing else. Only processes that
share the folder's lock manager see each other (one host; NFS forwards flock to the server on
Linux): across hosts the store's RUNNING state still refuses a running job.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from datetime import datetime
from pathlib import Path

from foxhunt.jobs.launch_file import jobs_dir
from foxhunt.printable import visible
from foxhunt.runs.liveness import process_alive

LOCK_SUFFIX = ".lock"
LOCK_FD_FLAG = "--lock-fd"  # the supervisor's argument: the descriptor of the job's lock it inherits
HOLDER_BYTES = 4096  # what is read of a lock file to name its holder
HOLDER_TEXT = 160  # characters of an unreadable holder description shown
HOLDER_WAIT_S = 1.0  # how long a refusal waits for a holder that has just taken the lock to name itself
HOLDER_POLL_S = 0.02


class JobLockHeld(RuntimeError):
    """Another process holds the job's lock, or its file cannot be opened; the message (one
    line) names the holder or the path."""


def lock_path(root: Path, job_id: str) -> Path:
    return jobs_dir(root) / f"{job_id}{LOCK_SUFFIX}"


class JobLock:
    """The job's lock, held by this process (and any process its descriptor was handed to)."""

    def __init__(self, path: Path, fd: int, job_id: str) -> None:
        self.path, self.fd, self.job_id = path, fd, job_id

    @classmethod
    def acquire(cls, root: Path, job_id: str, what: str) -> JobLock:
        """Take job ``job_id``'s lock at once, naming this process and ``what`` it does as the
        holder; :class:`JobLockHeld` when another process holds it (nothing waits)."""
        path = lock_path(root, job_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO planted there: a traceback from ftruncate before
                os.close(fd)
                raise OSError(errno.EINVAL, "not a regular file")
        except OSError as exc:  # a link or a folder planted at its name, the jobs folder a file: one line
            raise JobLockHeld(f"job {job_id}: its lock {path} cannot be opened ({exc.strerror or exc}; a symbolic link is "
                              "refused): remove what is at that path") from None  # fmt: skip
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _named_holder(fd)
            os.close(fd)
            raise JobLockHeld(f"job {job_id} is being launched or run by another process ({holder}): wait for it to "
                              f"end, or stop it (foxhunt train stop {job_id})") from None  # fmt: skip
        except BaseException:
            os.close(fd)
            raise
        lock = cls(path, fd, job_id)
        lock.name_holder(os.getpid(), what)
        return lock

    def name_holder(self, pid: int, what: str) -> None:
        """Write who holds the lock now (the launcher, then the supervisor it started)."""
        text = json.dumps({"pid": pid, "host": socket.gethostname(), "what": what, "since_ms": int(time.time() * 1000)})
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text.encode(), 0)

    def close(self) -> None:
        """Close this process's descriptor. Never an unlock: a process the descriptor was handed
        to (the supervisor) holds the same lock, which ends when the last holder closes it."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> JobLock:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _named_holder(fd: int) -> str:
    """The holder the lock file names; a holder that has the lock but has not written its name
    yet (between its ``flock`` and its write) is given :data:`HOLDER_WAIT_S` to do so."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        raw = os.pread(fd, HOLDER_BYTES, 0)
        if raw.strip() or time.monotonic() >= deadline:
            return _holder(raw)
        time.sleep(HOLDER_POLL_S)


def _holder(raw: bytes) -> str:
    """The holder a lock file names, as one line: ``pid N on HOST (what, since TIME)``."""
    try:
        data = json.loads(raw.decode())
        pid, host, what, since = int(data["pid"]), str(data["host"]), str(data["what"]), int(data["since_ms"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, OverflowError):
        text = " ".join(raw.decode(errors="replace").split())[:HOLDER_TEXT]
        return f"its lock file says {visible(text)!r}" if text else "it has not named itself yet"
    when = datetime.fromtimestamp(since / 1000).isoformat(timespec="seconds") if 0 < since < 2**42 else "?"
    gone = ", gone: a process it started still holds the lock" if host == socket.gethostname() and not process_alive(pid) else ""
    # escaped: a host planted with a terminal escape and a forged line was printed raw (found by a helper)
    return f"pid {pid} on {visible(host[:HOLDER_TEXT])} ({visible(what[:HOLDER_TEXT])}, since {when}{gone})"
