"""Every run records only its own: checkpoints, metrics and workers never cross between runs.

End to end, as a user runs foxhunt: real ``foxhunt-train`` processes with the default callbacks,
killed with SIGKILL at odd moments, against the SQLite store they share. Each test starts its
processes together and waits for them with a deadline (two cores: they share the machine).

- every model x precision trains through the entry point with every default callback on
  (the allocator-peak meter of the memory callback and torchao's compiled 8-bit update);
- runs started in the same second get folders of their own, log only their own checkpoints
  (each stamped with its run's id), and two ``foxhunt ensemble register`` at once register once;
- ``kill -9`` then ``resume=true``: the run continues, each (metric, step) holds one value, for
  the agents (whose optimizer steps outrun their logging steps), a forecaster and a walk-forward
  cell (its cell run reopened, nothing left RUNNING);
- a ``strategy=parallel`` sweep killed with SIGKILL leaves no worker behind.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from waiting import process_gone, wait_until

BIN = Path(sys.executable).parent
# Small and quick: a few batches of tiny networks on ten days of bars, scored on 300 bars.
QUICK = [
    "trainer=smoke", "data.source.days=10", "evaluation.plot_equity=false", "evaluation.max_bars=300",
    "evaluation.bootstrap.samples=50", "strategy.torch_threads=1",
]  # fmt: skip
# Tiny sizes that keep at least one tensor torchao gives 8-bit states (>= 4,096 elements, a
# multiple of its block): the compiled 8-bit update runs, as in a real int8 run.
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
        "model.module.hidden_size=64",
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


def test_every_model_and_precision_trains_through_foxhunt_train_with_the_default_callbacks(tmp_path):
    """One ``foxhunt-train -m precision=fp32,bf16,int8`` sweep per family (the four at once):
    every cell FINISHED with its memory figures and its checkpoints, each (metric, step) once."""
    sweeps = {}
    for model, sizes in TINY.items():
        root = tmp_path / model
        root.mkdir()
        sweeps[model] = (root, _start(["-m", f"model={model}", "precision=fp32,bf16,int8", *QUICK, *sizes,
                                       "trainer.limit_train_batches=3"], root))  # fmt: skip
    for model, (root, process) in sweeps.items():
        _finish(process, f"{model} sweep")
        cells = {run["name"]: (run_id, run) for run_id, run in _runs(root).items() if "config_hash" in run["tags"]}
        assert sorted(cells) == [f"{model}-es-{p}" for p in ("bf16", "fp32", "int8")]
        for name, (run_id, run) in cells.items():
            assert run["status"] == "FINISHED", f"{name}: {run['tags'].get('error')}"
            with _db(root) as db:
                logged = {k for (k,) in db.execute("SELECT DISTINCT key FROM metrics WHERE run_uuid = ?", (run_id,))}
            assert {"memory/peak_mb", "memory/optimizer_mb", "val/sharpe", "test/sharpe"} <= logged, name
            assert _repeated_metric_steps(root, run_id) == [], name
            stamps = _logged_checkpoints(root, run_id)
            assert {"best.ckpt", "last.ckpt"} <= set(stamps), name
            assert {stamp["run_id"] for stamp in stamps.values()} == {run_id}, name


# foxhunt-train with Hydra's ${now:} at one instant for every process: the same second for sure
# (four processes composing on two cores can straddle a second boundary).
RUN_AT = """
import sys
from datetime import datetime
import hydra.core.utils
from foxhunt.train import main

INSTANT = float(sys.argv[1])

class Frozen(datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime.fromtimestamp(INSTANT, tz)

hydra.core.utils.datetime = Frozen
sys.argv = ["foxhunt-train", *sys.argv[2:]]
main()
"""


def test_runs_started_in_the_same_second_keep_their_own_folders_and_checkpoints(tmp_path):
    """Four ``foxhunt-train seed=N`` at once, their run folders named in the same second: four
    folders, each run's logged checkpoints stamped with its own id and holding its own weights;
    then two ``foxhunt ensemble register`` at once: the champion is registered once."""
    import torch

    env = {**os.environ, "FOXHUNT_ROOT": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    instant = time.time()
    processes = [
        subprocess.Popen([sys.executable, "-c", RUN_AT, str(instant), f"seed={seed}", *QUICK, *TINY["dqn"]],
                         env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for seed in (1, 2, 3, 4)
    ]  # fmt: skip
    for seed, process in enumerate(processes, 1):
        _finish(process, f"seed {seed}")
    runs = {run_id: run for run_id, run in _runs(tmp_path).items() if run["status"] == "FINISHED"}
    assert sorted(run["tags"]["seed"] for run in runs.values()) == ["1", "2", "3", "4"]
    folders = {run["tags"]["output_dir"] for run in runs.values()}
    assert len(folders) == 4 and len({Path(f).name[:19] for f in folders}) == 1  # one second, four folders
    weights = {}
    for run_id in runs:
        stamps = _logged_checkpoints(tmp_path, run_id)
        assert {stamp["run_id"] for stamp in stamps.values()} == {run_id}
        folder = Path(runs[run_id]["tags"]["output_dir"]) / "checkpoints"
        assert {p.name for p in folder.glob("*.ckpt")} == set(stamps)  # nothing in its folder but its own
        weights[run_id] = torch.load(folder / "best.ckpt", weights_only=True)["state_dict"]
    first = next(iter(weights.values()))
    assert sum(all(torch.equal(first[k], w[k]) for k in first) for w in weights.values()) == 1  # four different models

    register = ["ensemble", "register", "ensemble.models=[dqn]", "ensemble.gate=none"]
    both = [_start(register, tmp_path, program="foxhunt") for _ in range(2)]
    for process in both:
        _finish(process, "foxhunt ensemble register")
    from foxhunt.runs.store import RunStore

    store = RunStore(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    assert store.get_version("foxhunt-dqn-es", 1) is not None and store.get_version("foxhunt-dqn-es", 2) is None
    champion = store.get_version_by_alias("foxhunt-dqn-es", "champion")
    assert champion.run_id in runs and champion.version == "1"


# (label, overrides): three families whose step units differ, and a walk-forward cell.
KILLED = {
    "dqn": ["model=dqn", *TINY["dqn"], "trainer.limit_train_batches=200"],
    "ppo": ["model=ppo", *TINY["ppo"], "trainer.limit_train_batches=60"],
    "mamba2": ["model=mamba2", *TINY["mamba2"], "trainer.limit_train_batches=100"],
    "walk_forward": [
        "model=dqn",
        *TINY["dqn"],
        "trainer.limit_train_batches=100",
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


def test_kill_9_then_resume_continues_the_run_with_each_metric_step_once(tmp_path):
    """Each of DQN, PPO, Mamba-2 and a walk-forward DQN cell: killed with SIGKILL after its
    checkpoint and a few logged steps beyond it, then ``resume=true``: the same run (the same
    cell run) ends FINISHED, every (metric, step) holds one value, and no run is left RUNNING."""
    common = [*QUICK, "trainer.max_epochs=3", "callbacks.progress.every_n_steps=1", "resume=true"]
    started = {}
    for label, overrides in KILLED.items():
        root = tmp_path / label
        root.mkdir()
        started[label] = (root, _start([*common, *overrides], root))
    for label, (root, process) in started.items():
        wait_until(lambda: process.poll() is not None or _killable(root, label == "walk_forward"),
                   f"{label}: a checkpoint and steps logged after it", timeout=DEADLINE_S)  # fmt: skip
        assert process.poll() is None, f"{label} ended before the kill:\n{process.communicate()[0][-3000:]}"
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    resumed = {label: (root, _start([*common, *KILLED[label]], root)) for label, (root, _) in started.items()}
    for label, (root, process) in resumed.items():
        _finish(process, f"{label} resumed")
        runs = _runs(root)
        assert [r["name"] for r in runs.values() if r["status"] != "FINISHED"] == [], label
        trained = [run_id for run_id, r in runs.items() if r["tags"].get("foxhunt.role") != "cell"]
        for run_id in trained:
            assert _repeated_metric_steps(root, run_id) == [], f"{label}: {runs[run_id]['name']}"
        if label == "walk_forward":
            (cell,) = [run_id for run_id, r in runs.items() if r["tags"].get("foxhunt.role") == "cell"]
            assert runs[cell]["tags"]["resume_count"] == "1"
            folds = sorted((r["tags"]["fold"], r["tags"]["mlflow.parentRunId"]) for r in runs.values() if "fold" in r["tags"])
            assert folds == [("0", cell), ("1", cell)]
            assert runs[next(r for r in trained if runs[r]["tags"]["fold"] == "1")]["tags"]["resume_count"] == "1"
        else:
            (run_id,) = trained
            assert runs[run_id]["tags"]["resume_count"] == "1"


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
