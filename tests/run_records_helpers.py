"""Helpers of the end-to-end run-record tests (tests/test_run_records.py, test_same_second_runs.py,
test_kill_resume.py, test_killed_sweep.py): real ``foxhunt-train`` processes on a shared SQLite
store, ``foxhunt-train`` in the test's process where no process boundary is checked, and what the
store holds."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from train_entry import train_here

BIN = Path(sys.executable).parent
# Small and quick: a few batches of tiny networks on ten days of bars, scored on 300 bars.
QUICK = [
    "trainer=smoke", "data.source.days=10", "evaluation.plot_equity=false", "evaluation.max_bars=300",
    "evaluation.bootstrap.samples=50", "strategy.torch_threads=1",
]  # fmt: skip
# Tiny sizes that keep at least one tensor torchao gives 8-bit states (>= 4,096 elements, a
# multiple of its block): the compiled 8-bit update runs, as in a real int8 run. The update is
# compiled once per weight shape (foxhunt.precision.eight_bit_step): the TFT's width of 24 has two
# such shapes, (24, 192) and (24, 288), where 64 had eight (each a few seconds of inductor's C++
# compilation on a CPU the first time; its on-disk cache, in /tmp, spares the later processes).
TINY = {
    "dqn": ["model.module.hidden_sizes=[64,64]"],
    "ppo": [
        "model.module.policy_hidden_sizes=[64,64]",
        "model.module.value_hidden_sizes=[64,64]",
        "model.module.update_epochs=2",
    ],  # fmt: skip
    "mamba2": [
        "model.module.d_model=64",
        "model.module.n_layers=1",
        "model.module.d_state=16",
        "model.module.headdim=32",
        "model.module.chunk_size=32",
        "model.window.seq_len=20",
        "model.window.horizon=5",
    ],  # fmt: skip
    "tft": [
        "model.module.hidden_size=24",
        "model.module.num_heads=2",
        "model.module.lstm_layers=1",
        "model.window.seq_len=20",
        "model.window.horizon=5",
    ],  # fmt: skip
}
DEADLINE_S = 600  # every process here finishes in well under a minute alone


def _start(args: list[str], root: Path, program: str = "foxhunt-train") -> subprocess.Popen:
    env = {**os.environ, "FOXHUNT_ROOT": str(root), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([str(BIN / program), *args], env=env, cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip


def _finish(process: subprocess.Popen, what: str, expect: int = 0) -> str:
    out, _ = process.communicate(timeout=DEADLINE_S)
    assert process.returncode == expect, f"{what}: exit {process.returncode}\n{out[-4000:]}"
    return out


def _train_here(monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture, root: Path, args: list[str], what: str) -> str:
    """``foxhunt-train *args`` from ``root`` in the test's process (tests/train_entry.py), as
    :func:`_start` then :func:`_finish` with exit 0: what it printed. The torch threads it sets
    (``strategy.torch_threads``) are put back as they were."""
    done = train_here(monkeypatch, capfd, root, args)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{what}: exit {done.returncode}\n{out[-4000:]}"
    return out


def _db(root: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{root / 'mlruns' / 'mlflow.db'}?mode=ro", uri=True)


def _store_has_runs(root: Path) -> bool:
    """The store exists and its tables are made (a process may be creating them now)."""
    if not (root / "mlruns" / "mlflow.db").is_file():
        return False
    try:
        with _db(root) as db:
            return db.execute("SELECT COUNT(*) FROM metrics").fetchone()[0] > 0
    except sqlite3.OperationalError:
        return False


def _runs(root: Path) -> dict[str, dict]:
    """Every run of the store: id -> status, name, tags."""
    with _db(root) as db:
        runs = {r: {"status": s, "name": n, "tags": {}} for r, s, n in db.execute("SELECT run_uuid, status, name FROM runs")}
        for run, key, value in db.execute("SELECT run_uuid, key, value FROM tags"):
            runs[run]["tags"][key] = value
    return runs


def _repeated_metric_steps(root: Path, run_id: str) -> list[tuple]:
    """(key, step, rows) of every metric step logged more than once in the run."""
    with _db(root) as db:
        return db.execute("SELECT key, step, COUNT(*) FROM metrics WHERE run_uuid = ? GROUP BY key, step "
                          "HAVING COUNT(*) > 1", (run_id,)).fetchall()  # fmt: skip


def _logged_checkpoints(root: Path, run_id: str) -> dict[str, dict]:
    """The run's logged checkpoints (artifacts ``checkpoints/*.ckpt``) -> their stamp."""
    import torch

    from foxhunt.runs.store import RunStore

    store = RunStore(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")
    folder = Path(store.get(run_id).artifact_uri.removeprefix("file://")) / "checkpoints"
    return {path.name: torch.load(path, weights_only=True)["foxhunt"] for path in sorted(folder.glob("*.ckpt"))}
