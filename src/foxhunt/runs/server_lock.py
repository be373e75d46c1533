"""A lock that every host of a team holds one at a time: made of an MLflow server's own records.

A team's store is an MLflow server (``logger.tracking_uri=http://...``, docs/how-to/slurm.md)
that every host reaches. ``foxhunt ensemble register``, ``roll``, ``rollback``, ``runs prune`` and
a search's count-and-ask each read the store, then write what they read decided; two at once
on two hosts would both find no champion and register one each, or promote over each other.
An ``flock`` (what a SQLite store's steps hold: :meth:`foxhunt.runs.store.RunStore.exclusive`)
reaches one host's files only, and MLflow has no lock of its own, so this module makes one out
of what its API does atomically. Written by hand because no library locks through MLflow.

**How.** Lock ``name`` is the registered model ``foxhunt-lock-<name>``. A process that wants it
registers a version of that model: the server numbers a model's versions one after another in
one transaction (two processes never get the same number, and a deleted version's number is
never given again), so the versions are a queue in arrival order. The process holds the lock
once no live version is numbered below its own, and releases it by deleting its version.

**A holder that died** (``kill -9``, a host gone) leaves its version behind. Every process in the
queue writes its version's description at least every ``lease_s / 4`` (a heartbeat; the server
stamps the version's ``last_updated_timestamp`` with its own clock), and a process waiting
deletes any version ahead of it whose last stamp is older than ``lease_s`` on that same server
clock (:data:`LEASE_S`): no two hosts' clocks are ever compared. A holder that is stopped
(SIGSTOP, a paused virtual machine) for longer than the lease loses the lock without knowing;
it says so when it releases.

The registered model and its deleted versions stay in the registry (MLflow keeps a deleted
version's row, which is what keeps the numbers unique); the UI lists the model with no live
version between steps.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from foxhunt.errors import UserError, one_line_error

# Lazy imports: (c) mlflow, in the functions that reach the server: the store's module imports this one

log = logging.getLogger(__name__)

PREFIX = "foxhunt-lock-"  # a lock's registered model: PREFIX + its name
SOURCE = "foxhunt-lock:/queue"  # a lock version's source (absolute: the server refuses a relative one)
#: How long a version may go without a heartbeat before a process behind it deletes it (seconds):
#: the longest a lock stays with a holder that died. Heartbeats come every quarter of it.
LEASE_S = 60.0
POLL_S = 0.5  # how often a waiting process reads the queue


class LockError(UserError):
    """The server could not be reached or refused a lock's record: one line naming it."""

    kind = "store"


def _holder() -> str:
    """This process, as a lock version's description names it (the "waiting behind" line)."""
    return f"host {socket.gethostname()} pid {os.getpid()}"


def lock_model(name: str) -> str:
    return PREFIX + name


@contextmanager
def server_lock(client, name: str, lease_s: float = LEASE_S, poll_s: float = POLL_S) -> Iterator[None]:
    """Hold lock ``name`` on the store of MLflow ``client`` for the block (module doc)."""
    from mlflow.exceptions import MlflowException

    model = lock_model(name)
    where = f"{client.tracking_uri}: the lock {model}"
    try:
        mine, stamp = _enqueue(client, model)
    except MlflowException as exc:
        raise LockError(f"{where} cannot be taken ({one_line_error(exc, with_type=False, first_line=True, limit=300)})") from None
    beat = _Heartbeat(client, model, mine, stamp, lease_s / 4)
    beat.start()
    try:
        _wait_first(client, model, mine, beat, lease_s, poll_s, where)
        yield
    finally:
        beat.stop()
        _release(client, model, mine, beat.lost, where, lease_s)


def _enqueue(client, model: str) -> tuple[int, int]:
    """Our version of the lock's model (made when missing) and its server stamp (ms)."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(model, description="foxhunt's cross-host lock (foxhunt.runs.server_lock)")
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    made = client.create_model_version(model, SOURCE, tags={"holder": _holder()}, description=f"{_holder()}: waiting",
                                       await_creation_for=0)  # fmt: skip
    return int(made.version), int(made.last_updated_timestamp)


def _wait_first(client, model: str, mine: int, beat: _Heartbeat, lease_s: float, poll_s: float, where: str) -> None:
    """Return once no live version of ``model`` is numbered below ``mine``; delete the dead ones ahead."""
    from mlflow.exceptions import MlflowException

    waited_since, said = time.monotonic(), False
    while True:
        try:
            ahead = [v for v in client.search_model_versions(f"name = '{model}'") if int(v.version) < mine]
        except MlflowException as exc:
            raise LockError(
                f"{where} cannot be read ({one_line_error(exc, with_type=False, first_line=True, limit=300)})"
            ) from None
        now_ms = beat.server_now_ms()
        live = []
        for version in ahead:
            if now_ms - int(version.last_updated_timestamp) > lease_s * 1000:
                _delete(client, model, int(version.version))
                log.warning("%s: version %s (%s) had no heartbeat for over %g s: its holder is gone; removed",
                            where, version.version, version.description, lease_s)  # fmt: skip
            else:
                live.append(version)
        if not live:
            return
        if not said and time.monotonic() - waited_since > 2 * poll_s:
            log.info("%s: waiting behind %s", where, "; ".join(str(v.description) for v in live))
            said = True
        time.sleep(poll_s)


class _Heartbeat(threading.Thread):
    """Rewrites our version's description every ``every_s`` seconds; the server's stamp of the
    last write, plus the time since on this host's monotonic clock, is the server's time now."""

    def __init__(self, client, model: str, version: int, stamp_ms: int, every_s: float) -> None:
        super().__init__(name=f"foxhunt-lock-{model}", daemon=True)
        self.client, self.model, self.version, self.every_s = client, model, version, every_s
        self._stamp = (stamp_ms, time.monotonic())
        self._done = threading.Event()
        self.lost = False  # our version was deleted under us (we were silent past the lease)
        self.beats = 0

    def server_now_ms(self) -> int:
        stamp_ms, at = self._stamp
        return stamp_ms + int((time.monotonic() - at) * 1000)

    def run(self) -> None:
        from mlflow.exceptions import MlflowException

        while not self._done.wait(self.every_s):
            sent = time.monotonic()
            try:
                done = self.client.update_model_version(self.model, self.version, description=f"{_holder()}: beat {self.beats}")
            except MlflowException as exc:
                if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                    self.lost = True
                    return
                log.warning("%s v%s: heartbeat not written (%s)", self.model, self.version, one_line_error(exc, limit=200))
                continue
            except Exception as exc:  # the server unreachable for a moment (requests' errors): try again next beat
                log.warning("%s v%s: heartbeat not written (%s)", self.model, self.version, one_line_error(exc, limit=200))
                continue
            self.beats += 1
            self._stamp = (int(done.last_updated_timestamp), sent)

    def stop(self) -> None:
        self._done.set()
        if self.is_alive():
            self.join()


def _delete(client, model: str, version: int) -> bool:
    """Delete a version; False when it was gone already (another process removed it first)."""
    from mlflow.exceptions import MlflowException

    try:
        client.delete_model_version(model, version)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return False
        raise
    return True


def _release(client, model: str, mine: int, lost: bool, where: str, lease_s: float) -> None:
    from mlflow.exceptions import MlflowException

    try:
        gone = not _delete(client, model, mine)
    except MlflowException as exc:  # left behind: the next process removes it after the lease
        log.warning(
            "%s: version %s not released (%s); it lapses after %g s", where, mine, one_line_error(exc, limit=200), lease_s
        )
        return
    if gone or lost:
        log.warning("%s: version %s was removed while this process held it (no heartbeat reached the server for a "
                    "lease): another process may have held the lock meanwhile", where, mine)  # fmt: skip
