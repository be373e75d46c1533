"""Timing primitives of the benchmark: interleaved repeats, paired ratios, threads, machine.

A shared machine's speed drifts between runs by tens of percent and other processes share its
cores, so a figure alone means little (docs/benchmarks.md gives each run's load). Every
comparison therefore runs its two sides alternately (A, B, A, B, ...), each repeat timed by wall
clock and by the process's CPU time, and reports the median of the per-pair ratios: a slow
spell hits both members of a pair. With one thread the CPU-time ratio is also robust to other
processes taking the core (the process is descheduled, its CPU clock stops), which the
wall-clock ratio is not.

How far a median of paired ratios can be trusted is measured too: :func:`paired_ratios` gives the
distribution-free confidence interval of the median (the order statistics of the pairs, by
scipy's ``quantile_test``; no assumption about how the noise is distributed), so a report can
say whether a goal is met past the run-to-run noise or only at it (:class:`~foxhunt.bench.report.Row`).
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import lightning
import psutil
import scipy.stats
import torch
from lightning.pytorch.callbacks import Callback


@dataclass
class Timing:
    """``work`` units (env steps, samples, epochs...) done in ``wall_s`` seconds of wall clock
    and ``cpu_s`` seconds of the process's CPU time."""

    work: float
    wall_s: float
    cpu_s: float
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.work / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def cpu_rate(self) -> float:
        return self.work / self.cpu_s if self.cpu_s > 0 else float("nan")

    def to_dict(self) -> dict:
        return {**asdict(self), "rate": self.rate, "cpu_rate": self.cpu_rate}


class Clock:
    """Wall and CPU time between :meth:`start` and :meth:`stop`. On a CUDA device (``device``
    "cuda") each reading first waits for the work queued on it: kernels run asynchronously, so
    without it the clock would time their launches."""

    def __init__(self, device: str = "cpu") -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self._start: tuple[float, float] | None = None
        self._synchronize = torch.cuda.synchronize if device == "cuda" else None

    def start(self) -> None:
        if self._synchronize is not None:
            self._synchronize()
        self._start = (time.perf_counter(), time.process_time())

    def stop(self) -> None:
        if self._start is None:
            raise RuntimeError("Clock.stop before Clock.start")
        if self._synchronize is not None:
            self._synchronize()
        wall, cpu = self._start
        self.wall_s += time.perf_counter() - wall
        self.cpu_s += time.process_time() - cpu
        self._start = None

    def timing(self, work: float, **extra: float) -> Timing:
        return Timing(work=work, wall_s=self.wall_s, cpu_s=self.cpu_s, extra=dict(extra))


def train_batch_timer(warmup: int, device: str = "cpu"):
    """A Lightning callback whose ``clock`` times the training batches from index ``warmup`` to
    the last one (``timed`` counts them) on ``device``: the timed window of a benchmark fit."""

    class TrainBatchTimer(Callback):
        def __init__(self) -> None:
            self.clock = Clock(device)
            self.timed = 0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if batch_idx == warmup:
                self.clock.start()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx >= warmup:
                self.timed += 1
            if batch_idx + 1 == trainer.num_training_batches and self.timed:
                self.clock.stop()

    return TrainBatchTimer()


def first_step_timer():
    """A Lightning callback whose ``seconds`` is the wall time of the fit's first training batch
    (a compiled step's compile time included)."""

    class FirstStepTimer(Callback):
        def __init__(self) -> None:
            self.seconds = float("nan")
            self._started = 0.0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if batch_idx == 0:
                self._started = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx == 0:
                self.seconds = time.perf_counter() - self._started

    return FirstStepTimer()


def interleaved(runners: Mapping[str, Callable[[], Timing]], repeats: int) -> dict[str, list[Timing]]:
    """Run every runner once per repeat, in order, ``repeats`` times (A, B, A, B, ...)."""
    results: dict[str, list[Timing]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, runner in runners.items():
            results[name].append(runner())
    return results


def median(values: list[float]) -> float:
    finite = [v for v in values if v == v]
    return statistics.median(finite) if finite else float("nan")


def paired_ratio(numerators: list[float], denominators: list[float]) -> float:
    """Median of ``numerators[i] / denominators[i]`` over the repeats."""
    return median(_ratios(numerators, denominators))


def _ratios(numerators: list[float], denominators: list[float]) -> list[float]:
    return [a / b for a, b in zip(numerators, denominators) if b and a == a and b == b]


@dataclass(frozen=True)
class PairedRatio:
    """The median of ``pairs`` paired ratios and its two-sided ``confidence`` interval
    ``[low, high]`` (NaN at both ends where the pairs are too few for that confidence: a
    distribution-free interval needs 5 pairs at 90%)."""

    median: float
    low: float
    high: float
    confidence: float
    pairs: int


def paired_ratios(numerators: list[float], denominators: list[float], confidence: float) -> PairedRatio:
    """:func:`paired_ratio` with the distribution-free ``confidence`` interval of its median:
    order statistics of the ratios chosen by the binomial distribution (scipy.stats.quantile_test),
    valid whatever the noise's distribution as long as the pairs are independent draws of it."""
    ratios = _ratios(numerators, denominators)
    low = high = float("nan")
    if ratios:
        interval = scipy.stats.quantile_test(ratios, q=median(ratios), p=0.5).confidence_interval(confidence)
        low, high = float(interval.low), float(interval.high)
    return PairedRatio(median(ratios), low, high, float(confidence), len(ratios))


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``count`` inside the block."""
    previous = torch.get_num_threads()
    torch.set_num_threads(int(count))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (MiB; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def load_average() -> list[float]:
    """1, 5 and 15-minute load averages (what ``uptime`` shows)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def cpu_model() -> str:
    """The CPU's model name as ``lscpu`` prints it (``/proc/cpuinfo`` when lscpu is absent)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict:
    """What the figures were measured on."""
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
