"""The streaming engine: one 1-minute bar in, every member's decision and the ensemble's out.

For each bar the engine checks it and updates the features once per distinct feature
configuration (:class:`foxhunt.data.streaming.StreamingFeatures`, O(1) per bar), normalizes them
with each member's own train statistics, steps every member (:mod:`foxhunt.ensemble.members`)
and combines their decisions (:mod:`foxhunt.ensemble.rules`). It times each member's step and
the whole bar with ``time.perf_counter_ns``.

Until the trailing feature windows are full (``features.warmup_bars`` bars) no member is
stepped and every position is flat. :meth:`StreamingEngine.warm` reads a bar into the features
only: a stream can be primed with the history before the bars it is scored on (a replay of a
split starts its members at the split's first bar, as the batch path does).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from foxhunt.data.streaming import StreamingFeatures, normalize, normalizer
from foxhunt.ensemble.members import BarInputs, Decision, Member
from foxhunt.ensemble.rules import combine


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
    """One bar's answer: each member's decision and the ensemble's position (``None`` while the
    features warm up), and the step time of each member and of the whole bar (ns)."""

    ts_ns: int
    decisions: dict[str, Decision]
    position: int
    member_ns: dict[str, int] = field(default_factory=dict)
    total_ns: int = 0

    @property
    def warm(self) -> bool:
        return bool(self.decisions)


class StreamingEngine:
    """Members of one asset on one bar stream (see the module doc)."""

    def __init__(self, members: list[Member], inputs: dict[str, MemberInputs], asset, rule: str,
                 weights: dict[str, float] | None = None, forecast_threshold: float = 0.0,
                 origin: str = "bar stream") -> None:  # fmt: skip
        self.members = members
        self.inputs = inputs
        self.asset = asset
        self.rule = rule
        self.weights = weights
        self.forecast_threshold = forecast_threshold
        self.origin = origin
        self._pipelines: dict[object, StreamingFeatures] = {}
        self._member_pipeline: dict[str, StreamingFeatures] = {}
        self._normalizers = {m.name: inputs[m.name].normalizer() for m in members}
        for member in members:
            config = inputs[member.name].feature_config
            pipeline = self._pipelines.get(config)
            if pipeline is None:
                pipeline = self._pipelines[config] = StreamingFeatures(asset, config, origin)
            self._member_pipeline[member.name] = pipeline

    def reset_members(self) -> None:
        """Every member starts a new stream at the next bar (the features keep their windows)."""
        for member in self.members:
            member.reset()

    def _features(self, ts_ns: int, bar: tuple[float, float, float, float, float]) -> dict[object, np.ndarray | None]:
        pipelines = list(self._pipelines.values())
        for pipeline in pipelines:  # every check before any state changes: a bad bar changes nothing
            pipeline.check(ts_ns, *bar)
        return {config: pipeline.update(ts_ns, *bar, checked=True) for config, pipeline in self._pipelines.items()}

    def warm(self, ts_ns: int, open_: float, high: float, low: float, close: float, volume: float) -> None:
        """Read a bar into the features only (no member is stepped)."""
        self._features(ts_ns, (open_, high, low, close, volume))

    def step(self, ts_ns: int, open_: float, high: float, low: float, close: float, volume: float) -> BarResult:
        """Check and read one bar; every member's decision and the ensemble's position."""
        started = time.perf_counter_ns()
        raw = self._features(ts_ns, (open_, high, low, close, volume))
        decisions: dict[str, Decision] = {}
        timings: dict[str, int] = {}
        for member in self.members:
            row = raw[self.inputs[member.name].feature_config]
            if row is None:
                continue
            calendar = self._member_pipeline[member.name].calendar
            begun = time.perf_counter_ns()
            inputs = BarInputs(
                row=normalize(row, *self._normalizers[member.name]),
                ts_ns=ts_ns,
                future=lambda horizon, c=calendar: c.future(ts_ns, horizon),
            )
            decisions[member.name] = member.step(inputs)
            timings[member.name] = time.perf_counter_ns() - begun
        position = combine(self.rule, decisions, self.weights, self.forecast_threshold) if decisions else 0
        return BarResult(ts_ns, decisions, position, timings, time.perf_counter_ns() - started)
