"""A server store's steps hold a lock on the server (foxhunt.runs.server_lock): processes that
read then write under RunStore.exclusive on an MLflow server never interleave (before, a server
store's steps ran unlocked and lost updates); a holder killed with kill -9 gives the lock up
after the lease; a live holder past the lease keeps it (its heartbeat)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from foxhunt.runs.server_lock import lock_model, server_lock
from foxhunt.runs.store import RunStore

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real MLflow tracking server (SQLite behind it), as a team runs one."""
    folder = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]  # fmt: skip
    log = open(folder / "server.log", "w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2)
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((folder / "server.log").read_text()[-2000:]) from None
            time.sleep(0.2)
    yield uri
    os.killpg(process.pid, signal.SIGKILL)  # its store is this test's folder: nothing to shut down cleanly (SIGTERM: 6 s)
    process.wait(timeout=30)
    log.close()


def _workers(script: str, count: int, *args: str) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": SRC}
    return [subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(count)]  # fmt: skip


COUNTER = """
    import sys, time
    from pathlib import Path
    from foxhunt.runs.store import RunStore
    store, counter = RunStore(sys.argv[1]), Path(sys.argv[2])
    for _ in range(3):
        with store.exclusive("counter"):
            value = int(counter.read_text())
            time.sleep(0.05)  # read, think, write: an unlocked pair interleaves here
            counter.write_text(str(value + 1))
"""


def test_steps_on_a_server_store_never_interleave(server, tmp_path):
    counter = tmp_path / "counter"
    counter.write_text("0")
    for worker in _workers(COUNTER, 2, server, str(counter)):
        out, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err[-2000:]
    assert counter.read_text() == "6"  # unlocked: updates lost (2 processes x 3 steps)
    versions = RunStore(server).client.search_model_versions(f"name = '{lock_model('counter')}'")
    assert versions == []  # every step released its version


HOLD = """
    import os, signal, sys, time
    from foxhunt.runs.server_lock import server_lock
    from foxhunt.runs.store import RunStore
    with server_lock(RunStore(sys.argv[1]).client, "held", lease_s=float(sys.argv[2]), poll_s=0.05):
        print("held", flush=True)
        if sys.argv[3] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(float(sys.argv[3]))
    print("released", time.time(), flush=True)
"""


def test_a_holder_killed_gives_the_lock_up_after_the_lease_and_a_live_one_keeps_it(server, caplog):
    client = RunStore(server).client
    (killed,) = _workers(HOLD, 1, server, "1.0", "kill")
    assert killed.stdout.readline().strip() == "held"
    killed.wait(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    start = time.monotonic()
    with server_lock(client, "held", lease_s=1.0, poll_s=0.05):
        waited = time.monotonic() - start
    assert waited < 30  # the dead holder's version lapsed and was removed
    assert "its holder is gone" in caplog.text

    (live,) = _workers(HOLD, 1, server, "1.0", "4")  # holds 4 leases long, its heartbeat every quarter lease
    assert live.stdout.readline().strip() == "held"
    with server_lock(client, "held", lease_s=1.0, poll_s=0.05):
        acquired = time.time()
    out, err = live.communicate(timeout=60)
    assert live.returncode == 0, err[-2000:]
    released = float(out.split()[-1])
    assert acquired >= released  # never taken from a live holder


def test_a_server_study_is_locked_on_the_mlflow_server(server):
    """A search's count-and-ask on a PostgreSQL study (no file to flock) holds its lock on the
    team's MLflow server, named by a digest of the URL (the URL's password never reaches the store)."""
    import hashlib

    from foxhunt.sweeps.study import study_lock

    url = "postgresql+psycopg2://optuna:s3cret@db-host/optuna"
    model = lock_model("study-" + hashlib.sha256(url.encode()).hexdigest()[:16])
    client = RunStore(server).client
    with study_lock(url, server):
        (held,) = client.search_model_versions(f"name = '{model}'")
    assert "s3cret" not in model and "s3cret" not in str(held.description)
    assert client.search_model_versions(f"name = '{model}'") == []
