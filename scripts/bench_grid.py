#!/usr/bin/env python
"""Wall time of the 16-cell smoke grid, sequential against parallel, in one run.

    python scripts/bench_grid.py                      # preset=grid trainer=smoke
    python scripts/bench_grid.py --keep -- seed=7     # extra overrides after --

Each strategy runs ``foxhunt-train -m preset=grid trainer=smoke strategy=<s>`` with the
same seed in a fresh root folder (``FOXHUNT_ROOT``: its own MLflow store, feature cache and
prediction cache, so neither run profits from the other). Wall time is measured around the
whole command with ``time.perf_counter`` (process start, imports, data generation, every cell,
the summary). The parallel run's planning time (memory estimates, including first-time memory
predictions, from ``packing.json``) is printed apart, and the ratio is given with and without
it. The machine's load average before each run is printed too: on a shared machine the figures
move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STRATEGIES = ("sequential", "parallel")


def run_grid(strategy: str, root: Path, extra: list[str]) -> dict:
    command = [
        str(Path(sys.executable).parent / "foxhunt-train"),
        "-m",
        "preset=grid",
        "trainer=smoke",
        f"strategy={strategy}",
        *extra,
    ]
    env = {**os.environ, "FOXHUNT_ROOT": str(root)}
    load = os.getloadavg()[0]
    started = time.perf_counter()
    with open(root / "bench.log", "w") as log:
        code = subprocess.run(command, env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - started
    (sweep,) = sorted((root / "outputs" / "sweeps").iterdir())
    cell_results = [json.loads(p.read_text()) for p in sweep.glob("*/cell.json")]
    plan_file = sweep / "packing.json"
    plan = json.loads(plan_file.read_text()) if plan_file.is_file() else None
    return {
        "strategy": strategy,
        "wall_s": wall,
        "exit": code,
        "cells": len(cell_results),
        "ok": sum(r["status"] in ("FINISHED", "SKIPPED") for r in cell_results),
        "load": load,
        "n_jobs": plan["n_jobs"] if plan else 1,
        "planning_s": plan["seconds"] if plan else 0.0,
        "log": root / "bench.log",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the root folders (printed)")
    parser.add_argument("overrides", nargs="*", help="extra foxhunt-train overrides")
    args = parser.parse_args()
    results = []
    for strategy in STRATEGIES:
        root = Path(tempfile.mkdtemp(prefix=f"foxhunt-bench-{strategy}-"))
        result = run_grid(strategy, root, args.overrides)
        results.append(result)
        print(
            f"{strategy:<10}  {result['wall_s']:7.1f} s  {result['ok']}/{result['cells']} cells ok  "
            f"n_jobs={result['n_jobs']}  planning {result['planning_s']:.1f} s  exit {result['exit']}  "
            f"load before {result['load']:.2f}  ({result['log'] if args.keep else 'log removed'})",
            flush=True,
        )
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    sequential, parallel = results
    ratio = parallel["wall_s"] / sequential["wall_s"]
    ratio_planned = (parallel["wall_s"] - parallel["planning_s"]) / sequential["wall_s"]
    print(
        f"parallel / sequential wall time = {ratio:.2f} (speed-up {1 / ratio:.2f}x); "
        f"without the parallel run's planning: {ratio_planned:.2f} (speed-up {1 / ratio_planned:.2f}x); "
        f"{os.cpu_count()} CPUs"
    )
    return 0 if all(r["exit"] == 0 and r["ok"] == r["cells"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
