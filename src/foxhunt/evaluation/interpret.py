"""What a Temporal Fusion Transformer read: its mean variable-selection weights and attention.

The TFT explains itself in two ways (Lim et al. 2021, section 7): its variable selection
networks give every input variable a softmax weight at every position (static, encoder: known +
observed variables of the past bars, decoder: known variables of the future minutes), and its
interpretable attention, whose heads share one value projection, gives one head-averaged
attention row per position. This module turns the sums of those weights over many windows
(:class:`InterpretationSums`, fed by the model: :meth:`foxhunt.models.tft.TemporalFusionTransformer.interpret_windows`)
into their means (:class:`Interpretation`) and writes them as a table, MLflow metrics and PNGs
(:func:`write_interpretation`). It knows no model: numbers, names and files only.

- ``static`` (S,), ``encoder`` (E,), ``decoder`` (K,): the mean selection weight of each
  variable, over the windows and (encoder, decoder) over their positions; each sums to 1.
- ``attention`` (H, L): the mean attention row of each forecast (decoder) position ``h`` over
  all ``L = seq_len + horizon`` positions (causal: zero after ``seq_len + h``); each row sums
  to 1. Its first ``seq_len`` columns are the attention to the past bars, read by *lag*: lag 0
  is the window's last bar (the bar the decision is made at), lag ``seq_len - 1`` its first.
  The rest of each row is the attention to the forecast positions themselves.

Metrics (``<prefix>`` is ``test/`` for a training run): ``<prefix>vsn_static/<feature>``,
``<prefix>vsn_encoder/<feature>``, ``<prefix>vsn_decoder/<feature>`` (the means above) and
``<prefix>attention/past_share`` (the share of the forecast positions' attention on the past
bars), ``<prefix>attention/mean_lag`` (the attention-weighted mean lag over the past bars).
The figures are built as :mod:`foxhunt.evaluation.plots` builds its own: a ``Figure`` on an
Agg canvas, never ``pyplot``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from foxhunt.evaluation.plots import DPI, FIGURE_SIZE_INCHES

INTERPRET_DIR = "interpretability"  # the artifact folder of a run (and of a replay run)
TABLE_FILE = "interpretability.json"  # everything: names, means, attention matrix, windows read
SELECTION_FILE = "selection.csv"  # group, feature, weight
ATTENTION_FILE = "attention.csv"  # lag, mean over the forecast positions, one column per position
ATTENTION_PNG = "attention.png"
GROUPS = ("static", "encoder", "decoder")  # the three variable selections, in the TFT's order
GRID_ALPHA = 0.3  # as plots.py's grid
STEP_ALPHA = 0.35  # the thin line of each forecast position behind the mean


def selection_png(group: str) -> str:
    return f"selection_{group}.png"


@dataclass(frozen=True)
class SelectionNames:
    """The variables each selection weighs, in the order of its weights: static, encoder (the
    known variables, then the observed ones: the TFT's order) and decoder (the known ones)."""

    static: tuple[str, ...]
    encoder: tuple[str, ...]
    decoder: tuple[str, ...]

    @classmethod
    def of(cls, feature_names: Sequence[str], groups: Mapping[str, Sequence[int]]) -> SelectionNames:
        """From a dataset's feature list and column groups (``MarketDataset.feature_names`` /
        ``groups``, or the dataset manifest, ``dataset.json``, a registered member keeps)."""
        names = [str(n) for n in feature_names]

        def pick(group: str) -> tuple[str, ...]:
            return tuple(names[int(i)] for i in groups[group])

        return cls(pick("static"), pick("known") + pick("observed"), pick("known"))

    def of_group(self, group: str) -> tuple[str, ...]:
        return getattr(self, group)


def spaced_indices(count: int, limit: int | None) -> np.ndarray:
    """``min(count, limit)`` indices of ``0 .. count - 1`` spread evenly from the first to the
    last (``limit`` None: all): windows that cover the whole split, not its first hours."""
    if limit is None or count <= limit:
        return np.arange(count)
    return np.unique(np.linspace(0, count - 1, int(limit)).round().astype(np.int64))


class InterpretationSums:
    """Running sums of the TFT's weights over batches of windows (float64): :meth:`add` one
    batch's sums, :meth:`result` the means."""

    def __init__(self, names: SelectionNames, seq_len: int, horizon: int) -> None:
        self.names = names
        self.seq_len, self.horizon = int(seq_len), int(horizon)
        self.windows = 0
        self.static = np.zeros(len(names.static))
        self.encoder = np.zeros(len(names.encoder))
        self.decoder = np.zeros(len(names.decoder))
        self.attention = np.zeros((self.horizon, self.seq_len + self.horizon))

    def add(self, windows: int, static: np.ndarray, encoder: np.ndarray, decoder: np.ndarray, attention: np.ndarray) -> None:
        """One batch of ``windows`` windows: ``static`` (S,) its static weights summed over the
        windows, ``encoder`` (E,) and ``decoder`` (K,) its selection weights summed over the
        windows and their positions, ``attention`` (H, L) the forecast positions' attention rows
        summed over the windows."""
        for name, value, shape in (("static", static, self.static.shape), ("encoder", encoder, self.encoder.shape),
                                   ("decoder", decoder, self.decoder.shape), ("attention", attention, self.attention.shape)):  # fmt: skip
            if np.shape(value) != shape:
                raise ValueError(
                    f"InterpretationSums.add: {name} has shape {np.shape(value)}, expected {shape} (names, seq_len, horizon)"
                )
        self.windows += int(windows)
        self.static += static
        self.encoder += encoder
        self.decoder += decoder
        self.attention += attention

    def result(self, source: str, total_windows: int | None = None) -> Interpretation:
        """The means; ``source`` says which windows they are of (a split, a replay),
        ``total_windows`` how many there were before a cap."""
        n = max(self.windows, 1)
        return Interpretation(
            names=self.names,
            windows=self.windows,
            total_windows=self.windows if total_windows is None else int(total_windows),
            source=source,
            static=self.static / n,
            encoder=self.encoder / (n * self.seq_len),
            decoder=self.decoder / (n * self.horizon),
            attention=self.attention / n,
        )


@dataclass(frozen=True)
class Interpretation:
    """Mean selection weights and attention over ``windows`` windows (module doc)."""

    names: SelectionNames
    windows: int
    total_windows: int
    source: str
    static: np.ndarray
    encoder: np.ndarray
    decoder: np.ndarray
    attention: np.ndarray  # (horizon, seq_len + horizon)

    @property
    def horizon(self) -> int:
        return int(self.attention.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.attention.shape[1]) - self.horizon

    def selection(self, group: str) -> np.ndarray:
        return getattr(self, group)

    def attention_by_lag(self) -> np.ndarray:
        """(H, seq_len): each forecast position's mean attention to the past bars, lag 0 (the
        window's last bar) first."""
        return self.attention[:, : self.seq_len][:, ::-1]

    def past_share(self) -> float:
        """The share of the forecast positions' attention on the past bars (the rest is on the
        forecast positions themselves)."""
        return float(self.attention[:, : self.seq_len].sum(axis=1).mean())

    def mean_lag(self) -> float:
        """The attention-weighted mean lag over the past bars (bars before the decision)."""
        lags = self.attention_by_lag().mean(axis=0)
        total = lags.sum()
        return float((lags * np.arange(len(lags))).sum() / total) if total > 0 else float("nan")

    def metrics(self, prefix: str) -> dict[str, float]:
        """``<prefix>vsn_<group>/<feature>`` per variable, ``<prefix>attention/past_share`` and
        ``<prefix>attention/mean_lag`` (module doc)."""
        found = {f"{prefix}vsn_{group}/{name}": float(weight) for group in GROUPS
                 for name, weight in zip(self.names.of_group(group), self.selection(group))}  # fmt: skip
        found[f"{prefix}attention/past_share"] = self.past_share()
        found[f"{prefix}attention/mean_lag"] = self.mean_lag()
        return found

    def table(self) -> dict:
        """Everything, JSON-ready: what the windows were, each selection as feature -> weight,
        the attention by lag (mean over the forecast positions, and per position) and the full
        mean attention matrix."""
        return {
            "source": self.source,
            "windows": self.windows,
            "windows_available": self.total_windows,
            "seq_len": self.seq_len,
            "horizon": self.horizon,
            "selection": {group: dict(zip(self.names.of_group(group), map(float, self.selection(group)))) for group in GROUPS},
            "attention": {
                "past_share": self.past_share(),
                "mean_lag": self.mean_lag(),
                "by_lag_mean": self.attention_by_lag().mean(axis=0).tolist(),
                "by_lag_per_step": self.attention_by_lag().tolist(),
                "matrix": self.attention.tolist(),  # rows: forecast positions 1..horizon; columns: all positions, oldest first
            },
        }

    def summary_line(self, top: int = 3) -> str:
        """One console line: the windows read, the encoder's ``top`` variables, the past share."""
        order = np.argsort(self.encoder)[::-1][:top]
        best = ", ".join(f"{self.names.encoder[i]} {self.encoder[i]:.3f}" for i in order)
        return (f"interpretability: {self.windows} of {self.total_windows} windows; encoder selection {best}; "
                f"attention on the past {self.past_share():.1%}, mean lag {self.mean_lag():.1f} bars")  # fmt: skip


def write_interpretation(result: Interpretation, folder: str | Path, title: str) -> list[Path]:
    """The table (:data:`TABLE_FILE`, :data:`SELECTION_FILE`, :data:`ATTENTION_FILE`), a bar
    chart of each selection and the attention by lag, under ``folder``; returns the paths."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / TABLE_FILE, out / SELECTION_FILE, out / ATTENTION_FILE]
    paths[0].write_text(json.dumps(result.table(), indent=1))
    with paths[1].open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["group", "feature", "weight"])
        for group in GROUPS:
            writer.writerows([group, name, f"{w:.8g}"] for name, w in zip(result.names.of_group(group), result.selection(group)))
    by_lag = result.attention_by_lag()
    with paths[2].open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["lag", "mean", *(f"step_{h + 1}" for h in range(result.horizon))])
        writer.writerows(
            [lag, f"{by_lag[:, lag].mean():.8g}", *(f"{v:.8g}" for v in by_lag[:, lag])] for lag in range(result.seq_len)
        )
    for group in GROUPS:
        if len(result.names.of_group(group)):
            paths.append(plot_selection(result, group, out / selection_png(group), title))
    paths.append(plot_attention(result, out / ATTENTION_PNG, title))
    return paths


def plot_selection(result: Interpretation, group: str, path: str | Path, title: str) -> Path:
    """Horizontal bars of one selection's mean weights, the largest on top."""
    names, weights = result.names.of_group(group), result.selection(group)
    order = np.argsort(weights)
    fig = Figure(figsize=FIGURE_SIZE_INCHES, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.barh([names[i] for i in order], weights[order], color="tab:blue")
    ax.axvline(1.0 / len(weights), color="grey", linewidth=0.8, linestyle="--", label=f"uniform (1/{len(weights)})")
    ax.set_xlabel("mean selection weight")
    ax.legend(loc="lower right")
    return _finish(fig, ax, path, f"{title}\n{group} variable selection, mean over {result.windows} windows ({result.source})")


def plot_attention(result: Interpretation, path: str | Path, title: str) -> Path:
    """The forecast positions' mean attention to each past bar, by lag (thin: each position)."""
    by_lag = result.attention_by_lag()
    lags = np.arange(result.seq_len)
    fig = Figure(figsize=FIGURE_SIZE_INCHES, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for h, row in enumerate(by_lag):
        ax.plot(lags, row, color="tab:grey", linewidth=0.6, alpha=STEP_ALPHA, label="each forecast step" if h == 0 else None)
    ax.plot(lags, by_lag.mean(axis=0), color="tab:blue", linewidth=2.0, marker=".", label="mean over the forecast steps")
    ax.set_xlabel("lag (bars before the decision; 0 = the window's last bar)")
    ax.set_ylabel("mean attention")
    ax.legend(loc="best")
    return _finish(fig, ax, path, f"{title}\nattention to the past bars, {result.windows} windows ({result.source}); "
                                  f"past share {result.past_share():.1%}, mean lag {result.mean_lag():.1f}")  # fmt: skip


def _finish(fig: Figure, ax, path: str | Path, title: str) -> Path:
    ax.set_title(title)
    ax.grid(True, alpha=GRID_ALPHA)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out
