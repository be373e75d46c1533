#!/usr/bin/env python
"""Wall time of ``foxhunt runs top`` on a synthetic MLflow store of 10,000 runs.

    python scripts/bench_runs_top.py                    # 10,000 runs, 7 timed repeats
    python scripts/bench_runs_top.py --runs 2000 --repeats 5 --keep /tmp/store --client

The store: MLflow creates the empty SQLite store once (``MlflowClient`` creating the
experiments: its own tables, indexes and migrations), then the runs are bulk-inserted with
sqlite3 into MLflow's tables (``runs``, ``tags``, ``metrics``, ``latest_metrics``), as
``foxhunt-train`` would have logged them: 4 models x 4 assets x 3 precisions, mostly FINISHED
(some FAILED, KILLED, RUNNING), sweep parent runs, walk-forward cells with 4 fold children each
(about 16% of the runs are folds), up to 60 metrics per run (each split's backtest metrics,
intervals, DSR inputs, 4 baselines), a tenth of the runs in a second experiment.

The measure: the whole command as a user runs it, ``<venv>/bin/foxhunt runs top --root <store>``
in a fresh subprocess (interpreter start, imports, the queries, the table), timed with
``time.perf_counter`` around ``subprocess.run``; one warm-up run (the file in the page cache),
then ``--repeats`` timed runs per variant (table, ``--json``, a filtered one), interleaved;
the median, min and max are printed, with ``foxhunt --help`` (start-up alone) and the load
average. ``--client`` also times the same leaderboard through ``MlflowClient.search_runs``
(:class:`foxhunt.runs.leaderboard.ClientSource`, in this process, once) for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 10_000
REPEATS = 7
SEED = 7
MODELS = ("dqn", "ppo", "mamba2", "tft")
ASSETS = ("es", "nq", "zn", "6e")
PRECISIONS = ("fp32", "bf16", "int8")
BASELINES = ("flat", "buy_and_hold", "random", "momentum")
STATUS_WEIGHTS = {"FINISHED": 0.85, "FAILED": 0.08, "KILLED": 0.05, "RUNNING": 0.02}
FOLDS = 4  # children of a walk-forward cell
WALK_FORWARD_SHARE = 0.05  # of the cells: each brings FOLDS children
CELLS_PER_SWEEP = 48
EXPERIMENT, OTHER_EXPERIMENT = "foxhunt", "bench-system"
OTHER_SHARE = 0.1  # of the runs, in the other experiment
SPLIT_METRICS = ("pnl", "mean_pnl", "sharpe", "sortino", "calmar", "max_drawdown", "exposure", "hit_rate", "turnover",
                 "trades", "steps", "sharpe_ci_low", "sharpe_ci_high", "mean_pnl_ci_low", "mean_pnl_ci_high",
                 "pnl_skew", "pnl_kurtosis", "sharpe_per_step")  # fmt: skip
RUN_METRICS = ("train/loss", "val/loss", "progress", "memory/device_peak_mb")
SHARPE_SD = 1.5  # spread of the synthetic Sharpe ratios
STEPS = 2000  # bars behind each synthetic split score
START_MS = 1_760_000_000_000
RUN_SPACING_MS = 60_000
RUN_LENGTH_MS = 600_000


def _hex(rng: random.Random) -> str:
    return f"{rng.getrandbits(128):032x}"


def split_metrics(rng: random.Random, split: str) -> dict[str, float]:
    sharpe = rng.gauss(0.0, SHARPE_SD)
    width = abs(rng.gauss(1.0, 0.3))
    per_step = sharpe / 600.0
    values = {
        "sharpe": sharpe, "sharpe_ci_low": sharpe - width, "sharpe_ci_high": sharpe + width,
        "sharpe_per_step": per_step, "steps": float(STEPS), "pnl_skew": rng.gauss(0.0, 0.3),
        "pnl_kurtosis": 3.0 + abs(rng.gauss(0.0, 1.0)), "max_drawdown": abs(rng.gauss(2000.0, 500.0)),
        "hit_rate": rng.uniform(0.4, 0.6),
    }  # fmt: skip
    for name in SPLIT_METRICS:
        values.setdefault(name, rng.gauss(0.0, 100.0))
    for baseline in BASELINES:
        values[f"baseline/{baseline}/sharpe"] = rng.gauss(0.0, SHARPE_SD)
        values[f"baseline/{baseline}/pnl"] = rng.gauss(0.0, 1000.0)
    return {f"{split}/{k}": v for k, v in values.items()}


def build_store(root: Path, n_runs: int, seed: int) -> dict[str, int]:
    """The synthetic store under ``root/mlruns/mlflow.db`` (module doc); counts of what it holds."""
    from mlflow.tracking import MlflowClient

    (root / "mlruns").mkdir(parents=True)
    database = root / "mlruns" / "mlflow.db"
    client = MlflowClient(f"sqlite:///{database}")
    artifacts = (root / "mlruns" / "artifacts").as_uri()
    experiments = {name: int(client.create_experiment(name, artifact_location=artifacts))
                   for name in (EXPERIMENT, OTHER_EXPERIMENT)}  # fmt: skip
    rng = random.Random(seed)
    runs, tags, metrics = [], [], []
    counts = {"runs": 0, "folds": 0, "sweeps": 0, "finished": 0}
    statuses, weights = list(STATUS_WEIGHTS), list(STATUS_WEIGHTS.values())
    clock = START_MS
    parent = None

    def add_run(name, experiment, status, run_tags, run_metrics):
        nonlocal clock
        run_id = _hex(rng)
        clock += RUN_SPACING_MS
        end = None if status == "RUNNING" else clock + RUN_LENGTH_MS
        runs.append((run_id, name, "LOCAL", "foxhunt-train", "", "bench", status, clock, end, "", "active",
                     f"{artifacts}/{run_id}/artifacts", experiments[experiment]))  # fmt: skip
        tags.extend((key, str(value), run_id) for key, value in {**run_tags, "mlflow.runName": name}.items())
        for key, value in run_metrics.items():
            metrics.append((key, value, clock, 0, 0, run_id))
        counts["runs"] += 1
        counts["finished"] += status == "FINISHED"
        return run_id

    cells = 0
    while counts["runs"] < n_runs:
        experiment = OTHER_EXPERIMENT if rng.random() < OTHER_SHARE else EXPERIMENT
        if cells % CELLS_PER_SWEEP == 0:
            parent = add_run(
                f"sweep-{cells // CELLS_PER_SWEEP}",
                experiment,
                "FINISHED",
                {"foxhunt.run_kind": "sweep", "sweep_id": f"s{cells}", "job_id": f"{cells:08x}"},
                {},
            )
            counts["sweeps"] += 1
        cells += 1
        model, asset, precision = rng.choice(MODELS), rng.choice(ASSETS), rng.choice(PRECISIONS)
        name = f"{model}-{asset}-{precision}"
        cell_tags = {"model": model, "asset": asset, "precision": precision, "seed": str(rng.choice((1, 2, 42))),
                     "config_hash": _hex(rng)[:16], "mlflow.parentRunId": parent, "sweep_id": f"s{cells}",
                     "strategy": "sequential", "data_source": "synthetic"}  # fmt: skip
        status = rng.choices(statuses, weights)[0]
        scores = {**split_metrics(rng, "val"), **split_metrics(rng, "test"),
                  **{key: abs(rng.gauss(1.0, 0.5)) for key in RUN_METRICS}}  # fmt: skip
        walk_forward = rng.random() < WALK_FORWARD_SHARE and counts["runs"] + FOLDS < n_runs
        if walk_forward:
            cell = add_run(name, experiment, status, {**cell_tags, "foxhunt.role": "cell"}, scores)
            for fold in range(FOLDS):
                fold_scores = {**split_metrics(rng, "val"), **split_metrics(rng, "test")}
                add_run(
                    f"{name} fold{fold}",
                    experiment,
                    status,
                    {**cell_tags, "mlflow.parentRunId": cell, "foxhunt.role": "fold", "fold": fold},
                    fold_scores,
                )
                counts["folds"] += 1
        else:
            add_run(name, experiment, status, cell_tags, scores)
    with sqlite3.connect(database) as db:
        db.executemany("INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name, user_id, status, "
                       "start_time, end_time, source_version, lifecycle_stage, artifact_uri, experiment_id) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", runs)  # fmt: skip
        db.executemany("INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)", tags)
        db.executemany("INSERT INTO metrics (key, value, timestamp, step, is_nan, run_uuid) VALUES (?, ?, ?, ?, ?, ?)", metrics)
        db.executemany("INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) "
                       "VALUES (?, ?, ?, ?, ?, ?)", metrics)  # fmt: skip
    counts["metrics"] = len(metrics)
    counts["tags"] = len(tags)
    counts["mb"] = round(database.stat().st_size / 2**20, 1)
    return counts


def time_command(command: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}")
    return wall, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--keep", type=Path, default=None, help="Build the store in this (new) folder and keep it.")
    parser.add_argument("--client", action="store_true", help="Also time the leaderboard through MlflowClient once.")
    args = parser.parse_args()

    root = args.keep or Path(tempfile.mkdtemp(prefix="bench_runs_top_"))
    started = time.perf_counter()
    counts = build_store(root, args.runs, args.seed)
    print(f"store {root / 'mlruns' / 'mlflow.db'}: {counts['runs']} runs ({counts['finished']} FINISHED, "
          f"{counts['folds']} fold children, {counts['sweeps']} sweep parents), {counts['metrics']} metrics, "
          f"{counts['tags']} tags, {counts['mb']} MB; built in {time.perf_counter() - started:.1f} s")  # fmt: skip

    foxhunt = str(Path(sys.executable).parent / "foxhunt")
    variants = {
        "table": [foxhunt, "runs", "top", "--root", str(root)],
        "--json": [foxhunt, "runs", "top", "--json", "--root", str(root)],
        "filtered --by": [
            foxhunt,
            "runs",
            "top",
            "asset=es,nq",
            "precision=int8",
            "--by",
            "model,asset,precision",
            "--root",
            str(root),
        ],  # fmt: skip
        "foxhunt --help": [foxhunt, "--help"],
    }
    load_before = os.getloadavg()
    for command in variants.values():  # warm-up: the store in the page cache, the .pyc files written
        _, done = time_command(command)
    rows = json.loads(time_command(variants["--json"])[1].stdout)
    walls: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, command in variants.items():
            walls[name].append(time_command(command)[0])
    load_after = os.getloadavg()
    print(f"foxhunt runs top: {len(rows)} rows; {args.repeats} timed runs per variant after a warm-up, interleaved, "
          f"each a fresh `foxhunt` subprocess timed with perf_counter around subprocess.run")  # fmt: skip
    for name, values in walls.items():
        print(f"  {name:16s} median {statistics.median(values):.3f} s  (min {min(values):.3f}, max {max(values):.3f})")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; {os.cpu_count()} CPUs")

    if args.client:
        from foxhunt.runs import leaderboard as lb
        from foxhunt.runs.environment import store_uri
        from foxhunt.runs.store import RunStore

        started = time.perf_counter()
        board = lb.top(lb.ClientSource(RunStore(store_uri(root))), lb.Query(experiment=lb.default_experiment()))
        wall = time.perf_counter() - started
        same = [r.to_dict() for r in board.rows] == rows
        print(f"  through MlflowClient.search_runs (in-process, mlflow imported before): {wall:.2f} s; same rows: {same}")


if __name__ == "__main__":
    main()
