"""Equity-curve picture of one backtest (PNG), logged as a run artifact.

The figure is built on a ``matplotlib.figure.Figure`` with an Agg canvas, never through
``pyplot``: no global figure registry, no backend switch, nothing left open in the process.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from foxhunt.evaluation.backtest import BacktestResult

FIGURE_SIZE_INCHES = (10.0, 5.0)
DPI = 100
DRAWDOWN_ALPHA = 0.3


def plot_equity(
    result: BacktestResult,
    timestamps,
    path: str | Path,
    title: str = "Equity",
) -> Path:
    """Write the equity curve of ``result`` against ``timestamps`` (T,) to ``path`` (PNG).

    The curve starts at 0 at ``timestamps[0]`` and shows ``result.equity[t]`` at
    ``timestamps[t + 1]``; the area between the running peak and the curve (the drawdown) is
    shaded, and the metrics appear in the title. Returns the path written.
    """
    times = pd.DatetimeIndex(timestamps)
    if len(times) != len(result.equity) + 1:
        raise ValueError(
            f"plot_equity timestamps: length {len(times)} does not match the backtest's {len(result.equity) + 1} bars"
        )
    x = _utc_naive(times)
    equity = np.concatenate(([0.0], result.equity))
    peak = np.maximum.accumulate(equity)
    m = result.metrics

    fig = Figure(figsize=FIGURE_SIZE_INCHES, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(x, equity, color="tab:blue", label=f"equity (PnL {m['pnl']:,.0f} USD)")
    ax.fill_between(
        x,
        equity,
        peak,
        where=peak > equity,
        color="tab:red",
        alpha=DRAWDOWN_ALPHA,
        label=f"drawdown (max {m['max_drawdown']:,.0f} USD)",
    )
    ax.axhline(0.0, color="grey", linewidth=0.8)
    return _finish(fig, ax, path, f"{title}\nSharpe {m['sharpe']:.2f} | hit rate {m['hit_rate']:.1%} | "
                                  f"turnover {m['turnover']:.3f} | trades {m['trades']}")  # fmt: skip


def plot_equities(results: dict[str, BacktestResult], timestamps, path: str | Path, title: str,
                  highlight: str | None = None) -> Path:  # fmt: skip
    """Several equity curves on one axis (``name -> result``, same bars), ``highlight`` drawn
    thicker: an ensemble beside its members. Returns the path written."""
    x = _utc_naive(pd.DatetimeIndex(timestamps))
    fig = Figure(figsize=FIGURE_SIZE_INCHES, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, result in results.items():
        if len(result.equity) + 1 != len(x):
            raise ValueError(f"plot_equities {name}: {len(result.equity) + 1} bars, timestamps {len(x)}")
        m = result.metrics
        ax.plot(x, np.concatenate(([0.0], result.equity)), linewidth=2.4 if name == highlight else 1.0,
                label=f"{name}: PnL {m['pnl']:,.0f} USD, Sharpe {m['sharpe']:.2f}")  # fmt: skip
    ax.axhline(0.0, color="grey", linewidth=0.8)
    return _finish(fig, ax, path, title)


def _utc_naive(times: pd.DatetimeIndex) -> np.ndarray:
    if times.tz is not None:
        times = times.tz_convert("UTC").tz_localize(None)
    return times.to_numpy()


def _finish(fig: Figure, ax, path: str | Path, title: str) -> Path:
    """Title, labels, legend and grid of an equity axis; the PNG written to ``path``."""
    ax.set_title(title)
    ax.set_xlabel("time (UTC)")
    ax.set_ylabel("USD")
    ax.legend(loc="upper left")
    ax.grid(True, alpha=DRAWDOWN_ALPHA)
    fig.autofmt_xdate()
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out
