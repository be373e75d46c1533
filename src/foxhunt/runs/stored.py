"""A run as foxhunt reads it from the store, whichever reader read it (SQLite or MlflowClient)."""

from __future__ import annotations

from dataclasses import dataclass, field

from foxhunt.runs.cell import CellKey
from foxhunt.runs.status import Status
from foxhunt.runs.tags import Tag


@dataclass(frozen=True)
class Metric:
    value: float
    step: int | None
    timestamp_ms: int | None


@dataclass
class StoredRun:
    run_id: str
    name: str
    experiment: str
    status: str
    start_ms: int
    end_ms: int | None
    tags: dict[str, str]
    metrics: dict[str, Metric]
    params: dict[str, str] = field(default_factory=dict)
    artifact_uri: str = ""
    state: str = ""  # the state shown (its status, or STALE: foxhunt.runs.liveness.run_state)

    @property
    def parent_id(self) -> str | None:
        return self.tags.get(Tag.PARENT) or None

    @property
    def job_id(self) -> str:
        return self.tags.get(Tag.JOB_ID, "")

    def metric(self, key: str) -> float | None:
        metric = self.metrics.get(key)
        return None if metric is None else metric.value

    def metric_values(self) -> dict[str, float]:
        return {key: metric.value for key, metric in self.metrics.items()}

    def last_seen_ms(self) -> int:
        """The last time the run wrote anything we read (its end, else its newest metric)."""
        stamps = [m.timestamp_ms for m in self.metrics.values() if m.timestamp_ms]
        return self.end_ms or max([self.start_ms, *stamps])

    def duration_s(self, now_ms: int) -> float:
        end = self.end_ms if self.end_ms else (self.last_seen_ms() if self.state == Status.STALE else now_ms)
        return max(0.0, (end - self.start_ms) / 1000)

    def cell_key(self) -> CellKey:
        return CellKey.from_tags(self.tags)
