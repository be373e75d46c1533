"""The end-of-sweep summary: one row per cell, a model x asset pivot and a heatmap.

Columns: status, ``test/sharpe`` (shared backtest of the test split; a walk-forward cell's is its
pooled test blocks', mean across seeds) with its block bootstrap interval, the best baseline's
Sharpe on the same bars (``test/baseline/<name>/sharpe``), the deflated Sharpe ratio, flags,
the test split's Sortino and Calmar ratios, maximum drawdown (USD) and exposure (share of the
bars in the market), ``val/loss`` (forecasters only; agents have none), peak memory (``memory/device_peak_mb``: the measured
figure the budget is checked against; how it was measured depends on the budget, see
:mod:`foxhunt.memory.callback`), wall time of the job (``time.perf_counter`` around the cell;
for a SKIPPED cell, the duration of its earlier FINISHED run) and the error of a failed cell.
The heatmap is built on a ``matplotlib.figure.Figure`` with an Agg canvas, never ``pyplot``.

**Deflated Sharpe ratio** (:func:`foxhunt.evaluation.deflated.deflated_sharpe_ratio`): the best
of N cells looks good by chance alone, so each cell's test Sharpe (per step) is judged against
the Sharpe the best of the N cells with results on the same data set would reach by luck, given
the spread of their Sharpe ratios; the DSR is the probability that the cell's true Sharpe exceeds
that (a search's trials are N trials the same way, every trial of its study counted: finished,
pruned and failed; those without a test Sharpe add to N, not to the spread). A cell's data set is
its asset (:func:`data_set`): ES's cells are never judged against NQ's, whose Sharpe ratios are
of other bars. A result carries no digest of its bars, so cells of one asset on other bars (a
sweep over synthetic seeds) are taken as one data set; ``foxhunt runs top`` tells them apart by
the runs' ``data.digest``. **Flags**: ``CI~0``: the interval contains 0
(the figure cannot be told from no skill); ``<=base``: the Sharpe does not beat the best
baseline's.

A search sweep's results are trials (:mod:`foxhunt.sweeps.search`): one row per trial of its
study, every launch's, in trial order, with an ``objective`` column (the value told to the
study; several objectives: each, in order) and the study's states PRUNED and RETRIED beside the
runs' (neither is a failure); the markdown ends with the best trial (or the Pareto front)
instead of the model x asset pivot, and the figure plots each trial's value and the best so
far (:func:`plot_trials`) instead of the heatmap.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from foxhunt.evaluation.deflated import deflated_sharpe_ratio
from foxhunt.runs.cell import CellResult
from foxhunt.runs.status import OK_RESULTS, Status
from foxhunt.sweeps.study import PRUNED, RETRIED

#: A trial's states that are no failure of the sweep (a trial another live process runs neither).
NOT_FAILED = (*OK_RESULTS, PRUNED, RETRIED, Status.RUNNING)

SHARPE, VAL_LOSS, PEAK = "test/sharpe", "val/loss", "memory/device_peak_mb"
SORTINO, CALMAR, MAX_DRAWDOWN, EXPOSURE = "test/sortino", "test/calmar", "test/max_drawdown", "test/exposure"
CI_LOW, CI_HIGH = "test/sharpe_ci_low", "test/sharpe_ci_high"
BASELINE_SHARPE = re.compile(r"^test/baseline/(?P<name>[^/]+)/sharpe$")
HEADER = ("cell", "status", SHARPE, "interval", "best baseline", "DSR", "flags", "sortino", "calmar", "max DD $",
          "exposure", VAL_LOSS, "peak MB", "wall s", "error / note")  # fmt: skip
OBJECTIVE_COLUMN = "objective"  # a trial's value, what its job returned to the sweeper
TRIAL_HEADER = ("trial", "status", OBJECTIVE_COLUMN, *HEADER[2:])
TRIAL_INCHES = (7.0, 4.0)
ERROR_WIDTH = 80  # characters of an error shown in the printed table
CELL_INCHES = (1.6, 0.9)  # heatmap width per asset, height per model
DPI = 100
DARK_FRACTION = 0.6  # |sharpe| above this share of the colour scale's bound is drawn on a dark cell


LEGEND = (
    "interval: block bootstrap of the test Sharpe; DSR: deflated Sharpe ratio against the best of the"
    " sweep's cells on the same asset's bars by chance; flags: CI~0 = the interval contains 0, <=base = does not beat the best baseline"
)


def failures(results: list[CellResult]) -> list[CellResult]:
    return [r for r in results if r.status not in NOT_FAILED]


def _number(value: float | None, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def best_baseline(metrics: dict[str, float]) -> tuple[str, float] | None:
    """The baseline with the highest test Sharpe on the cell's bars (name, Sharpe)."""
    found = [(m["name"], value) for key, value in metrics.items() if (m := BASELINE_SHARPE.match(key))]
    return max(found, key=lambda item: item[1], default=None)


def data_set(result: CellResult) -> str:
    """The data set a cell's Sharpe ratio is of: its asset (module doc)."""
    return result.key.asset


def _tried(results: list[CellResult], n_trials: int | None) -> dict[str, int]:
    """Per data set, how many cells or trials were tried on it: a search's ``n_trials`` when all its
    results are on one data set, else each data set's rows (a search's every trial, any state)."""
    rows: dict[str, int] = {}
    for r in results:
        rows[data_set(r)] = rows.get(data_set(r), 0) + 1
    if n_trials and len(rows) == 1:
        return {name: max(n_trials, count) for name, count in rows.items()}
    return rows if n_trials else {}


def deflated_sharpes(results: list[CellResult], n_trials: int | None = None) -> dict[str, float]:
    """Each cell's deflated Sharpe ratio against the cells with results on its data set (module
    doc); ``n_trials``: how many were tried (a search's study), when more than those with results."""
    needed = ("test/sharpe_per_step", "test/steps", "test/pnl_skew", "test/pnl_kurtosis")
    scored = [r for r in results if r.status in OK_RESULTS and all(k in r.metrics for k in needed)]
    trials: dict[str, list[float]] = {}
    for r in scored:
        trials.setdefault(data_set(r), []).append(r.metrics["test/sharpe_per_step"])
    tried = _tried(results, n_trials)
    values = {}
    for r in scored:
        m, own = r.metrics, trials[data_set(r)]
        try:
            values[r.cell] = deflated_sharpe_ratio(m["test/sharpe_per_step"], own, int(m["test/steps"]), m["test/pnl_skew"],
                                                   m["test/pnl_kurtosis"], max(tried.get(data_set(r), 0), len(own)) or None)  # fmt: skip
        except ValueError:  # moments the PSR formula cannot take (a degenerate result): no figure
            continue
    return values


def _counted(results: list[CellResult], dsr: dict[str, float], n_trials: int | None) -> str:
    """What each DSR was judged against, in words: N cells (trials) per data set."""
    unit = "trials" if n_trials else "cells"
    tried = _tried(results, n_trials)
    with_dsr: dict[str, int] = {}
    for r in results:
        if r.cell in dsr:
            with_dsr[data_set(r)] = with_dsr.get(data_set(r), 0) + 1
    counts = {name: max(tried.get(name, 0), count) for name, count in with_dsr.items()}
    if len(counts) <= 1:
        return f"the best of {sum(counts.values())} {unit}"
    return "the best of the cells on its own data set (" + ", ".join(f"{name}: {n} {unit}" for name, n in counts.items()) + ")"


def _flags(metrics: dict[str, float]) -> str:
    flags = []
    low, high, sharpe = metrics.get(CI_LOW), metrics.get(CI_HIGH), metrics.get(SHARPE)
    if low is not None and high is not None and low <= 0 <= high:
        flags.append("CI~0")
    base = best_baseline(metrics)
    if base is not None and sharpe is not None and sharpe <= base[1]:
        flags.append("<=base")
    return " ".join(flags)


def is_search(results: list[CellResult]) -> bool:
    """True for the results of a search sweep (trials)."""
    return any(r.trial is not None for r in results)


def _header(results: list[CellResult]) -> tuple[str, ...]:
    return TRIAL_HEADER if is_search(results) else HEADER


def _objective_text(result: CellResult, values: dict[int, tuple[float, ...]] | None) -> str:
    told = None if result.trial is None else (values or {}).get(result.trial)
    if told is not None and len(told) > 1:
        return ", ".join(_number(v, 4) for v in told)
    return _number(result.objective, 4)


def _row(result: CellResult, dsr: dict[str, float] | None = None, search: bool = False,
         values: dict[int, tuple[float, ...]] | None = None) -> tuple[str, ...]:  # fmt: skip
    text = result.error or result.note or ""
    if len(text) > ERROR_WIDTH:
        text = text[: ERROR_WIDTH - 3] + "..."
    m = result.metrics
    ok = result.status in OK_RESULTS
    interval = f"[{m[CI_LOW]:.2f}, {m[CI_HIGH]:.2f}]" if ok and CI_LOW in m and CI_HIGH in m else "-"
    base = best_baseline(m) if ok else None
    return (
        result.cell,
        result.status,
        *((_objective_text(result, values),) if search else ()),
        _number(m.get(SHARPE), 3),
        interval,
        f"{base[0]} {base[1]:.3f}" if base else "-",
        _number((dsr or {}).get(result.cell), 3),
        _flags(m) if ok else "",
        _number(m.get(SORTINO), 3),
        _number(m.get(CALMAR), 2),
        _number(m.get(MAX_DRAWDOWN), 0),
        _number(m.get(EXPOSURE), 2),
        _number(m.get(VAL_LOSS), 4),
        _number(result.metrics.get(PEAK), 0),
        _number(result.wall_s, 1),
        text,
    )


def format_table(
    results: list[CellResult], n_trials: int | None = None, values: dict[int, tuple[float, ...]] | None = None
) -> str:
    """Aligned plain-text table, one line per cell (per trial); ``n_trials`` and ``values``: a
    search's study (every trial tried; each finished trial's values)."""
    header, search = _header(results), is_search(results)
    dsr = deflated_sharpes(results, n_trials)
    rows = [header, *(_row(r, dsr, search, values) for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    lines.append(LEGEND + (f" (N: {_counted(results, dsr, n_trials)} of the study, pruned and failed ones counted)"
                           if n_trials else ""))  # fmt: skip
    return "\n".join(lines)


def _labels(results: list[CellResult]) -> tuple[list[str], list[str], dict[tuple[str, str], CellResult]]:
    several_precisions = len({r.key.precision for r in results}) > 1
    grid: dict[tuple[str, str], CellResult] = {}
    for r in results:
        row = f"{r.key.model} {r.key.precision}" if several_precisions else r.key.model
        grid[(row, r.key.asset)] = r
    rows = list(dict.fromkeys(key[0] for key in grid))
    columns = list(dict.fromkeys(r.key.asset for r in results))
    return rows, columns, grid


def format_markdown(results: list[CellResult], title: str, best: str | None = None, n_trials: int | None = None,
                    values: dict[int, tuple[float, ...]] | None = None) -> str:  # fmt: skip
    """The per-cell table and the model x asset pivot of ``test/sharpe`` (status when failed);
    for trials, the per-trial table and ``best`` (the best trial's lines)."""
    header, search = _header(results), is_search(results)
    lines = [f"# {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    dsr = deflated_sharpes(results, n_trials)
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in _row(r, dsr, search, values)) + " |" for r in results]
    counted = _counted(results, dsr, n_trials) + (" (pruned and failed ones counted)" if n_trials else "")
    lines += ["", (f"DSR: deflated Sharpe ratio against {counted} by chance; flags: CI~0 = the"
              " interval contains 0, <=base = does not beat the best baseline (foxhunt.sweeps.summary)")]  # fmt: skip
    failed = failures(results)
    if search or best is not None:
        lines += ["", "```", best or "best trial: -", "```", ""]
        lines += [
            f"{len(results) - len(failed)} of {len(results)} trials ok"
            + (f"; failed: {', '.join(r.cell for r in failed)}" if failed else "")
        ]
        return "\n".join(lines) + "\n"
    rows, columns, grid = _labels(results)
    lines += [
        "",
        f"## {SHARPE} (model x asset)",
        "",
        "| model | " + " | ".join(columns) + " |",
        "|" + "---|" * (len(columns) + 1),
    ]
    for row in rows:
        cells = []
        for column in columns:
            result = grid.get((row, column))
            if result is None:
                cells.append("")
            elif result.status in OK_RESULTS:
                cells.append(_number(result.metrics.get(SHARPE), 3))
            else:
                cells.append(result.status)
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"{len(results) - len(failed)} of {len(results)} cells ok"
        + (f"; failed: {', '.join(r.cell for r in failed)}" if failed else ""),
    ]
    return "\n".join(lines) + "\n"


def plot_heatmap(results: list[CellResult], path: str | Path, title: str) -> Path:
    """Model x asset heatmap of ``test/sharpe``; failed cells grey with their status."""
    rows, columns, grid = _labels(results)
    values = np.full((len(rows), len(columns)), np.nan)
    for (row, column), result in grid.items():
        sharpe = result.metrics.get(SHARPE)
        if result.status in OK_RESULTS and sharpe is not None:
            values[rows.index(row), columns.index(column)] = sharpe
    finite = values[np.isfinite(values)]
    bound = float(np.max(np.abs(finite))) if finite.size and np.max(np.abs(finite)) > 0 else 1.0
    cmap = colormaps["RdYlGn"].with_extremes(bad="lightgrey")
    figure = Figure(figsize=(2 + CELL_INCHES[0] * len(columns), 1.5 + CELL_INCHES[1] * len(rows)))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    image = axes.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=TwoSlopeNorm(0.0, -bound, bound), aspect="auto")
    axes.set_xticks(range(len(columns)), columns)
    axes.set_yticks(range(len(rows)), rows)
    for (row, column), result in grid.items():
        sharpe = values[rows.index(row), columns.index(column)]
        text = f"{sharpe:.2f}" if np.isfinite(sharpe) else result.status
        if result.status == Status.SKIPPED:
            text += "\n(earlier run)"
        dark = np.isfinite(sharpe) and abs(sharpe) > DARK_FRACTION * bound  # strong colour: white text
        axes.text(
            columns.index(column), rows.index(row), text, ha="center", va="center", fontsize=9, color="white" if dark else "black"
        )
    figure.colorbar(image, ax=axes, label=SHARPE)
    axes.set_title(title)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=DPI)
    return path


def plot_summary(results: list[CellResult], path: str | Path, title: str, goal: str | None = None) -> Path:
    """The sweep's figure: the heatmap of a grid, or :func:`plot_trials` for a search."""
    return plot_trials(results, path, title, goal) if is_search(results) else plot_heatmap(results, path, title)


def plot_trials(results: list[CellResult], path: str | Path, title: str, goal: str | None = None) -> Path:
    """Each trial's value by trial number, the best so far as a step line (``goal``: maximize
    or minimize) and the trials without a value marked at the bottom."""
    trials = sorted((r.trial, r) for r in results if r.trial is not None)
    scored = [(number, r.objective) for number, r in trials
              if r.status in OK_RESULTS and r.objective is not None and math.isfinite(r.objective)]  # fmt: skip
    missing = [number for number, r in trials if (number, r.objective) not in scored]
    figure = Figure(figsize=TRIAL_INCHES)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    if scored:
        numbers, values = zip(*scored)
        axes.plot(numbers, values, "o", color="tab:blue", label=OBJECTIVE_COLUMN)
        if goal in ("maximize", "minimize"):
            best = np.maximum.accumulate(values) if goal == "maximize" else np.minimum.accumulate(values)
            axes.step(numbers, best, where="post", color="tab:green", label=f"best so far ({goal})")
    if missing:
        low = min((v for _, v in scored), default=0.0)
        axes.plot(missing, [low] * len(missing), "x", color="tab:red", label="no value (failed, pruned)")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("trial")
    axes.set_ylabel(OBJECTIVE_COLUMN)
    if scored or missing:
        axes.legend(loc="best", fontsize=8)
    axes.set_title(title)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=DPI)
    return path
