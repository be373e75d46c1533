"""Replaying a bars frame through the streaming engine, bar by bar, and scoring what it decided.

:func:`replay_bars` feeds a bars frame to a :class:`~foxhunt.ensemble.engine.StreamingEngine`
one bar at a time, exactly as a live feed would (each bar checked, features updated in O(1),
every member stepped), and keeps every member's and the ensemble's position, each member's
step time and each bar's total time. With ``start_ns`` the bars before it only prime the
features (:meth:`StreamingEngine.warm`) and the members start fresh at the first bar at or after
it: replaying a split this way gives the decisions of the batch path on that split.

:func:`score_replay` runs the shared backtest (:func:`foxhunt.evaluation.backtest.backtest`,
the one every training run reports) on the positions of each member and of the ensemble.

:func:`replayed_windows` gives, after a replay, the input windows a forecaster member read on
its bars (``foxhunt ensemble replay --interpret``: the TFT's selection weights and attention
over them are computed from these, batched, so the per-bar step stays as it is).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from foxhunt.data.features import FeatureConfig
from foxhunt.data.roll import RAW_CLOSE, ROLL_PRICE
from foxhunt.data.streaming import KnownCalendar, StreamingFeatures
from foxhunt.ensemble.engine import MemberInputs, StreamingEngine
from foxhunt.evaluation.backtest import BacktestResult, backtest
from foxhunt.evaluation.interpret import spaced_indices

ENSEMBLE = "ensemble"
PROGRESS_EVERY = 100  # bars between progress reports


@dataclass
class ReplayResult:
    """What a replay decided: over the ``T`` bars the members were stepped on, ``timestamps``
    (datetime64[ns]), ``close`` (the raw close of the contract held), ``roll_price`` (NaN
    except on roll bars, :mod:`foxhunt.data.roll`; None without rolls), ``positions`` (name -> (T,) int8, ``ensemble`` included),
    ``signals`` (forecaster name -> (T,) float, NaN where it had none), ``member_ns`` (name ->
    (T,) step ns, 0 while the features warmed up) and ``total_ns`` (T,) per bar."""

    timestamps: np.ndarray
    close: np.ndarray
    positions: dict[str, np.ndarray]
    signals: dict[str, np.ndarray]
    member_ns: dict[str, np.ndarray]
    total_ns: np.ndarray
    warm_bars: int  # bars at the start whose features were not ready (every position flat)
    roll_price: np.ndarray | None = None


def replay_bars(engine: StreamingEngine, bars: pd.DataFrame, start_ns: int | None = None,
                stop_ns: int | None = None, progress: Callable[[int, int], None] | None = None) -> ReplayResult:  # fmt: skip
    """Stream ``bars`` (a bars frame, UTC index) through ``engine``; see the module doc.
    ``stop_ns``: the last bar stepped is the last one before it; ``progress(done, total)`` is
    called every :data:`PROGRESS_EVERY` bars and at the end."""
    stamps, values, first, last = _bounds(bars, start_ns, stop_ns)
    for i in range(first):
        engine.warm(int(stamps[i]), *values[i])
    engine.reset_members()
    names = [m.name for m in engine.members]
    count = last - first
    positions = {name: np.zeros(count, np.int8) for name in [*names, ENSEMBLE]}
    signals = {m.name: np.full(count, np.nan) for m in engine.members if m.forecasts}
    member_ns = {name: np.zeros(count, np.int64) for name in names}
    total_ns = np.zeros(count, np.int64)
    warm_bars = 0
    rows = values[first:last].tolist()  # plain floats: the engine's per-bar work, not numpy scalars
    for j, (ts, row) in enumerate(zip(stamps[first:last].tolist(), rows)):
        if progress is not None and j % PROGRESS_EVERY == 0:
            progress(j, count)
        result = engine.step(ts, *row)
        total_ns[j] = result.total_ns
        if not result.warm:
            warm_bars += 1
            continue
        positions[ENSEMBLE][j] = result.position
        for name, decision in result.decisions.items():
            positions[name][j] = decision.position
            member_ns[name][j] = result.member_ns[name]
            if name in signals and decision.signal is not None:
                signals[name][j] = decision.signal
    if progress is not None:
        progress(count, count)
    raw = bars[RAW_CLOSE].to_numpy(np.float64) if RAW_CLOSE in bars else values[:, 3]
    return ReplayResult(
        timestamps=stamps[first:last].astype("datetime64[ns]"),
        close=raw[first:last].copy(),
        roll_price=bars[ROLL_PRICE].to_numpy(np.float64)[first:last].copy() if ROLL_PRICE in bars else None,
        positions=positions,
        signals=signals,
        member_ns=member_ns,
        total_ns=total_ns,
        warm_bars=warm_bars,
    )


def _bounds(bars: pd.DataFrame, start_ns: int | None, stop_ns: int | None) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The bars' starts (ns) and OHLCV values, and the first and past-the-last bar stepped."""
    stamps = bars.index.as_unit("ns").asi8
    values = bars[["open", "high", "low", "close", "volume"]].to_numpy(dtype=np.float64)
    first = 0 if start_ns is None else int(np.searchsorted(stamps, start_ns, side="left"))
    last = len(stamps) if stop_ns is None else int(np.searchsorted(stamps, stop_ns, side="left"))
    return stamps, values, first, last


def replayed_windows(inputs: MemberInputs, asset, bars: pd.DataFrame, seq_len: int, horizon: int,
                     start_ns: int | None = None, stop_ns: int | None = None, limit: int | None = None,
                     origin: str = "replay") -> tuple[dict[str, np.ndarray], int]:  # fmt: skip
    """The input windows a forecaster member with ``inputs`` read in :func:`replay_bars` of the
    same ``bars``, ``start_ns`` and ``stop_ns``, recomputed afterwards, so the replay itself
    (its per-bar step, its timings) is untouched: the bars go once more through a feature
    pipeline of the member's own settings (:class:`~foxhunt.data.streaming.StreamingFeatures`,
    O(1) per bar, no model), normalized with its train statistics as the engine does, and a
    window ends at every bar the member decided on (``seq_len`` bars stepped since its reset at
    the first bar), its future the calendar of the ``horizon`` minutes after that bar.

    Returns the windows (``static`` (N, S), ``known`` (N, seq_len + horizon, K), ``observed``
    (N, seq_len, O) float32, as a datamodule's ``input_windows``; ``bar_index`` (N,): each
    window's last bar as an index into the replay's :class:`ReplayResult`), at most ``limit``
    of them spread evenly over the replay, and how many there were in all."""
    calendar = KnownCalendar(asset, FeatureConfig.from_config(inputs.feature_config))
    pipeline = StreamingFeatures(asset, inputs.feature_config, origin, calendar)
    stamps, values, first, last = _bounds(bars, start_ns, stop_ns)
    for i in range(first):
        pipeline.update(int(stamps[i]), *values[i].tolist())
    raw, steps = [], []  # the rows the member was stepped on, and their index in the replay
    for j, (ts, row) in enumerate(zip(stamps[first:last].tolist(), values[first:last].tolist())):
        features = pipeline.update(ts, *row)
        if features is not None:
            raw.append(features)
            steps.append(j)
    total = max(len(raw) - seq_len + 1, 0)
    groups = {g: np.asarray(v) for g, v in inputs.groups.items()}
    width = sum(len(v) for v in groups.values())
    offset, scale = inputs.normalizer()
    rows = ((np.stack(raw) - offset) / scale).astype(np.float32) if raw else np.zeros((0, width), np.float32)
    ends = spaced_indices(total, limit) + seq_len - 1  # each window's last row
    past = ends[:, None] + np.arange(-seq_len + 1, 1)
    ts_of = stamps[first:last]
    future = [calendar.future(int(ts_of[steps[k]]), horizon) for k in ends.tolist()]
    known = rows[:, groups["known"]]
    windows = {
        "static": rows[ends][:, groups["static"]],
        "known": np.concatenate(
            [known[past], np.stack(future) if future else np.zeros((0, horizon, len(groups["known"])), np.float32)], axis=1
        ),
        "observed": rows[:, groups["observed"]][past],
        "bar_index": np.asarray(steps, np.int64)[ends] if len(ends) else np.zeros(0, np.int64),
    }
    return windows, total


def score_replay(replayed: ReplayResult, asset, commission_usd: float, slippage_ticks: float,
                 bars_per_year: float) -> dict[str, BacktestResult]:  # fmt: skip
    """The shared backtest of every member's and the ensemble's positions (name -> result)."""
    return {
        name: backtest(
            positions,
            replayed.close,
            replayed.timestamps,
            asset,
            commission_usd=commission_usd,
            slippage_ticks=slippage_ticks,
            bars_per_year=bars_per_year,
            roll_price=replayed.roll_price,
        )  # fmt: skip
        for name, positions in replayed.positions.items()
    }


def latency_us(ns: np.ndarray, skip: int = 0) -> dict[str, float]:
    """p50 / p99 / mean in microseconds of per-bar step times (``skip``: leading bars left out,
    the warm-up's), measured by time.perf_counter_ns around each step."""
    values = ns[skip:][ns[skip:] > 0] / 1e3
    if values.size == 0:
        return {"p50": float("nan"), "p99": float("nan"), "mean": float("nan"), "bars": 0}
    return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99)),
            "mean": float(values.mean()), "bars": int(values.size)}  # fmt: skip
