"""Device memory budgets (``conf/budget/*.yaml``) and the check of measured figures against them.

A budget is a card (or host RAM) the run must fit on: its total memory and the headroom that
must stay free (display, other processes, fragmentation). The run must also stay within its
model's own target (``model.memory_target_mb``). Two measured figures are checked
(:func:`find_breaches`): the run's peak training memory against the target, and its peak
footprint on the budgeted memory against ``available_mb = total_mb - headroom_mb``.
All figures are MB = MiB (1,048,576 bytes), as nvidia-smi reports them.
"""

from __future__ import annotations

from dataclasses import dataclass

BUDGET_KINDS = ("gpu", "cpu")


@dataclass(frozen=True)
class MemoryBudget:
    """``name``: the card; ``total_mb``: its memory; ``headroom_mb``: what must stay free;
    ``kind``: ``gpu`` (a card's device memory) or ``cpu`` (host RAM, compared with the
    process's resident set)."""

    name: str
    total_mb: float
    headroom_mb: float
    kind: str = "gpu"

    def __post_init__(self) -> None:
        where = f"budget {self.name!r}"
        if self.kind not in BUDGET_KINDS:
            raise ValueError(f"{where}: kind={self.kind!r} must be one of {', '.join(BUDGET_KINDS)}")
        if not self.total_mb > 0:
            raise ValueError(f"{where}: total_mb={self.total_mb!r} must be > 0")
        if not 0 <= self.headroom_mb < self.total_mb:
            raise ValueError(f"{where}: headroom_mb={self.headroom_mb!r} must be >= 0 and below total_mb={self.total_mb!r}")

    @property
    def available_mb(self) -> float:
        """Memory the run may use: total minus the required headroom."""
        return float(self.total_mb) - float(self.headroom_mb)

    def headroom_left_mb(self, used_mb: float) -> float:
        """What stays free on the budgeted memory when the run uses ``used_mb``."""
        return float(self.total_mb) - used_mb


@dataclass(frozen=True)
class Breach:
    """One measured figure above its limit."""

    limit: str  # "target" (the model's) or "budget" (the card's available memory)
    measured_mb: float
    limit_mb: float
    figure: str  # how the measured figure was measured
    bound: str  # what the limit is

    def message(self, step: int) -> str:
        return (
            f"memory {self.limit} exceeded at step {step}: {self.measured_mb:.2f} MB "
            f"({self.figure}) > {self.limit_mb:.2f} MB ({self.bound})"
        )


def find_breaches(
    peak_mb: float,
    peak_figure: str,
    device_peak_mb: float,
    device_figure: str,
    budget: MemoryBudget | None,
    target_mb: float | None,
) -> list[Breach]:
    """Breaches of the model's target (by ``peak_mb``) and of the budget's available memory
    (by ``device_peak_mb``); a limit that is ``None`` is not checked."""
    breaches: list[Breach] = []
    if target_mb is not None and peak_mb > target_mb:
        breaches.append(Breach("target", peak_mb, float(target_mb), peak_figure, "model.memory_target_mb"))
    if budget is not None and device_peak_mb > budget.available_mb:
        bound = f"budget {budget.name}: {budget.total_mb:g} MB total - {budget.headroom_mb:g} MB headroom"
        breaches.append(Breach("budget", device_peak_mb, budget.available_mb, device_figure, bound))
    return breaches
