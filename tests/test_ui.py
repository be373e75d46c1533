"""The ``foxhunt`` command itself: ``foxhunt ui`` runs the MLflow UI and leaves nothing behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil

from waiting import process_gone, wait_until


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_ui_stopped_with_sigterm_exits_0_and_leaves_no_server_listening(tmp_path):
    from foxhunt.runs.environment import store_uri
    from foxhunt.runs.store import RunStore

    RunStore(store_uri(tmp_path)).ensure_experiment("foxhunt")
    port = _free_port()
    ui = subprocess.Popen([str(Path(sys.executable).parent / "foxhunt"), "ui", "--root", str(tmp_path), "--port", str(port)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))  # fmt: skip
    try:
        wait_until(lambda: _listening(port) or ui.poll() is not None, "mlflow ui listening", timeout=180)
        assert ui.poll() is None, ui.communicate()[0][-2000:]
        tree = psutil.Process(ui.pid).children(recursive=True)
        assert tree  # mlflow ui and its server workers
        ui.send_signal(signal.SIGTERM)
        out, _ = ui.communicate(timeout=60)
        assert ui.returncode == 0, out[-2000:]
        assert "Traceback" not in out
        wait_until(lambda: all(process_gone(p.pid) for p in tree), "every process of mlflow ui gone", timeout=30)
        assert not _listening(port)
    finally:
        if ui.poll() is None:
            ui.kill()
