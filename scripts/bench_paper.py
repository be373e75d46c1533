"""Paper trading's own cost: bars per second as fast as possible, and the loop's added time per bar
over the ensemble's own (goal: <= 0.2 ms), measured through the real command.

Usage: ``python scripts/bench_paper.py [--root DIR] [--repeats 3] [--models dqn,mamba2]``.

Without a store under ``--root`` it trains the ``--models`` at their default sizes with
``trainer=smoke`` on ``--days`` synthetic ES days and registers them (``ensemble.gate=none``);
then it runs ``foxhunt ensemble paper paper.speed=0 paper.view=never`` ``--repeats`` times, each
with a fresh ledger, as a subprocess, and reads each session's figures from its MLflow run
(``latency/ensemble_p50_us``, ``latency/loop_added_*``, ``paper/bars_per_s``: the session times
``time.perf_counter_ns`` around the ensemble's step and around the whole bar, the difference being
the loop's own work: orders, fills, limits, the ledger's per-bar transaction). It prints every
repeat, the medians, the machine and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_ADDED_US = 200.0  # the goal for the loop's added time per bar
TRAIN = ["trainer=smoke", "evaluation.plot_equity=false", "asset=es"]
METRICS = ("paper/bars", "paper/bars_per_s", "latency/ensemble_p50_us", "latency/ensemble_p99_us",
           "latency/loop_added_p50_us", "latency/loop_added_p99_us", "latency/loop_added_mean_us")  # fmt: skip


def _bin(name: str) -> str:
    found = Path(sys.executable).parent / name
    return str(found) if found.is_file() else name


def _run(args: list[str], root: Path) -> str:
    env = {**os.environ, "FOXHUNT_ROOT": str(root)}
    done = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_paper: {' '.join(args[:3])} ... exited {done.returncode}: {done.stderr.strip()[-600:]}")
    return done.stdout


def _store(root: Path, models: list[str], days: int) -> None:
    if (root / "mlruns" / "mlflow.db").is_file():
        print(f"store: {root / 'mlruns'} (existing)")
        return
    for model in models:
        started = time.perf_counter()
        _run([_bin("foxhunt-train"), f"model={model}", *TRAIN, f"data.source.days={days}"], root)
        print(f"trained {model} (default size, trainer=smoke, {days} synthetic days): {time.perf_counter() - started:.0f} s")
    _run([_bin("foxhunt"), "ensemble", "register", "asset=es", f"ensemble.models=[{','.join(models)}]", "ensemble.gate=none",
          f"data.source.days={days}"], root)  # fmt: skip


def _session(root: Path, models: list[str], days: int, k: int) -> dict[str, float]:
    from foxhunt.runs.environment import store_uri
    from foxhunt.runs.store import RunStore

    ledger = root / "bench_paper" / f"ledger-{k}.sqlite"
    ledger.unlink(missing_ok=True)
    _run([_bin("foxhunt"), "ensemble", "paper", "asset=es", f"ensemble.models=[{','.join(models)}]", "paper.speed=0",
          "paper.view=never", f"paper.ledger={ledger}", f"data.source.days={days}"], root)  # fmt: skip
    run = RunStore(store_uri(root)).search_finished_runs("paper")[0]  # newest first
    return {key: float(run.metrics[key].value) for key in METRICS if key in run.metrics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=None, help="store folder (default: a new temporary one)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="dqn,mamba2")
    parser.add_argument("--days", type=int, default=10, help="synthetic ES days (the test split is what is traded)")
    args = parser.parse_args()
    root = (args.root or Path(tempfile.mkdtemp(prefix="foxhunt-bench-paper-"))).resolve()
    root.mkdir(parents=True, exist_ok=True)
    models = [m for m in args.models.split(",") if m]
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, Python {platform.python_version()}"
    )
    before = os.getloadavg()
    _store(root, models, args.days)
    sessions = []
    for k in range(args.repeats):
        figures = _session(root, models, args.days, k)
        sessions.append(figures)
        print(f"session {k + 1}: {figures.get('paper/bars', 0):,.0f} bars, {figures.get('paper/bars_per_s', 0):,.0f} bars/s; ensemble p50 "
              f"{figures.get('latency/ensemble_p50_us', 0):.1f} us; loop added p50 {figures.get('latency/loop_added_p50_us', 0):.1f} us, "
              f"p99 {figures.get('latency/loop_added_p99_us', 0):.1f} us")  # fmt: skip
    after = os.getloadavg()
    median = {key: statistics.median(s[key] for s in sessions if key in s) for key in METRICS if all(key in s for s in sessions)}
    added = median.get("latency/loop_added_p50_us", float("nan"))
    print(f"median of {len(sessions)} sessions: {median.get('paper/bars_per_s', 0):,.0f} bars/s (whole loop, ledger included); "
          f"ensemble p50 {median.get('latency/ensemble_p50_us', 0):.1f} us; loop added p50 {added:.1f} us, p99 "
          f"{median.get('latency/loop_added_p99_us', 0):.1f} us, mean {median.get('latency/loop_added_mean_us', 0):.1f} us "
          f"(goal p50 <= {GOAL_ADDED_US:.0f} us: {'met' if added <= GOAL_ADDED_US else 'missed'})")  # fmt: skip
    print(f"load average (1, 5, 15 min): before {[round(v, 2) for v in before]}, after {[round(v, 2) for v in after]}")


if __name__ == "__main__":
    main()
