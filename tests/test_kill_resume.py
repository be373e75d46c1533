"""kill -9 at odd moments, then resume: each run continues its own record (end to end, real
``foxhunt-train`` processes on a shared SQLite store, as tests/test_run_records.py).

- ``kill -9`` then ``resume=true``: the run continues, each (metric, step) holds one value, for
  the agents (whose optimizer steps outrun their logging steps) and a walk-forward
  cell (its cell run reopened, nothing left RUNNING). The killed runs are real processes (the kill
  is the point); their resumes run in the test's process (tests/train_entry.py), one after another;
- slow: killed anywhere after a checkpoint, the resumed fit ends with the weights and metrics of
  the fit never killed;
- a ``strategy=parallel`` sweep killed with SIGKILL: tests/test_killed_sweep.py (a file of its
  own, so that pytest-xdist runs it beside this one).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from run_records_helpers import (
    DEADLINE_S,
    QUICK,
    TINY,
    _db,
    _finish,
    _repeated_metric_steps,
    _runs,
    _start,
    _store_has_runs,
    _train_here,
)
from waiting import wait_until

# (label, overrides): two agents whose step units differ, and a walk-forward cell (a forecaster's kill
# and resume: the slow cases below, and tests/training/test_resume_point.py in-process). Epochs of
# 40 batches: the kill falls after the first epoch's checkpoint, in the second or third epoch, as
# it did with the 60-200 batches of before (more batches only made each fit, and its resume, longer).
KILLED = {
    "dqn": ["model=dqn", *TINY["dqn"], "trainer.limit_train_batches=40"],
    "ppo": ["model=ppo", *TINY["ppo"], "trainer.limit_train_batches=40"],
    "walk_forward": [
        "model=dqn",
        *TINY["dqn"],
        "trainer.limit_train_batches=40",
        "evaluation.protocol=walk_forward",
        "evaluation.walk_forward.folds=2",
        "data.source.days=20",
    ],  # fmt: skip
}


def _checkpoint_step(path: Path) -> int | None:
    """The training batches done when the checkpoint was written (Lightning's loop state)."""
    import torch

    try:
        return int(torch.load(path, weights_only=True)["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"])
    except Exception:  # being written: the next poll reads it
        return None


def _killable(root: Path, walk_forward: bool) -> bool:
    """True once a run has a last.ckpt and has logged progress past it (for a walk-forward cell:
    in its second fold, the first FINISHED): a kill now loses logged steps."""
    if not _store_has_runs(root):
        return False
    pattern = "outputs/runs/*/seed*_fold1/checkpoints/last.ckpt" if walk_forward else "outputs/runs/*/checkpoints/last.ckpt"
    found = sorted(root.glob(pattern))
    step = _checkpoint_step(found[0]) if found else None
    if step is None:
        return False
    with _db(root) as db:
        (logged,) = db.execute("SELECT MAX(m.step) FROM metrics m JOIN runs r ON r.run_uuid = m.run_uuid "
                               "WHERE m.key = 'progress' AND r.status = 'RUNNING'").fetchone()  # fmt: skip
    return logged is not None and logged >= step + 3


def test_kill_9_then_resume_continues_the_run_with_each_metric_step_once(tmp_path, monkeypatch, capfd):
    """Each of DQN, PPO and a walk-forward DQN cell: a ``foxhunt-train`` process killed
    with SIGKILL after its checkpoint and a few logged steps beyond it, then ``resume=true`` (in the
    test's process): the same run (the same cell run) ends FINISHED, every (metric, step) holds one
    value, and no run is left RUNNING."""
    common = [*QUICK, "trainer.max_epochs=3", "callbacks.progress.every_n_steps=1", "resume=true"]
    started = {}
    for label, overrides in KILLED.items():
        root = tmp_path / label
        root.mkdir()
        started[label] = (root, _start([*common, *overrides], root))
    alive = dict(started)

    def kill_each_when_due() -> bool:
        """Each process is watched at once (one after another, a short fit could end unwatched)."""
        for label, (root, process) in list(alive.items()):
            assert process.poll() is None, f"{label} ended before the kill:\n{process.communicate()[0][-3000:]}"
            if _killable(root, label == "walk_forward"):
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=60)
                del alive[label]
        return not alive

    wait_until(kill_each_when_due, "each run: a checkpoint and steps logged after it", timeout=DEADLINE_S)
    for label, (root, _) in started.items():
        _train_here(monkeypatch, capfd, root, [*common, *KILLED[label]], f"{label} resumed")
        runs = _runs(root)
        assert [r["name"] for r in runs.values() if r["status"] != "FINISHED"] == [], label
        trained = [run_id for run_id, r in runs.items() if r["tags"].get("foxhunt.role") != "cell"]
        for run_id in trained:
            assert _repeated_metric_steps(root, run_id) == [], f"{label}: {runs[run_id]['name']}"
            # the memory rows measured before the checkpoint: written with it, not lost with the kill (they waited
            # for the callback's overhead budget, and the resumed fit measures only the steps after the checkpoint)
            with _db(root) as db:
                steps = [
                    s for (s,) in db.execute("SELECT step FROM metrics WHERE run_uuid = ? AND key = 'memory/peak_mb'", (run_id,))
                ]
            assert any(0 < step < max(steps) / 3 for step in steps), f"{label}: memory/peak_mb at steps {sorted(steps)}"
        if label == "walk_forward":
            (cell,) = [run_id for run_id, r in runs.items() if r["tags"].get("foxhunt.role") == "cell"]
            assert runs[cell]["tags"]["resume_count"] == "1"
            folds = sorted((r["tags"]["fold"], r["tags"]["mlflow.parentRunId"]) for r in runs.values() if "fold" in r["tags"])
            assert folds == [("0", cell), ("1", cell)]
            assert runs[next(r for r in trained if runs[r]["tags"]["fold"] == "1")]["tags"]["resume_count"] == "1"
        else:
            (run_id,) = trained
            assert runs[run_id]["tags"]["resume_count"] == "1"


# Every family in fp32 and int8, the TFT in bf16 too, and a walk-forward cell killed inside a fold
# and between its folds: (label, overrides, what the kill waits for).
EXACT = {
    **{f"{m}-{p}": ([f"model={m}", f"precision={p}", *TINY[m]], "mid_fit") for m in ("dqn", "ppo", "mamba2", "tft")
       for p in ("fp32", "int8")},
    "tft-bf16": (["model=tft", "precision=bf16", *TINY["tft"]], "mid_fit"),
    "walk_forward-in-a-fold": (["model=dqn", *TINY["dqn"], *KILLED["walk_forward"][2:]], "fold1"),
    "walk_forward-between-folds": (["model=dqn", *TINY["dqn"], *KILLED["walk_forward"][2:]], "fold0_done"),
}  # fmt: skip
EXACT_COMMON = [
    *QUICK,
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=30",
    "callbacks.resume_point.every_n_train_steps=20",
    "resume=true",
]
UNEQUAL_METRICS = ("memory/", "_per_s", "progress")  # time and memory: never equal between two fits


def _last_checkpoints(root: Path) -> list[Path]:
    return sorted(root.glob("outputs/runs/**/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)


def _kill_due(root: Path, when: str, rng) -> bool:
    """A checkpoint exists and the fit is past it (``mid_fit``: by a random few more steps),
    inside a walk-forward's second fold (``fold1``), or between its folds (``fold0_done``: the
    first fold's run FINISHED, the second not started training)."""
    if not _store_has_runs(root):
        return False
    if when == "fold0_done":
        return any(r["status"] == "FINISHED" and r["tags"].get("fold") == "0" for r in _runs(root).values())
    found = [p for p in _last_checkpoints(root) if when != "fold1" or "fold1" in str(p)]
    step = _checkpoint_step(found[-1]) if found else None
    if step is None:
        return False
    with _db(root) as db:
        (logged,) = db.execute("SELECT MAX(m.step) FROM metrics m JOIN runs r ON r.run_uuid = m.run_uuid "
                               "WHERE m.key = 'progress' AND r.status = 'RUNNING'").fetchone()  # fmt: skip
    return logged is not None and logged >= step + rng.integers(1, 6)


def _final_state(root: Path) -> dict[str, dict]:
    """Each trained run's final weights (its newest last.ckpt): the cell's, or each fold's."""
    import torch

    newest = {}
    for path in _last_checkpoints(root):  # a fold's folder is named after it; a cell's after its time
        folder = path.parent.parent.name
        newest[folder if folder.startswith("seed") else "cell"] = path
    return {name: torch.load(path, weights_only=True)["state_dict"] for name, path in newest.items()}


def _deterministic_metrics(root: Path) -> dict[tuple, float]:
    with _db(root) as db:
        rows = db.execute(
            "SELECT r.name, m.key, m.step, m.value FROM metrics m JOIN runs r ON r.run_uuid = m.run_uuid"
        ).fetchall()
    return {(name, key, step): value for name, key, step, value in rows if not any(part in key for part in UNEQUAL_METRICS)}


@pytest.mark.slow
def test_kill_9_anywhere_then_resume_ends_with_the_weights_of_the_fit_never_killed(tmp_path):
    """Each family in fp32 and int8 (the TFT in bf16 too) killed with SIGKILL at a random step
    after a checkpoint, and a walk-forward cell killed inside a fold and between its folds, then
    ``resume=true``: the final weights are torch.equal to the fit never killed, and every (metric,
    step) that does not measure time or memory is equal."""
    import numpy as np
    import torch

    rng = np.random.default_rng(36)
    for label, (overrides, when) in EXACT.items():
        whole, killed = tmp_path / label / "whole", tmp_path / label / "killed"
        whole.mkdir(parents=True), killed.mkdir(parents=True)
        reference, process = _start([*EXACT_COMMON, *overrides], whole), _start([*EXACT_COMMON, *overrides], killed)
        wait_until(lambda: process.poll() is not None or _kill_due(killed, when, rng), f"{label}: the moment to kill",
                   timeout=DEADLINE_S)  # fmt: skip
        assert process.poll() is None, f"{label} ended before the kill:\n{process.communicate()[0][-3000:]}"
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
        _finish(_start([*EXACT_COMMON, *overrides], killed), f"{label} resumed")
        _finish(reference, f"{label} never killed")
        expected, got = _final_state(whole), _final_state(killed)
        assert expected.keys() == got.keys(), label
        for run, weights in expected.items():
            assert [k for k in weights if not torch.equal(weights[k], got[run][k])] == [], f"{label}: {run}"
        expected_metrics, got_metrics = _deterministic_metrics(whole), _deterministic_metrics(killed)
        assert {k: (v, got_metrics.get(k)) for k, v in expected_metrics.items() if got_metrics.get(k) != v} == {}, label
