"""Several processes writing one fresh SQLite store at the same moment lose nothing and fail nothing.

Without the store lock each process creates MLflow's tables at once and three of four crash
(``table secrets already exists``, an alembic revision error); without the busy timeout a
writer can fail on "database is locked". The processes are real and start together (each
waits for the same instant after its imports), against a store that does not exist yet.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

WRITERS = 4
STEPS = 20
PARAMS = 30
WRITER = """
import sys, time
import mlflow  # imported before the start: the processes race on the store, not on imports
from foxhunt.runs.store import RunStore

uri, start_at, name, steps, params = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
while time.time() < start_at:
    time.sleep(0.002)
store = RunStore(uri)
run_id = store.create(store.ensure_experiment("race"), name, {"writer": name})
store.log_params(run_id, [(f"p{i}", i) for i in range(params)])
for step in range(steps):
    store.log_metrics(run_id, {"a": float(step), "b": 2.0 * step}, step=step)
store.tag(run_id, {"done": "yes"})
store.end(run_id, "FINISHED")
print(run_id)
"""


def test_four_processes_on_a_fresh_store_lose_no_run_param_or_metric(tmp_path):
    from foxhunt.runs.store import RunStore

    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"  # neither the file nor its folder exists
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MLFLOW_LOGGING_LEVEL": "WARNING"}
    start_at = str(time.time() + 12.0)  # after every interpreter has imported mlflow (2 busy cores)
    processes = [
        subprocess.Popen([sys.executable, "-c", WRITER, uri, start_at, f"w{i}", str(STEPS), str(PARAMS)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for i in range(WRITERS)
    ]  # fmt: skip
    results = [(p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in processes]
    for code, _, err in results:
        assert code == 0, err
        assert "database is locked" not in err and "already exists" not in err

    store = RunStore(uri)
    runs = store.search("race")
    assert sorted(r.name for r in runs) == [f"w{i}" for i in range(WRITERS)]
    for run in runs:
        assert run.status == "FINISHED" and run.tags["done"] == "yes"
        assert run.params == {f"p{i}": str(i) for i in range(PARAMS)}
        for key, factor in (("a", 1.0), ("b", 2.0)):
            history = store.client.get_metric_history(run.run_id, key)
            assert sorted((m.step, m.value) for m in history) == [(s, factor * s) for s in range(STEPS)]


@pytest.mark.slow
def test_four_foxhunt_train_processes_at_once_leave_every_run_and_metric(tmp_path):
    """Four real training runs started together in a fresh folder: four FINISHED runs, each with
    the same metrics and the same number of progress steps (the same config trains the same way)."""
    from foxhunt.runs.environment import store_uri
    from foxhunt.runs.store import RunStore

    env = {**os.environ, "FOXHUNT_ROOT": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    args = ["trainer=smoke", "data.source.days=7", "evaluation.plot_equity=false", "callbacks.progress.every_n_steps=1"]
    processes = [
        subprocess.Popen([sys.executable, "-m", "foxhunt.train", *args, f"seed={seed}"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
        for seed in range(WRITERS)
    ]  # fmt: skip
    results = [(p.wait(timeout=900), p.stderr.read()) for p in processes]
    for code, err in results:
        assert code == 0, err[-3000:]
    store = RunStore(store_uri(tmp_path))
    runs = store.search("foxhunt")
    assert len(runs) == WRITERS and {r.status for r in runs} == {"FINISHED"}
    keys = {frozenset(r.metrics) for r in runs}
    assert len(keys) == 1 and {"test/sharpe", "val/sharpe", "progress"} <= next(iter(keys))
    steps = {len(store.client.get_metric_history(r.run_id, "progress")) for r in runs}
    assert len(steps) == 1 and steps.pop() > 1
    for run in runs:
        assert {"best.ckpt", "last.ckpt"} <= set(store.logged_files(run.run_id, "checkpoints"))
        assert (Path(run.artifact_uri.removeprefix("file://")) / "config.yaml").is_file()
