"""The card: the models trained on one device, against its budget. Every model within its own
target, and all of them resident at once (trained concurrently on one device) leaving the
budget's required headroom free.

``foxhunt memory validate`` measures each model (:func:`foxhunt.memory.training_run.measure_run`)
and hands the measurements to :func:`judge`; the report is :mod:`foxhunt.memory.card_report`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from foxhunt.memory.accounting import to_mb
from foxhunt.memory.budget import MemoryBudget
from foxhunt.memory.training_run import RunMeasurement

ASSUMPTION = "all models resident at once (trained concurrently on one device)"


@dataclass(frozen=True)
class ModelVerdict:
    """One model's measured footprint against its target and the budget (and, with
    ``--predict``, the prediction made before the measurement)."""

    measurement: RunMeasurement
    budget: MemoryBudget
    prediction: Any = None  # foxhunt.memory.predict.Prediction

    @property
    def name(self) -> str:
        return self.measurement.model

    @property
    def footprint_mb(self) -> float:
        return self.measurement.footprint_mb

    @property
    def target_mb(self) -> float | None:
        return self.measurement.target_mb

    @property
    def pct_of_budget(self) -> float:
        """Footprint as a share of the budget's total memory (%)."""
        return 100.0 * self.footprint_mb / float(self.budget.total_mb)

    @property
    def pct_of_target(self) -> float | None:
        return None if not self.target_mb else 100.0 * self.footprint_mb / self.target_mb

    @property
    def passed(self) -> bool:
        return self.target_mb is None or self.footprint_mb <= self.target_mb

    def failure(self) -> str | None:
        if self.passed:
            return None
        return f"{self.name} {self.footprint_mb:.2f} MB > its target {self.target_mb:g} MB (model.memory_target_mb)"


@dataclass(frozen=True)
class CardVerdict:
    """The card against the budget: every model within its target, and the sum of their
    footprints (:data:`ASSUMPTION`) leaving at least the budget's required headroom."""

    budget: MemoryBudget
    models: tuple[ModelVerdict, ...]
    precision: str
    device: str
    data: str
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def total_bytes(self) -> int:
        return sum(m.measurement.footprint.bytes or 0 for m in self.models)

    @property
    def total_mb(self) -> float:
        return to_mb(self.total_bytes)

    @property
    def headroom_left_mb(self) -> float:
        """What stays free on the budget with every model resident at once."""
        return self.budget.headroom_left_mb(self.total_mb)

    @property
    def required_headroom_mb(self) -> float:
        return float(self.budget.headroom_mb)

    @property
    def headroom_ok(self) -> bool:
        return self.headroom_left_mb >= self.required_headroom_mb

    @property
    def pct_of_budget(self) -> float:
        return 100.0 * self.total_mb / float(self.budget.total_mb)

    @property
    def passed(self) -> bool:
        return self.headroom_ok and all(m.passed for m in self.models)

    def failures(self) -> list[str]:
        lines = [line for line in (m.failure() for m in self.models) if line]
        if not self.headroom_ok:
            budget = self.budget
            lines.append(
                f"the ensemble's {self.total_mb:.2f} MB leaves {self.headroom_left_mb:.2f} MB of budget "
                f"{budget.name}'s {budget.total_mb:g} MB, below the required {budget.headroom_mb:g} MB headroom"
            )
        return lines

    def summary_line(self) -> str:
        """The one line a user reads first: PASS, or FAIL and every reason."""
        budget = self.budget
        if self.passed:
            return (
                f"PASS: every model within its target; the ensemble's {self.total_mb:.2f} MB leaves "
                f"{self.headroom_left_mb:.2f} MB of budget {budget.name}'s {budget.total_mb:g} MB "
                f"(>= {budget.headroom_mb:g} MB required headroom)"
            )
        return "FAIL: " + "; ".join(self.failures())


def judge(
    measurements: Iterable[RunMeasurement],
    budget: MemoryBudget,
    *,
    data: str = "",
    predictions: Mapping[str, Any] | None = None,
    notes: Sequence[str] = (),
) -> CardVerdict:
    """The verdict on measured models (in the order given) against ``budget``."""
    measurements = list(measurements)
    if not measurements:
        raise ValueError("judge: no model was measured")
    predictions = predictions or {}
    models = tuple(ModelVerdict(m, budget, predictions.get(m.model)) for m in measurements)
    precisions = sorted({m.precision for m in measurements})
    devices = sorted({m.device for m in measurements})
    notes = [*notes, *device_notes(budget, devices)]
    return CardVerdict(
        budget=budget,
        models=models,
        precision="+".join(precisions),
        device=",".join(devices),
        data=data,
        notes=tuple(notes),
    )


def device_notes(budget: MemoryBudget, devices: Iterable[str]) -> list[str]:
    """What the figures leave out when the device measured is not the budget's."""
    notes = []
    on_cpu = all(not device.startswith("cuda") for device in devices)
    if budget.kind == "gpu" and on_cpu:
        notes.append(
            f"measured on the CPU against GPU budget {budget.name}: the footprints are the run's tensors, the bytes the "
            "CUDA allocator would hand out for them; the CUDA context and the allocator's cache come on top on the "
            "card (measured by NVML when this command runs on a CUDA device), which the required headroom covers"
        )
    if budget.kind == "cpu":
        notes.append(
            f"budget {budget.name} is host memory: the ensemble of the runs' tensors is checked against it, not the "
            "process RSS (Python, torch, data) that a training run's memory callback compares with it"
        )
    return notes
