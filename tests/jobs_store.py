"""A hand-populated MLflow store of jobs in every state, built once per test session.

Runs are created with ``MlflowClient`` exactly as the sweep and the job launcher create them:
a parent run (tag ``foxhunt.run_kind=sweep``, the launcher's job tags) and nested cell runs
(``mlflow.parentRunId``, ``job_id``, ``pid``, ``host``, ``model``/``asset``/``precision``/``seed``)
with ``progress``, ``train/loss``, ``memory/peak_mb`` and ``val/sharpe`` metrics.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

HOST = socket.gethostname()
NOW_MS = int(time.time() * 1000)
HOUR_MS = 3600 * 1000


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@dataclass
class Store:
    root: Path
    uri: str
    runs: dict[str, str]  # label -> run id


def plan(*cells: tuple[str, str, float]) -> str:
    return json.dumps([
        {"model": m, "asset": a, "precision": "fp32", "seed": "42", "steps": 100, "weight": w, "overrides": []}
        for m, a, w in cells
    ])  # fmt: skip


def build_store(root: Path) -> Store:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    (root / "mlruns").mkdir(parents=True)
    uri = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("foxhunt", artifact_location=(root / "mlruns" / "artifacts").as_uri())
    stale_pid, alive_pid = dead_pid(), os.getpid()
    runs: dict[str, str] = {}

    def parent(label, job_id, started_h, pid, extra=None):
        tags = {"foxhunt.run_kind": "sweep", "sweep_id": f"sweep-{label}"}
        if job_id:
            tags.update({
                "job_id": job_id, "pid": str(pid), "host": HOST, "command": f"foxhunt-train -m {label}",
                "job.overrides": json.dumps([f"label={label}"]),
            })  # fmt: skip
        tags.update(extra or {})
        start = NOW_MS - int(started_h * HOUR_MS)
        run = client.create_run(experiment, run_name=f"sweep-{label}", tags=tags, start_time=start)
        runs[label] = run.info.run_id
        return run.info.run_id

    def cell(label, parent_id, job_id, model, asset, started_h, status, pid, metrics, extra=None, host=HOST):
        tags = {"model": model, "asset": asset, "precision": "fp32", "seed": "42", "job_id": job_id,
                "pid": str(pid), "host": host}  # fmt: skip
        if parent_id:
            tags["mlflow.parentRunId"] = parent_id
        tags.update(extra or {})
        start = NOW_MS - int(started_h * HOUR_MS)
        run = client.create_run(experiment, run_name=f"{model}-{asset}-fp32", tags=tags, start_time=start)
        batch = [Metric(k, float(v), start + 1000 * (i + 1), step) for i, (k, (v, step)) in enumerate(metrics.items())]
        client.log_batch(run.info.run_id, metrics=batch)
        if status != "RUNNING":
            client.set_terminated(run.info.run_id, status, end_time=start + int(0.25 * HOUR_MS))
        runs[label] = run.info.run_id
        return run.info.run_id

    def end(run_id, status, started_h, hours):
        client.set_terminated(run_id, status, end_time=NOW_MS - int(started_h * HOUR_MS) + int(hours * HOUR_MS))

    done = {"progress": (1.0, 100), "train/loss": (0.5, 100), "memory/peak_mb": (120.0, 100)}
    # A finished two-model, two-asset job, 3 days ago, 2 h long.
    p = parent(
        "finished",
        "aaaa1111",
        72,
        stale_pid,
        {"job.plan": plan(("dqn", "es", 1.0), ("dqn", "nq", 1.0), ("tft", "es", 3.0), ("tft", "nq", 3.0))},
    )
    for i, (m, a) in enumerate([("dqn", "es"), ("dqn", "nq"), ("tft", "es"), ("tft", "nq")]):
        cell(
            f"finished/{m}-{a}",
            p,
            "aaaa1111",
            m,
            a,
            72 - i * 0.1,
            "FINISHED",
            stale_pid,
            {**done, "val/sharpe": (0.5 + i * 0.3, 100)},
        )
    end(p, "FINISHED", 72, 2)
    # A failed job, 1 day ago, 30 min: one cell FINISHED, one FAILED with its error.
    p = parent("failed", "aaaa2222", 24, stale_pid, {"error": "1 cell failed"})
    cell("failed/ppo-es", p, "aaaa2222", "ppo", "es", 24, "FINISHED", stale_pid, {**done, "val/sharpe": (0.2, 100)})
    cell(
        "failed/ppo-nq",
        p,
        "aaaa2222",
        "ppo",
        "nq",
        24,
        "FAILED",
        stale_pid,
        {"progress": (0.3, 30)},
        {"error": "ValueError: loss is NaN at step 30"},
    )
    end(p, "FAILED", 24, 0.5)
    # A job stopped 2 h ago after 10 min.
    p = parent("killed", "bbbb3333", 2, stale_pid)
    cell(
        "killed/mamba2-6e",
        p,
        "bbbb3333",
        "mamba2",
        "6e",
        2,
        "KILLED",
        stale_pid,
        {"progress": (0.4, 40), "train/loss": (0.9, 40)},
        {"stop_reason": "SIGTERM"},
    )
    end(p, "KILLED", 2, 1 / 6)
    # A running job (its process: this test process): one cell running, one planned.
    p = parent("running", "cccc4444", 0, alive_pid, {"job.plan": plan(("tft", "zn", 4.0), ("dqn", "zn", 1.0))})
    cell(
        "running/tft-zn",
        p,
        "cccc4444",
        "tft",
        "zn",
        0,
        "RUNNING",
        alive_pid,
        {"progress": (0.5, 40), "train/loss": (0.7, 40), "memory/peak_mb": (300.0, 40)},
    )
    # A stale job: RUNNING in the store, its processes gone (kill -9).
    p = parent("stale", "dddd5555", 1, stale_pid)
    cell("stale/dqn-es", p, "dddd5555", "dqn", "es", 1, "RUNNING", stale_pid, {"progress": (0.2, 20)})
    # A sweep whose parent the launcher has not tagged yet: found through its cells' job id.
    p = parent("untagged", None, 0.0001, alive_pid)
    cell("untagged/dqn-es", p, "eeee6666", "dqn", "es", 0.0001, "RUNNING", alive_pid, {"progress": (0.1, 10)})
    # A sweep started by hand (no job id): its parent run id is its id. Its cell ran elsewhere.
    p = parent("byhand", None, 48, stale_pid)
    cell("byhand/tft-es", p, "", "tft", "es", 48, "RUNNING", stale_pid, {"progress": (0.6, 60)}, host="other-host")
    # A single run outside any job: not listed.
    run = client.create_run(experiment, run_name="dqn-es-fp32", tags={"model": "dqn", "job_id": ""})
    client.set_terminated(run.info.run_id, "FINISHED")
    runs["single"] = run.info.run_id
    return Store(root, uri, runs)
