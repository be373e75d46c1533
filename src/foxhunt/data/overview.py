"""What a data config yields, without training: the summary behind ``foxhunt data show``.

:func:`describe` loads the bars of a source the way a run does and reports, as plain data
(JSON-ready): the source and its files, the first and last bar, bars per contract and per
session, the roll schedule and why each roll happened, the tick-grid check of the raw prices,
the session calendar used with the holidays and early closes in range, the gaps in the bars
that fall in open-market time (a closed market is not a gap), and the feature split
boundaries with the bars of each split (or each walk-forward fold). :func:`plot_continuous`
draws the raw and the back-adjusted close with the rolls marked.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from foxhunt.assets import AssetSpec
from foxhunt.data.bars import off_tick_mask
from foxhunt.data.calendar import calendar_for
from foxhunt.data.dataset import build_market_dataset
from foxhunt.data.features import FeatureConfig
from foxhunt.data.roll import CONTRACT, RAW_CLOSE, ROLL_PRICE, schedule_rows
from foxhunt.data.splits import FoldSplit, WalkForwardConfig, as_split
from foxhunt.errors import UserError


def load_bars(source: Any, asset: AssetSpec) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The bars a run would read from ``source`` and, for a source that rolls, its rolls
    (:data:`foxhunt.data.roll.SCHEDULE_COLUMNS`); the files are read once."""
    if not hasattr(source, "continuous"):
        return source.load(asset), None
    series = source.continuous(asset)
    return series.bars(), series.rolls


def describe(source: Any, asset: AssetSpec, bars: pd.DataFrame, rolls: pd.DataFrame | None, features_cfg: Any,
             split_cfg: Any, walk_forward: WalkForwardConfig | None = None,
             min_gap_minutes: int = 1, holdout: float = 0.0) -> dict[str, Any]:  # fmt: skip
    """The summary of what ``source`` yields for ``asset``, from its ``bars`` and ``rolls``
    (:func:`load_bars`; see the module docstring); a gap is a run of at least
    ``min_gap_minutes`` open-market minutes without a bar; ``holdout`` the lockbox's fraction."""
    index = bars.index
    raw = bars[RAW_CLOSE].to_numpy(np.float64) if RAW_CLOSE in bars else bars["close"].to_numpy(np.float64)
    contracts = bars[CONTRACT].astype(str).to_numpy() if CONTRACT in bars else np.full(len(bars), asset.root)
    calendar = calendar_for(asset)
    sessions = calendar.trading_dates(index)
    per_session = (
        pd.DataFrame({"session": sessions, "contract": contracts, "ts": index})
        .groupby(["session", "contract"], sort=True)["ts"].agg(["size", "min", "max"]).reset_index()
    )  # fmt: skip
    first, last = index[0], index[-1]
    gaps = calendar.gaps(index, min_minutes=min_gap_minutes)
    off = off_tick_mask(raw, asset.tick_size)
    summary: dict[str, Any] = {
        "asset": asset.key,
        "source": type(source).__name__,
        "files": [str(f) for f in _files(source)],
        "bars": int(len(bars)),
        "first_bar": first.isoformat(),
        "last_bar": last.isoformat(),
        "adjust": getattr(getattr(source, "rule", None), "adjust", "none"),
        "roll": getattr(getattr(source, "rule", None), "params", lambda: None)(),
        "bars_per_contract": {str(k): int(v) for k, v in pd.Series(contracts).value_counts().sort_index().items()},
        "sessions": [
            {
                "session": f"{pd.Timestamp(r.session):%Y-%m-%d}",
                "contract": r.contract,
                "bars": int(r.size),
                "first_bar": r.min.isoformat(),
                "last_bar": r.max.isoformat(),
            }
            for r in per_session.itertuples(index=False)
        ],  # fmt: skip
        "rolls": schedule_rows(rolls) if rolls is not None else [],
        "tick_grid": {
            "tick": asset.tick_size,
            "raw_closes": int(len(raw)),
            "off_grid": int(off.sum()),
            "first_off_grid": index[int(np.argmax(off))].isoformat() if off.any() else None,
        },  # fmt: skip
        "calendar": {
            "name": calendar.name,
            "holidays": [f"{d:%Y-%m-%d}" for d in calendar.holidays(first, last)],
            "early_closes": [
                {"date": f"{d:%Y-%m-%d}", "close": f"{c:%H:%M} UTC"} for d, c in calendar.early_closes(first, last).items()
            ],
        },  # fmt: skip
        "min_gap_minutes": int(min_gap_minutes),
        "gaps": [
            {
                "start": g.start.isoformat(),
                "end": g.end.isoformat(),
                "open_minutes_missing": int(g.open_minutes),
                "closed_minutes_inside": int(g.closed_minutes),
            }
            for g in gaps.itertuples(index=False)
        ],  # fmt: skip
        "splits": _splits(bars, asset, features_cfg, split_cfg, walk_forward, holdout),
    }
    return summary


def plot_continuous(bars: pd.DataFrame, rolls: pd.DataFrame | None, asset: AssetSpec, adjust: str, path: Path) -> Path:
    """A PNG of the continuous close, raw and back-adjusted (``adjust``), with each roll marked."""
    raw = bars[RAW_CLOSE] if RAW_CLOSE in bars else bars["close"]
    x = np.arange(len(bars))  # bar number: closed-market time takes no width
    fig = Figure(figsize=(11, 4.5))
    FigureCanvasAgg(fig)  # drawn off screen, without pyplot's global figure manager and backend
    ax = fig.add_subplot()
    ax.plot(x, raw.to_numpy(), lw=0.8, label="raw close (the contract held)")
    if ROLL_PRICE in bars and not np.allclose(bars["close"].to_numpy(), raw.to_numpy()):
        ax.plot(x, bars["close"].to_numpy(), lw=0.8, label=f"adjusted close ({adjust})")
    if rolls is not None:
        for roll in rolls.itertuples(index=False):
            at = int(bars.index.get_loc(roll.first_bar))
            ax.axvline(at, color="tab:red", lw=0.8, ls="--")
            ax.annotate(f"{roll.from_contract}->{roll.to_contract}\n{pd.Timestamp(roll.session):%Y-%m-%d}", (at, ax.get_ylim()[1]),
                        fontsize=7, va="top", ha="left", color="tab:red")  # fmt: skip
    ticks = np.linspace(0, len(bars) - 1, num=min(8, len(bars)), dtype=int)
    ax.set_xticks(ticks, [f"{bars.index[i]:%Y-%m-%d}" for i in ticks], rotation=20, fontsize=8)
    ax.set_xlabel("bar (closed-market time takes no width)")
    ax.set_ylabel("price")
    ax.set_title(f"{asset.key}: continuous close, {len(bars):,} bars")
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _files(source: Any) -> list[Path]:
    files = getattr(source, "files", None)
    return list(files()) if callable(files) else []


def _splits(bars: pd.DataFrame, asset: AssetSpec, features_cfg: Any, split_cfg: Any,
            walk_forward: WalkForwardConfig | None, holdout: float) -> dict[str, Any]:  # fmt: skip
    """Each split's rows and first and last bar (after the feature warm-up), per fold for a
    walk-forward, and the lockbox's (``evaluation.holdout``). Bars too few for the splits are
    said (``error``), never refused: an inspection shows what is there."""
    warmup = FeatureConfig.from_config(features_cfg).warmup_bars
    fraction, open_holdout = float(holdout or 0.0), bool(holdout)
    protocol = "walk_forward" if walk_forward is not None else "single"
    try:
        if walk_forward is None:
            dataset = build_market_dataset(
                bars, asset, features_cfg, dataclasses.replace(as_split(split_cfg), holdout=fraction, open_holdout=open_holdout)
            )
            return {"protocol": protocol, "warmup_bars": warmup, **dataset.manifest()["splits"]}
        folds = []
        for k in range(walk_forward.folds):
            dataset = build_market_dataset(bars, asset, features_cfg, FoldSplit(walk_forward, k, fraction, open_holdout))
            folds.append({"fold": k, **dataset.manifest()["splits"]})
        return {"protocol": protocol, "warmup_bars": warmup, "folds": folds}
    except (UserError, ValueError) as exc:  # too few bars for the splits (or the warm-up): what is there still shows
        return {"protocol": protocol, "warmup_bars": warmup, "error": str(exc)}
