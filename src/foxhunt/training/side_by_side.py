"""Two Lightning fits side by side in one process, and batch-1 latency of two models alternating:
the measurement harness of ``foxhunt memory compare`` (fp32 against int8,
:mod:`foxhunt.training.memory_compare`). It lives with the training room because it fits real
runs; the benchmark sections, above it, may use it.

- :class:`Turns`: two threads take turns step by step, so the two fits alternate and share the
  machine's state (a busy neighbour slows both alike); a finished (or failed) one never blocks
  the other;
- :class:`StepTimer`: a callback that takes its turn around every training step, reseeds the
  global RNG identically before each (both fits see the same batches, dropout masks and
  samples), times the steps that ran an optimizer step (wall clock from
  ``on_train_batch_start`` to ``on_train_batch_end``, CUDA synchronized) after ``warmup`` such
  steps, and stops its fit after ``steps`` timed ones;
- :func:`fit_side_by_side`: the two fits in two threads, errors reported to the caller;
- :func:`alternating_latency`: p50 and p99 of batch-1 calls, the models alternating call by
  call (:func:`measure` with one call per block);
- :func:`measure` and :func:`time_calls`: per-call wall-clock and process-CPU latencies of
  several calls timed in alternating blocks, so a slow spell of the machine hits them all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

import lightning.pytorch as pl
import numpy as np
import torch

LATENCY_PERCENTILES = (50, 99)
_NO_TIME_LIMIT_S = 1e12  # the latency loop's per-call time limit, when the caller fixes the count


class Turns:
    """Two threads take turns step by step; a finished (or failed) one never blocks the other."""

    def __init__(self, order: tuple[str, ...]) -> None:
        self._cond = threading.Condition()
        self._order = order
        self._turn = order[0]
        self._holding: dict[str, bool] = dict.fromkeys(order, False)
        self._done: set[str] = set()

    def acquire(self, name: str) -> None:
        with self._cond:
            if self._holding[name]:
                return
            self._cond.wait_for(lambda: self._turn == name or self._other(name) in self._done)
            self._holding[name] = True

    def release(self, name: str) -> None:
        with self._cond:
            if not self._holding[name]:
                return
            self._holding[name] = False
            self._turn = self._other(name)
            self._cond.notify_all()

    def finish(self, name: str) -> None:
        with self._cond:
            self._done.add(name)
            self._holding[name] = False
            self._turn = self._other(name)
            self._cond.notify_all()

    def _other(self, name: str) -> str:
        return next(n for n in self._order if n != name)


class StepTimer(pl.Callback):
    """Times the steps that ran an optimizer step; takes turns with the other fit; reseeds the
    global RNG identically before every step; stops the fit after warm-up + steps."""

    def __init__(self, name: str, turns: Turns, seed: int, warmup: int, steps: int) -> None:
        self.name, self.turns, self.seed = name, turns, seed
        self.warmup, self.steps = warmup, steps
        self.durations: list[float] = []
        self.updates = 0
        self.batches = 0
        self._stepped = False
        self._started = 0.0

    @staticmethod
    def _sync(pl_module) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":  # data iterators are created before the first batch: in our turn
            self.turns.acquire(self.name)
            torch.manual_seed(self.seed)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self.turns.acquire(self.name)
        torch.manual_seed(self.seed + self.batches)
        self._stepped = False
        self._sync(pl_module)
        self._started = time.perf_counter()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._stepped = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self._sync(pl_module)
        elapsed = time.perf_counter() - self._started
        self.batches += 1
        if self._stepped:
            self.updates += 1
            if self.updates > self.warmup:
                self.durations.append(elapsed)
        if len(self.durations) >= self.steps:
            trainer.should_stop = True
        self.turns.release(self.name)

    def on_train_end(self, trainer, pl_module) -> None:
        self.turns.finish(self.name)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.turns.finish(self.name)


def fit_side_by_side(fits: Mapping[str, Callable[[], None]]) -> dict[str, BaseException]:
    """Run each fit in a thread of its own (their StepTimers take turns); the errors, by name."""
    errors: dict[str, BaseException] = {}

    def run(name: str, fit: Callable[[], None]) -> None:
        try:
            fit()
        except BaseException as exc:  # reported in the calling thread
            errors[name] = exc

    threads = [threading.Thread(target=run, args=item, name=f"side-by-side-{item[0]}") for item in fits.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def percentile(values: list[float] | np.ndarray, q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def alternating_latency(
    calls: Mapping[str, Callable[[], object]], iterations: int, warmup: int
) -> dict[str, tuple[float, float]]:
    """(p50, p99) milliseconds of each batch-1 call, the calls alternating call by call."""
    synced = {name: _synchronized(call) for name, call in calls.items()}
    timed = measure(synced, warmup, iterations, blocks=iterations, max_seconds=_NO_TIME_LIMIT_S)
    low, high = LATENCY_PERCENTILES
    return {name: (percentile(wall, low) / 1e3, percentile(wall, high) / 1e3) for name, (wall, _) in timed.items()}


def time_calls(call: Callable[[], object], iterations: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-call wall-clock and process-CPU latencies, in microseconds."""
    wall = np.empty(iterations)
    cpu = np.empty(iterations)
    for i in range(iterations):
        start_cpu = time.process_time_ns()
        start = time.perf_counter_ns()
        call()
        wall[i] = (time.perf_counter_ns() - start) / 1e3
        cpu[i] = (time.process_time_ns() - start_cpu) / 1e3
    return wall, cpu


def measure(
    calls: dict[str, Callable[[], object]], warmup: int, iterations: int, blocks: int, max_seconds: float
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(wall, cpu) latencies of each call in ``blocks`` alternating blocks: ``iterations`` in
    all, fewer when the warm-up says they would take more than ``max_seconds`` per call."""
    with torch.inference_mode():
        slowest = 0.0
        for call in calls.values():
            start = time.perf_counter()
            for _ in range(warmup):
                call()
            slowest = max(slowest, (time.perf_counter() - start) / max(warmup, 1))
        if slowest > 0:
            iterations = max(blocks, min(iterations, int(max_seconds / slowest)))
        per_block = max(1, iterations // blocks)
        samples: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {name: [] for name in calls}
        for _ in range(blocks):
            for name, call in calls.items():
                samples[name].append(time_calls(call, per_block))
    return {
        name: (np.concatenate([w for w, _ in parts]), np.concatenate([c for _, c in parts])) for name, parts in samples.items()
    }


def _synchronized(call: Callable[[], object]) -> Callable[[], object]:
    """``call`` that returns once the device finished it (a no-op on CPU)."""
    if not torch.cuda.is_available():
        return call

    def run() -> object:
        out = call()
        torch.cuda.synchronize()
        return out

    return run
