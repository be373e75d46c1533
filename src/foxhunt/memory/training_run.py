"""One model's training memory, measured with a real short fit: :func:`measure_run`.

The run is built by the caller, from its composed config, exactly as ``foxhunt-train`` builds
it (a :class:`RunFactory`, :class:`foxhunt.training.parts.MeasuringRuns`: this package knows no model,
job or command line). A real Lightning fit then runs: the real module, its own
``configure_optimizers``, the configured precision plugin and accelerator, the callbacks the
factory keeps (the run's own, except those that only write files or print), and
:class:`~foxhunt.memory.callback.MemoryBudgetCallback` measuring. The fit stops
:data:`MEASURE_EXTRA_STEPS` training steps after the first step that produced gradients (an
agent first fills its replay buffer), so the optimizer state exists and one forward ran while
the previous step's gradients were alive. No validation, checkpoint or logger runs. The
figures are those of the callback (:mod:`foxhunt.memory.accounting`): parameters, gradients,
optimizer state, buffers and model-owned state (a replay buffer, a rollout) as live tensors,
activations as the peak bytes saved for backward during the first step with gradients.

A model's **footprint**, the figure checked against its target and summed for the card
(:mod:`foxhunt.memory.card`):

- on CPU, the allocator's peak during the first step with gradients (what was live when it
  began plus the peak of what it allocated, :class:`foxhunt.memory.allocations.AllocationPeak`),
  which the components sum to with ``temporaries``, the backward pass's temporaries that live
  tensors and saved activations miss;
- on CUDA, ``torch.cuda.max_memory_allocated`` over the fit minus ``memory_allocated`` before
  it: every tensor the run put on the device, temporaries included (the components are
  reported beside it).

Written by hand because Lightning has no "fit until the memory is measured" mode.
"""

from __future__ import annotations

import gc
import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import lightning.pytorch as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from foxhunt.memory.accounting import MemoryBreakdown, to_mb
from foxhunt.memory.callback import MemoryBudgetCallback
from foxhunt.memory.report import MeasuredFigure

#: Training steps run after the first step with gradients: the second step is the first whose
#: forward runs with the previous step's gradients and the optimizer state alive.
MEASURE_EXTRA_STEPS = 2

CPU_FOOTPRINT_METHOD = (
    "allocator peak of the first training step: bytes live when it began plus the peak of what it allocated "
    "(AllocationPeak, a TorchDispatchMode; equal to torch's MemTracker), temporaries of the backward included; "
    "the components beside it (live parameters, gradients, optimizer state, buffers, model-owned state; "
    "activations: peak bytes saved for backward; temporaries: the rest of the peak)"
)
CUDA_FOOTPRINT_METHOD = (
    "torch.cuda.max_memory_allocated over the measuring fit minus memory_allocated before it "
    "(every tensor the run put on the device)"
)


class MeasurementError(RuntimeError):
    """A measuring fit could not measure a model (one line naming the model and why)."""


class RunFactory(Protocol):
    """What a measuring fit is built from, handed in by the entry points."""

    def parts(self, cfg: DictConfig) -> Any:
        """The run's model, datamodule and precision plugin (``foxhunt.training.parts.RunParts``)."""

    def model(self, cfg: DictConfig) -> Any:
        """The run's LightningModule alone (built on the meta device by a prediction)."""

    def callbacks(self, cfg: DictConfig) -> list:
        """The run's callbacks a measuring fit keeps: those that hold tensors or change them."""

    def batch_key(self, cfg: DictConfig) -> str | None:
        """The config key of the batch the model's activations scale with (None: unknown)."""


def config_value(cfg: DictConfig, key: str | None) -> Any:
    return None if key is None else OmegaConf.select(cfg, key)


def data_description(cfg: DictConfig) -> str:
    source = str(cfg.data.source._target_).rsplit(".", 1)[-1]
    days = cfg.data.source.get("days")
    size = f"{days} calendar days" if days is not None else "as configured"
    return (
        f"{source} bars of {cfg.asset.key}, {size} (model memory does not depend on the amount of "
        "data: batches are sized by the config; agents' environments and their data stay on the host)"
    )


# -- one model ---------------------------------------------------------------------------
@dataclass(frozen=True)
class RunMeasurement:
    """What one measuring fit measured. ``footprint`` is the figure checked against the
    target (see the module doc); ``device_figures`` are the raw probe readings."""

    model: str
    module: str
    breakdown: MemoryBreakdown
    footprint: MeasuredFigure
    target_mb: float | None
    device: str
    precision: str
    batch_key: str | None
    batch_size: int | None
    steps: int
    seconds: float
    device_figures: tuple[MeasuredFigure, ...] = ()
    notes: tuple[str, ...] = ()
    allocator_peak_bytes: int | None = None  # CPU: the first step's allocator peak (None on CUDA)

    @property
    def footprint_mb(self) -> float:
        return to_mb(self.footprint.bytes or 0)


def _stopper(memory, extra_steps: int):
    """A Lightning callback that stops the fit ``extra_steps`` training steps after ``memory``
    (the measuring callback, earlier in the list) measured a step with gradients."""

    class StopAfterMeasured(pl.Callback):
        def __init__(self) -> None:
            self.after = 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if memory.activations_measured:
                if self.after >= extra_steps:
                    trainer.should_stop = True
                self.after += 1

    return StopAfterMeasured()


def measure_run(
    cfg: DictConfig, factory: RunFactory, *, extra_steps: int = MEASURE_EXTRA_STEPS, workdir: str | Path | None = None
) -> RunMeasurement:
    """Measure the training footprint of the run ``cfg`` describes with a real short fit (see
    the module doc). ``cfg`` is a composed, validated config
    (:func:`foxhunt.training.parts.measuring_config`); ``factory`` builds its parts.
    Raises :class:`MeasurementError` when no training step produced gradients."""
    started = time.perf_counter()
    pl.seed_everything(int(cfg.seed), verbose=False)
    parts = factory.parts(cfg)
    memory = MemoryBudgetCallback(
        budget=None, target_mb=None, sample_every_n_steps=1, write_report=False,
        report_dir=workdir,
    )  # fmt: skip
    root = Path(workdir) if workdir is not None else Path(cfg.paths.output_dir)
    with quiet_lightning():
        trainer = instantiate(
            cfg.trainer,
            callbacks=[*factory.callbacks(cfg), memory, _stopper(memory, extra_steps)],
            logger=False,
            plugins=[parts.precision],
            default_root_dir=str(root),
            max_epochs=1,
            max_steps=-1,
            min_epochs=None,
            min_steps=None,
            limit_train_batches=1.0,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        device = trainer.strategy.root_device
        baseline = _cuda_baseline(device)
        trainer.fit(parts.model, datamodule=parts.datamodule)
    key = factory.batch_key(cfg)
    sample = memory.peak_sample
    name = str(cfg.model.name)
    if not memory.activations_measured:
        raise MeasurementError(
            f"{name}: no training step produced gradients in one epoch of the measuring data "
            f"({trainer.global_step} steps); give it more data (data.source.days)"
        )
    breakdown = memory.breakdown
    figures: list[MeasuredFigure] = []
    if device.type == "cuda" and sample is not None and sample.cuda_allocated_peak_bytes is not None:
        footprint = MeasuredFigure("footprint", sample.cuda_allocated_peak_bytes - baseline[0], CUDA_FOOTPRINT_METHOD)
        reserved = sample.cuda_reserved_peak_bytes
        figures.append(
            MeasuredFigure(
                "CUDA reserved peak", None if reserved is None else reserved - baseline[1],
                "torch.cuda.max_memory_reserved over the fit minus memory_reserved before it (allocator cache included)",
            )
        )  # fmt: skip
        if sample.nvml_run_bytes is not None:
            figures.append(
                MeasuredFigure(
                    "NVML run", sample.nvml_run_bytes,
                    "NVML used memory minus its value before the model was on the device, max over the samples",
                )
            )  # fmt: skip
        figures.append(MeasuredFigure("accounted", breakdown.total_training_bytes, CPU_FOOTPRINT_METHOD))
    else:
        footprint = MeasuredFigure("footprint", breakdown.total_training_bytes, CPU_FOOTPRINT_METHOD)
    if sample is not None and sample.rss_bytes is not None:
        figures.append(
            MeasuredFigure("process RSS", sample.rss_bytes, "process resident set size (psutil), max over the samples")
        )
    measurement = RunMeasurement(
        model=name,
        module=type(parts.model).__name__,
        breakdown=breakdown,
        footprint=footprint,
        target_mb=None if cfg.model.get("memory_target_mb") is None else float(cfg.model.memory_target_mb),
        device=str(device),
        precision=str(cfg.precision.name),
        batch_key=key,
        batch_size=None if config_value(cfg, key) is None else int(config_value(cfg, key)),
        steps=int(trainer.global_step),
        seconds=time.perf_counter() - started,
        device_figures=tuple(figures),
        allocator_peak_bytes=memory.allocator_peak_bytes,
    )
    del trainer, parts, memory
    _release(device)
    return measurement


def _cuda_baseline(device) -> tuple[int, int]:
    if device.type != "cuda" or not torch.cuda.is_available():
        return (0, 0)
    _release(device)
    return (torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device))


def _release(device) -> None:
    """Free what a finished fit left behind, so the next model's figures start from it."""
    gc.collect()
    if device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()


class quiet_lightning:
    """Lightning's start-up chatter (accelerator lines, tips) and the warnings it raises for
    a measuring fit's settings (no validation, a DQN step returning None) are not the
    command's output; errors still propagate."""

    NAMES = ("lightning.pytorch", "lightning.fabric", "lightning")

    def __enter__(self) -> None:
        self._levels = {name: logging.getLogger(name).level for name in self.NAMES}
        for name in self.NAMES:
            logging.getLogger(name).setLevel(logging.ERROR)
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("ignore", module=r"lightning\..*")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._warnings.__exit__(exc_type, exc, tb)
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)
