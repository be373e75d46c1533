"""The fleet's training memory, measured model by model, and the verdict against a budget.

``foxhunt memory validate`` asks the seed's question: with every model at its configured size
and precision, do DQN, PPO, Mamba-2 and the TFT each stay within their own target
(``model.memory_target_mb``), and do all of them *resident at once* (trained concurrently on
one card) leave the budget's required headroom free?

**One model, measured** (:func:`measure_run`). The model's config is composed as
``foxhunt-train`` composes it (:func:`measuring_config`: ``model=<name>`` plus the overrides),
validated, and built with :func:`foxhunt.build.build_parts`; then a real Lightning fit runs:
the real module, its own ``configure_optimizers``, the configured precision plugin and
accelerator, the config's callbacks except those that only write files or print
(:data:`SKIPPED_CALLBACKS`), and :class:`~foxhunt.memory.callback.MemoryBudgetCallback`
measuring. The fit stops :data:`MEASURE_EXTRA_STEPS` training steps after the first step that
produced gradients (an agent first fills its replay buffer), so the optimizer state exists and
one forward ran while the previous step's gradients were alive. No validation, checkpoint or
logger runs. The figures are those of the callback (:mod:`foxhunt.memory.accounting`):
parameters, gradients, optimizer state, buffers and model-owned state (a replay buffer, a
rollout) as live tensors, activations as the peak bytes saved for backward during the first
step with gradients.

A model's **footprint**, the figure checked against its target and summed for the ensemble:

- on CPU, the sum of those components (each at its own peak: an upper bound of what is alive
  at one instant);
- on CUDA, ``torch.cuda.max_memory_allocated`` over the fit minus ``memory_allocated`` before
  it: every tensor the run put on the device, temporaries included (the components are
  reported beside it).

**Data.** Model memory does not depend on the amount of data: forecasters read batches of the
configured size, and the agents' environments and their feature arrays stay on the host. The
synthetic source is therefore cut to :data:`MEASURE_DATA_DAYS` calendar days unless
``data.source.days`` is overridden; another source is read as configured.

Written by hand because Lightning has no "fit until the memory is measured" mode and no tool
sums several models' measured footprints against a card's budget.
"""

from __future__ import annotations

import gc
import logging
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from foxhunt.memory.accounting import MemoryBreakdown, to_mb
from foxhunt.memory.budget import MemoryBudget
from foxhunt.memory.report import MeasuredFigure

#: Calendar days of synthetic bars for a measuring fit: enough for every model to reach a
#: step with gradients (agents' episodes, forecasters' windows) and build in about a second.
MEASURE_DATA_DAYS = 7
#: Training steps run after the first step with gradients: the second step is the first whose
#: forward runs with the previous step's gradients and the optimizer state alive.
MEASURE_EXTRA_STEPS = 2
#: Callbacks of ``conf/callbacks`` that a measuring fit leaves out: they write checkpoints,
#: report progress or print, and hold no tensor of the run; the memory callback is replaced by
#: the measuring one. Any other configured callback runs, as in ``foxhunt-train``.
SKIPPED_CALLBACKS = frozenset(
    {
        "lightning.pytorch.callbacks.ModelCheckpoint",
        "lightning.pytorch.callbacks.TQDMProgressBar",
        "lightning.pytorch.callbacks.RichProgressBar",
        "foxhunt.jobs.graceful_stop.GracefulStop",
        "foxhunt.jobs.progress.ProgressReporter",
        "foxhunt.memory.callback.MemoryBudgetCallback",
    }
)
#: The config key holding the batch that a model's activations scale with: forecasters read
#: ``model.window.batch_size`` windows per step; each agent's own update batch is listed here.
AGENT_BATCH_KEYS = {
    "foxhunt.models.dqn.DQNAgent": "model.module.batch_size",
    "foxhunt.models.ppo.PPOAgent": "model.module.minibatch_size",
}
FORECASTER_BATCH_KEY = "model.window.batch_size"

ASSUMPTION = "all models resident at once (trained concurrently on one device)"
CPU_FOOTPRINT_METHOD = (
    "sum of the accounted components (live parameters, gradients, optimizer state, buffers and "
    "model-owned state after a real training step; activations: peak bytes saved for backward)"
)
CUDA_FOOTPRINT_METHOD = (
    "torch.cuda.max_memory_allocated over the measuring fit minus memory_allocated before it "
    "(every tensor the run put on the device)"
)


class MeasurementError(RuntimeError):
    """A measuring fit could not measure a model (one line naming the model and why)."""


# -- config ------------------------------------------------------------------------------
def batch_key(cfg: DictConfig) -> str | None:
    """The config key of the batch the model's activations scale with (``None``: unknown)."""
    if cfg.model.kind == "forecaster":
        return FORECASTER_BATCH_KEY
    return AGENT_BATCH_KEYS.get(str(cfg.model.module.get("_target_", "")))


def config_value(cfg: DictConfig, key: str | None) -> Any:
    return None if key is None else OmegaConf.select(cfg, key)


def measuring_config(
    model: str,
    overrides: Sequence[str] = (),
    root_dir: str | Path | None = None,
    output_dir: str | Path | None = None,
) -> DictConfig:
    """``conf/train.yaml`` composed with ``model=<model>`` and ``overrides``, as
    ``foxhunt-train`` would compose it, with the synthetic data cut to
    :data:`MEASURE_DATA_DAYS` days unless ``overrides`` set ``data.source.days``.

    Raises Hydra's error for a bad override and :class:`foxhunt.config.schema.ConfigError` for
    a bad value (both carry the key)."""
    from foxhunt.build import compose_config
    from foxhunt.config.schema import validate

    cfg = compose_config(
        [f"model={model}", *overrides], root_dir=root_dir, output_dir=None if output_dir is None else str(output_dir)
    )
    user_days = any(_override_key(item) == "data.source.days" for item in overrides)
    if "days" in cfg.data.source and not user_days:
        OmegaConf.update(cfg, "data.source.days", MEASURE_DATA_DAYS, merge=False)
    validate(cfg)
    return cfg


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


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

    @property
    def footprint_mb(self) -> float:
        return to_mb(self.footprint.bytes or 0)


def _stopper(memory, extra_steps: int):
    """A Lightning callback that stops the fit ``extra_steps`` training steps after ``memory``
    (the measuring callback, earlier in the list) measured a step with gradients."""
    import lightning.pytorch as pl

    class StopAfterMeasured(pl.Callback):
        def __init__(self) -> None:
            self.after = 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if memory.activations_measured:
                if self.after >= extra_steps:
                    trainer.should_stop = True
                self.after += 1

    return StopAfterMeasured()


def _configured_callbacks(cfg: DictConfig) -> list:
    from hydra.utils import instantiate

    callbacks = []
    for node in (cfg.get("callbacks") or {}).values():
        if node is None or str(node.get("_target_", "")) in SKIPPED_CALLBACKS:
            continue
        callbacks.append(instantiate(node))
    return callbacks


def measure_run(
    cfg: DictConfig, *, extra_steps: int = MEASURE_EXTRA_STEPS, workdir: str | Path | None = None
) -> RunMeasurement:
    """Measure the training footprint of the run ``cfg`` describes with a real short fit (see
    the module doc). ``cfg`` is a composed, validated config (:func:`measuring_config`).
    Raises :class:`MeasurementError` when no training step produced gradients."""
    import lightning.pytorch as pl
    from hydra.utils import instantiate

    from foxhunt.build import build_parts
    from foxhunt.memory.callback import MemoryBudgetCallback

    started = time.perf_counter()
    pl.seed_everything(int(cfg.seed), verbose=False)
    parts = build_parts(cfg)
    memory = MemoryBudgetCallback(
        budget=None, target_mb=None, sample_every_n_steps=1, write_report=False,
        report_dir=workdir,
    )  # fmt: skip
    root = Path(workdir) if workdir is not None else Path(cfg.paths.output_dir)
    with quiet_lightning():
        trainer = instantiate(
            cfg.trainer,
            callbacks=[*_configured_callbacks(cfg), memory, _stopper(memory, extra_steps)],
            logger=False,
            precision=parts.precision.trainer_precision,
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
    key = batch_key(cfg)
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
        figures.append(
            MeasuredFigure(
                "CUDA reserved peak", sample.cuda_reserved_peak_bytes - baseline[1],
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
        figures.append(MeasuredFigure("process RSS", sample.rss_bytes, "process resident set size (psutil), max over the samples"))
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
    )
    del trainer, parts, memory
    _release(device)
    return measurement


def _cuda_baseline(device) -> tuple[int, int]:
    import torch

    if device.type != "cuda" or not torch.cuda.is_available():
        return (0, 0)
    _release(device)
    return (torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device))


def _release(device) -> None:
    """Free what a finished fit left behind, so the next model's figures start from it."""
    import torch

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

    def __exit__(self, *exc: object) -> None:
        self._warnings.__exit__(*exc)
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)


# -- the verdict -------------------------------------------------------------------------
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
class EnsembleVerdict:
    """The fleet against the budget: every model within its target, and the sum of their
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
) -> EnsembleVerdict:
    """The verdict on measured models (in the order given) against ``budget``."""
    measurements = list(measurements)
    if not measurements:
        raise ValueError("judge: no model was measured")
    predictions = predictions or {}
    models = tuple(ModelVerdict(m, budget, predictions.get(m.model)) for m in measurements)
    precisions = sorted({m.precision for m in measurements})
    devices = sorted({m.device for m in measurements})
    notes = [*notes, *device_notes(budget, devices)]
    return EnsembleVerdict(
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
