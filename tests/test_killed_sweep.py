"""A ``strategy=parallel`` sweep killed with SIGKILL leaves no worker behind (end to end, real
``foxhunt-train`` processes on a shared SQLite store, as tests/test_kill_resume.py, whose file
held it: apart, pytest-xdist runs the two beside each other)."""

from __future__ import annotations

import os
import signal

import psutil

from run_records_helpers import QUICK, TINY, _db, _runs, _start, _store_has_runs
from waiting import process_gone, wait_until


def test_a_killed_parallel_sweep_leaves_no_worker_running(tmp_path):
    """``kill -9`` of a ``strategy=parallel`` sweep while its two workers train: within 30 s no
    worker is left, and their cells end KILLED (a graceful stop: interrupted.ckpt) instead of
    staying RUNNING."""
    args = ["-m", "model=dqn", "seed=1,2", "strategy=parallel", "strategy.n_jobs=2", "strategy.predict_memory=false",
            *QUICK, *TINY["dqn"], "trainer.max_epochs=100", "trainer.limit_train_batches=200"]  # fmt: skip
    sweep = _start(args, tmp_path)

    def training_cells():
        if sweep.poll() is not None or not _store_has_runs(tmp_path):
            return sweep.poll() is not None
        with _db(tmp_path) as db:
            (n,) = db.execute("SELECT COUNT(DISTINCT m.run_uuid) FROM metrics m JOIN runs r ON r.run_uuid = m.run_uuid "
                              "WHERE r.status = 'RUNNING' AND m.key = 'progress'").fetchone()  # fmt: skip
        return n == 2

    wait_until(training_cells, "two cells training at once (two workers)", timeout=240)
    assert sweep.poll() is None, sweep.communicate()[0][-3000:]
    workers = [p for p in psutil.Process(sweep.pid).children(recursive=True)]
    assert len(workers) >= 2
    os.kill(sweep.pid, signal.SIGKILL)
    sweep.wait(timeout=60)
    wait_until(lambda: all(process_gone(p.pid) for p in workers), "every worker of the killed sweep gone", timeout=30)
    cells = {r["tags"]["seed"]: r["status"] for r in _runs(tmp_path).values() if "config_hash" in r["tags"]}
    assert cells == {"1": "KILLED", "2": "KILLED"}
    assert len(list(tmp_path.glob("outputs/sweeps/*/*/checkpoints/interrupted.ckpt"))) == 2
