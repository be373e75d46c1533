"""Section 6, the whole chain: can a family find a planted pattern, and does none find one in noise?

Through the command line, as a user trains: ``foxhunt-train -m`` walk-forward sweeps of every
configured family over synthetic bars of two kinds, a planted pattern (1-minute returns with
AR(1) coefficient ``system.patterns.planted``: the last move predicts the next) and a pure
random walk (coefficient 0). The cells are the sweeps' own results (``cell.json``: the pooled
out-of-sample test blocks of the folds). What is judged, per family:

- planted: the test Sharpe beats the best baseline's on the same bars (one-bar momentum is the
  baseline that knows the pattern), and the lower end of its block-bootstrap interval is above 0;
- random walk: the deflated Sharpe ratio against the random-walk grid's cells (the chance that
  the best of them is real) stays below ``system.max_dsr_noise``: nothing passes on noise.

A pass on both is the evidence that features, labels, training, positions and the backtest line
up, and that no label or future bar leaks into a test block (a leak finds "skill" in noise).
A family may train at its own size (``system.family_overrides``: the TFT's default size takes an
hour of CPU per walk-forward); every other family at its ``conf/model`` size.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from foxhunt.bench.context import BenchContext
from foxhunt.bench.report import Row
from foxhunt.runs.cell import read_results
from foxhunt.sweeps.summary import best_baseline, deflated_sharpes

SECTION = "system"


def run_grid(ctx: BenchContext) -> dict[str, list]:
    """Every pattern's cells, trained by ``foxhunt-train -m`` (pattern -> CellResult list)."""
    s = ctx.settings.system
    root = ctx.work_dir / SECTION
    root.mkdir(parents=True, exist_ok=True)
    grid: dict[str, list] = {}
    for pattern, coefficient in s.patterns.items():
        results = []
        for models, extra in _sweeps(s):
            sweep_dir = root / "outputs" / "sweeps" / f"{pattern}-{'-'.join(models)}"
            args = ["-m", f"model={','.join(models)}", f"data.source.autocorrelation={coefficient}",
                    f"task=bench-system-{pattern}", f"hydra.sweep.dir={sweep_dir}", *ctx.settings.train_overrides,
                    *s.train_overrides, *extra]  # fmt: skip
            ctx.log(f"system: {pattern} (autocorrelation {coefficient}): {', '.join(models)}")
            started = time.perf_counter()
            done = subprocess.run([*_train_command(), *args], cwd=root, env={**os.environ, "FOXHUNT_ROOT": str(root)},
                                  capture_output=True, text=True)  # fmt: skip
            if done.returncode not in (0, 1):  # 1: a cell failed (its result says which); else the sweep did not run
                raise RuntimeError(f"foxhunt-train {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
            ctx.log(f"system: {pattern} {', '.join(models)}: {time.perf_counter() - started:.0f} s")
            results += read_results(sweep_dir)
        grid[str(pattern)] = results
    return grid


def _sweeps(s) -> list[tuple[list[str], list[str]]]:
    """The sweeps of a pattern: the families at their own size in one, each family with
    ``system.family_overrides`` in its own."""
    own = {str(family): list(extra) for family, extra in s.family_overrides.items()}
    plain = [str(m) for m in s.models if str(m) not in own]
    return [*([(plain, [])] if plain else []), *(([str(m)], own[str(m)]) for m in s.models if str(m) in own)]


def _train_command() -> list[str]:
    found = Path(sys.executable).parent / "foxhunt-train"
    return [str(found)] if found.is_file() else [sys.executable, "-m", "foxhunt.train"]


def judge(grid: dict[str, list], max_dsr_noise: float) -> list[Row]:
    """The section's rows from the cells of :func:`run_grid` (module doc)."""
    rows = []
    for pattern, results in grid.items():
        dsr = deflated_sharpes(results)
        for result in results:
            m = result.metrics
            if "test/sharpe" not in m:
                rows.append(_row(f"{result.cell} on {pattern}: {result.status} ({result.error or 'no test/sharpe'})",
                                 float("nan"), None, float("nan"), ">=" if pattern != "random_walk" else "<=", 0.0))  # fmt: skip
                continue
            interval = f"[{m.get('test/sharpe_ci_low', float('nan')):.2f}, {m.get('test/sharpe_ci_high', float('nan')):.2f}]"
            base = best_baseline(m) or ("none", float("nan"))
            note = f"test Sharpe {m['test/sharpe']:.2f} {interval}, best baseline {base[0]} {base[1]:.2f}, DSR {dsr.get(result.cell, float('nan')):.3f}"
            if pattern == "random_walk":
                rows.append(_row(f"{result.cell} on a random walk: deflated Sharpe", dsr.get(result.cell, float("nan")),
                                 None, dsr.get(result.cell, float("nan")), "<=", max_dsr_noise, note))  # fmt: skip
            else:
                rows.append(_row(f"{result.cell} on {pattern}: test Sharpe - best baseline's", m["test/sharpe"], base[1],
                                 m["test/sharpe"] - base[1], ">=", 0.0, note))  # fmt: skip
                rows.append(_row(f"{result.cell} on {pattern}: test Sharpe interval, lower end", m["test/sharpe"], None,
                                 m.get("test/sharpe_ci_low", float("nan")), ">=", 0.0, note))  # fmt: skip
    return rows


def _row(name: str, foxhunt: float, reference: float | None, figure: float, op: str, goal: float, note: str = "") -> Row:
    return Row(section=SECTION, name=name, threads=1, unit="Sharpe", foxhunt=foxhunt, reference=reference, figure=figure,
               figure_kind="value", goal_op=op, goal=goal, note=note)  # fmt: skip


def run_section(ctx: BenchContext) -> tuple[list[Row], list[str]]:
    s = ctx.settings.system
    notes = [
        f"foxhunt-train -m walk-forward sweeps through the CLI ({', '.join(map(str, s.models))}), synthetic ES bars "
        f"{', '.join(f'{k}: autocorrelation {v}' for k, v in s.patterns.items())}; figures from each cell's pooled test "
        "blocks; DSR against the same pattern's cells",
        f"extra overrides: {' '.join(map(str, s.train_overrides))}"
        + "".join(f"; {family}: {' '.join(map(str, extra))}" for family, extra in s.family_overrides.items()),
    ]
    return judge(run_grid(ctx), float(s.max_dsr_noise)), notes
