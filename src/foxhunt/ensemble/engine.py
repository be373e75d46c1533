"""The streaming engine: bars in, every member's decision and the ensemble's out, for one stream
or many at once.

A **stream** (:class:`Stream`) is one symbol's bar sequence: its feature pipelines (one per
distinct feature configuration of the members, :class:`foxhunt.data.streaming.StreamingFeatures`,
O(1) per bar) and one slot in each member's state pool. :meth:`StreamingEngine.step_many` takes
one bar of each of several streams (a minute of a desk's instruments, the concurrent requests of
the server): it checks every bar (a bad one is answered with its error, the others go on),
updates each stream's features, normalizes them with each member's own train statistics, steps
every member once for all the streams that are warm (one batched call per member), and combines
each stream's decisions (:mod:`foxhunt.ensemble.rules`). :meth:`StreamingEngine.step` is the
one-stream case, on the engine's own default stream. The engine times each member's call and
the whole bar with ``time.perf_counter_ns`` (a batched call's time is each of its bars').

Until a stream's trailing feature windows are full (``features.warmup_bars`` bars) no member is
stepped for it and its position is flat. :meth:`StreamingEngine.warm` reads a bar into the
features only: a stream can be primed with the history before the bars it is scored on (a
replay of a split starts its members at the split's first bar, as the batch path does).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from foxhunt.data.errors import BarDataError
from foxhunt.data.features import FeatureConfig
from foxhunt.data.streaming import KnownCalendar, StreamingFeatures, normalizer
from foxhunt.ensemble.members import Decision, Member
from foxhunt.ensemble.rules import combine

Bar = tuple[int, float, float, float, float, float]  # (ts_ns, open, high, low, close, volume)


@dataclass(frozen=True)
class MemberInputs:
    """How a member's inputs are made: its feature config (a FeatureConfig), its train
    statistics of the observed group, and the column groups."""

    feature_config: object
    observed_mean: np.ndarray
    observed_std: np.ndarray
    groups: dict[str, list[int]]

    def normalizer(self) -> tuple[np.ndarray, np.ndarray]:
        width = sum(len(columns) for columns in self.groups.values())
        return normalizer(width, self.groups["observed"], self.observed_mean, self.observed_std)


@dataclass(frozen=True)
class BarResult:
    """One bar's answer: each member's decision and the ensemble's position (no decisions while
    the features warm up), and the step time of each member and of the whole bar (ns)."""

    ts_ns: int
    decisions: dict[str, Decision]
    position: int
    member_ns: dict[str, int] = field(default_factory=dict)
    total_ns: int = 0

    @property
    def warm(self) -> bool:
        return bool(self.decisions)


@dataclass
class Stream:
    """One symbol's stream: its feature pipelines and its slot in every member's pool."""

    symbol: str
    pipelines: dict[object, StreamingFeatures]
    slots: dict[str, int]
    last_bar_ns: int | None = None  # the start of the last bar it read (UTC ns)
    seen_monotonic: float = 0.0  # time.monotonic() of its last bar (idle eviction)
    features_warm: bool = False  # its feature windows have filled: a bar of it reached the members
    #: the latest bars a SwappableEngine keeps for a member swapped in (foxhunt.ensemble.loading._Recent)
    recent: Any = field(default=None, repr=False, compare=False)


class StreamingEngine:
    """Members of one asset on any number of streams (see the module doc)."""

    def __init__(self, members: list[Member], inputs: dict, asset, rule: str,
                 weights: dict[str, float] | None = None, forecast_threshold: float = 0.0,
                 origin: str = "bar stream") -> None:  # fmt: skip
        self.members = members
        self.inputs = inputs
        self.asset = asset
        self.rule = rule
        self.weights = weights
        self.forecast_threshold = forecast_threshold
        self.origin = origin
        self._configs = list(dict.fromkeys(inputs[m.name].feature_config for m in members))
        self._calendars = {c: KnownCalendar(asset, FeatureConfig.from_config(c)) for c in self._configs}  # shared by the streams
        self._member_config = {m.name: inputs[m.name].feature_config for m in members}
        self._normalizers = {m.name: inputs[m.name].normalizer() for m in members}
        self.default = self.open_stream(origin)

    # -- streams -------------------------------------------------------------------------
    def open_stream(self, symbol: str) -> Stream:
        """A new stream: fresh feature windows, a zero-state slot in every member."""
        origin = symbol if symbol == self.origin else f"{self.origin} {symbol}"
        return Stream(symbol, {c: StreamingFeatures(self.asset, c, origin, self._calendars[c]) for c in self._configs},
                      {m.name: m.new_slot() for m in self.members}, seen_monotonic=time.monotonic())  # fmt: skip

    def close_stream(self, stream: Stream) -> None:
        """Give the stream's slots back (its state is gone)."""
        for member in self.members:
            member.free_slot(stream.slots[member.name])

    def reset_members(self, stream: Stream | None = None) -> None:
        """Every member starts the stream anew at its next bar (the features keep their windows)."""
        stream = stream or self.default
        for member in self.members:
            member.reset(stream.slots[member.name])

    def stream_bytes(self) -> int:
        """Bytes one stream holds: every member's slot and the feature windows (measured on the
        default stream: ``nbytes`` of its arrays, the deques' float entries)."""
        return sum(m.state_bytes() for m in self.members) + sum(p.state_bytes() for p in self.default.pipelines.values())

    # -- bars ----------------------------------------------------------------------------
    def check(self, stream: Stream, bar: Bar) -> None:
        """Raise the bar's BarDataError when it cannot be read into ``stream`` (nothing changes)."""
        for pipeline in stream.pipelines.values():
            pipeline.check(*bar)

    def warm(self, ts_ns: int, open_: float, high: float, low: float, close: float, volume: float,
             stream: Stream | None = None) -> None:  # fmt: skip
        """Read a bar into the features only (no member is stepped)."""
        stream = stream or self.default
        bar = (ts_ns, open_, high, low, close, volume)
        self.check(stream, bar)
        for pipeline in stream.pipelines.values():
            pipeline.update(*bar, checked=True)

    def step(self, ts_ns: int, open_: float, high: float, low: float, close: float, volume: float) -> BarResult:
        """Check and read one bar of the default stream; every member's decision and the ensemble's."""
        result = self.step_many([(self.default, (ts_ns, open_, high, low, close, volume))])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def step_many(self, items: Sequence[tuple[Stream, Bar]]) -> list[BarResult | Exception]:
        """One bar of each of several distinct streams (module doc): per item its result, or
        the :class:`~foxhunt.data.errors.BarDataError` of a bad bar (that stream unchanged)."""
        started = time.perf_counter_ns()
        results: list[BarResult | Exception | None] = [None] * len(items)
        raw: dict[object, list[tuple[int, np.ndarray]]] = {c: [] for c in self._configs}
        now = time.monotonic()
        for i, (stream, bar) in enumerate(items):
            try:
                self.check(stream, bar)
            except BarDataError as exc:
                results[i] = exc
                continue
            stream.last_bar_ns, stream.seen_monotonic = bar[0], now
            for config, pipeline in stream.pipelines.items():
                row = pipeline.update(*bar, checked=True)
                if row is not None:
                    raw[config].append((i, row))
                    stream.features_warm = True
        decisions: dict[int, dict[str, Decision]] = {}
        timings: dict[str, int] = {}
        for member in self.members:
            ready = raw[self._member_config[member.name]]
            if not ready:
                continue
            index = [i for i, _ in ready]
            offset, scale = self._normalizers[member.name]
            rows = ((np.stack([row for _, row in ready]) - offset) / scale).astype(np.float32)  # as normalize()
            slots = np.fromiter((items[i][0].slots[member.name] for i in index), np.int64, len(index))
            ts = np.fromiter((items[i][1][0] for i in index), np.int64, len(index))
            calendars = [items[i][0].pipelines[self._member_config[member.name]].calendar for i in index]
            begun = time.perf_counter_ns()
            answers = member.step(rows, slots, ts, lambda k, horizon: calendars[k].future(int(ts[k]), horizon))
            timings[member.name] = time.perf_counter_ns() - begun
            for i, decision in zip(index, answers):
                decisions.setdefault(i, {})[member.name] = decision
        total = time.perf_counter_ns() - started
        for i, (_, bar) in enumerate(items):
            if results[i] is not None:
                continue
            mine = decisions.get(i, {})
            position = combine(self.rule, mine, self.weights, self.forecast_threshold) if mine else 0
            results[i] = BarResult(bar[0], mine, position, {n: timings[n] for n in mine}, total)
        return results  # type: ignore[return-value]  # each item got its result or its error above: no None is left
