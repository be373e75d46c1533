"""Predicting a run's training memory from its config, before the run.

The prediction has the components of a measured breakdown
(:class:`~foxhunt.memory.accounting.MemoryBreakdown`), each obtained without running the
configured batch:

- **parameters, gradients, buffers**: the model is constructed from the config on the
  ``meta`` device (shapes and dtypes, no memory), converted by the run's Lightning precision
  plugin (``bf16-true`` stores bf16 weights; ``bf16-mixed`` keeps fp32 weights), and its
  tensors' ``numel x element_size`` summed (parameters once each; gradients for every
  parameter that requires one, in the parameter's dtype).
- **optimizer state**: the model's own ``configure_optimizers()`` builds its optimizers over
  the meta parameters (no state exists before a step), and a rule per optimizer class
  (:data:`OPTIMIZER_STATE_RULES`, looked up along the class's MRO) gives the bytes of the state
  a step creates for each parameter: Adam / AdamW two moments in the parameter's dtype
  (three with ``amsgrad``) and a scalar ``step``; SGD a momentum buffer when ``momentum > 0``;
  RMSprop, NAdam, RAdam, Adamax theirs. State an optimizer creates at construction (Adagrad)
  exists on the meta parameters and is read as it is. :func:`register_optimizer_rule` adds a
  class (torchao's 8-bit optimizers keep quantized moments: their rule belongs with the
  precision code).
- **activations and model-owned state**: measured, not modelled. Two real short fits of the
  same config with the batch (the factory's ``batch_key``: the forecasters' windows per step,
  DQN's update batch, PPO's minibatch) set to two tiny values (the smallest
  valid one >= :data:`MIN_PROBE_BATCH`, then the smallest valid one >= twice that) measure the
  activation peak and the model-owned state (the agents allocate their replay buffer or rollout
  from their config sizes, independent of the batch) with
  :func:`foxhunt.memory.training_run.measure_run`; both are extrapolated along the line through the
  two points to the configured batch.

The scaling rule, per family. Every activation saved for backward belongs to one sample of
the batch (no batch norm, no cross-sample attention in any of the four models), so the bytes
are affine in the batch: a per-sample slope plus a constant (the loss scalars, shared
buffers); two batches determine the line exactly. The sequence length is *not* scaled: the
probes run at the configured ``seq_len``, so what is not linear in it is inside the
measurement -- the TFT's attention scores grow with ``seq_len**2``, and Mamba-2's chunked scan
pads the sequence to a multiple of ``chunk_size`` and builds ``chunk_size**2`` decay matrices
per chunk (a step function of ``seq_len``). The agents have no sequence.

Written by hand because no library predicts a training step's memory from a module's config;
torch's meta device supplies the shapes.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig, OmegaConf

from foxhunt.config.schema import ConfigError, resolved_config, validate
from foxhunt.memory.accounting import MemoryBreakdown, to_mb
from foxhunt.memory.training_run import RunFactory, config_value, measure_run, quiet_lightning

#: The smallest batch a probe fit runs at. Small enough that a probe costs a fraction of the
#: configured step's memory; not smaller, because an agent's probe step runs one update per
#: batch of its rollout (PPO: rollout / minibatch x update_epochs), and a batch of one has no
#: spread (PPO normalizes advantages per minibatch).
MIN_PROBE_BATCH = 4
#: Probe batches are searched up to this value (a constraint such as "the minibatch divides the
#: rollout" may reject some).
MAX_PROBE_BATCH = 4096

OptimizerRule = Callable[[torch.Tensor, Mapping[str, Any]], int]  # (parameter, its param group) -> bytes
#: A probe fit: (batch, activations, model state, allocator peak beyond the static parts or None), bytes.
ProbeFit = tuple[int, int, int, int | None]
OPTIMIZER_STATE_RULES: dict[type, OptimizerRule] = {}

COMPONENT_PREDICTIONS = {
    "params": "meta-device construction, numel x element size after the precision plugin",
    "grads": "meta-device construction: one gradient per parameter that requires grad, in its dtype",
    "optimizer": "the model's configure_optimizers() on the meta parameters + the optimizer class's state rule",
    "buffers": "meta-device construction, numel x element size",
    "model_state": "measured in two probe fits at tiny batches, extrapolated linearly to the configured batch",
    "activations": "measured in two probe fits at tiny batches (configured sequence length), extrapolated linearly to the configured batch",
    "temporaries": "the allocator peak less params, grads, optimizer, buffers in the same two probe fits, extrapolated "
    "linearly; what it exceeds the predicted activations and model state by",
}


def register_optimizer_rule(*classes: type) -> Callable[[OptimizerRule], OptimizerRule]:
    """Decorator: ``rule(param, group) -> bytes`` of the state a step creates for ``param``."""

    def register(rule: OptimizerRule) -> OptimizerRule:
        for cls in classes:
            OPTIMIZER_STATE_RULES[cls] = rule
        return rule

    return register


def _nbytes(tensor) -> int:
    return int(tensor.numel()) * int(tensor.element_size())


def _step_bytes(group: Mapping[str, Any]) -> int:
    """Bytes of the scalar ``step`` tensor torch's optimizers keep per parameter: float32, or
    float64 when the default dtype is float64 and the optimizer is not fused."""
    wide = torch.get_default_dtype() == torch.float64 and not group.get("fused")
    return 8 if wide else 4


@register_optimizer_rule(torch.optim.Adam, torch.optim.AdamW, torch.optim.RAdam, torch.optim.Adamax)
def _adam(param, group: Mapping[str, Any]) -> int:
    moments = 3 if group.get("amsgrad") else 2  # exp_avg, exp_avg_sq (+ max_exp_avg_sq); Adamax: exp_avg, exp_inf
    return moments * _nbytes(param) + _step_bytes(group)


@register_optimizer_rule(torch.optim.NAdam)
def _nadam(param, group: Mapping[str, Any]) -> int:
    return 2 * _nbytes(param) + 2 * _step_bytes(group)  # moments, step and mu_product


@register_optimizer_rule(torch.optim.SGD)
def _sgd(param, group: Mapping[str, Any]) -> int:
    return _nbytes(param) if group.get("momentum", 0) else 0  # momentum_buffer


@register_optimizer_rule(torch.optim.RMSprop)
def _rmsprop(param, group: Mapping[str, Any]) -> int:
    buffers = 1 + bool(group.get("momentum", 0)) + bool(group.get("centered"))  # square_avg, momentum, grad_avg
    return buffers * _nbytes(param) + _step_bytes(group)


def optimizer_rule(optimizer) -> OptimizerRule | None:
    """The state rule of ``optimizer``'s class or its nearest registered base class."""
    for cls in type(optimizer).__mro__:
        if cls in OPTIMIZER_STATE_RULES:
            return OPTIMIZER_STATE_RULES[cls]
    return None


def optimizers_of(configured: Any) -> list:
    """The optimizers in whatever ``configure_optimizers`` returned (an optimizer, a list or
    tuple of them, a dict with ``optimizer``, a list of such dicts, or ``(optimizers,
    schedulers)``)."""
    if configured is None:
        return []
    if isinstance(configured, torch.optim.Optimizer):
        return [configured]
    if isinstance(configured, Mapping):
        return optimizers_of(configured.get("optimizer"))
    if isinstance(configured, tuple) and len(configured) == 2 and isinstance(configured[0], (list, tuple)):
        return optimizers_of(configured[0])
    found = []
    for item in configured:
        found += optimizers_of(item)
    return found


def predicted_optimizer_bytes(optimizers: Iterable[Any]) -> tuple[int, list[str]]:
    """Bytes of the optimizer state of ``optimizers`` after a step (each parameter once), and
    a note per optimizer class without a rule. State an optimizer already created at
    construction (Adagrad's, for every parameter) is read as it is; otherwise the class's rule
    gives the state a step creates for each parameter that requires grad."""
    total, notes, seen = 0, [], set()
    for optimizer in optimizers:
        rule = optimizer_rule(optimizer)
        missing = False
        for group in optimizer.param_groups:
            for param in group["params"]:
                if id(param) in seen:
                    continue
                seen.add(id(param))
                state = optimizer.state.get(param)
                if state:
                    total += sum(_nbytes(t) for t in state.values() if _is_tensor(t))
                elif param.requires_grad:
                    if rule is None:
                        missing = True
                    else:
                        total += rule(param, group)
            total += sum(_nbytes(v) for k, v in group.items() if k != "params" and _is_tensor(v))
        if missing:
            notes.append(f"no state rule for {type(optimizer).__qualname__}: its optimizer state is not predicted")
    return total, notes


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


# -- the meta model ----------------------------------------------------------------------
@dataclass(frozen=True)
class StaticPrediction:
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    buffers_bytes: int
    notes: tuple[str, ...] = ()


def predict_static(cfg: DictConfig, factory: RunFactory) -> StaticPrediction:
    """Parameters, gradients, buffers and optimizer state of ``cfg``'s model, from a meta-device
    construction by ``factory`` (see the module doc)."""
    with torch.device("meta"):
        model = factory.model(cfg)
    model = _precision_converted(cfg, model)
    params = list(model.parameters())  # each Parameter once (tied weights too)
    params_bytes = sum(_nbytes(p) for p in params)
    grads_bytes = sum(_nbytes(p) for p in params if p.requires_grad)
    buffers_bytes = sum(_nbytes(b) for b in model.buffers())
    try:
        configured = model.configure_optimizers()
    except Exception as exc:  # a model whose optimizers need a trainer attached
        raise ValueError(
            f"{cfg.model.name}: configure_optimizers() failed on the meta-device model: {type(exc).__name__}: {exc}"
        ) from None
    optimizer_bytes, notes = predicted_optimizer_bytes(optimizers_of(configured))
    return StaticPrediction(params_bytes, grads_bytes, optimizer_bytes, buffers_bytes, tuple(notes))


def _precision_converted(cfg: DictConfig, model):
    """``model`` as the run's Lightning precision plugin stores it (``bf16-true``: bf16)."""
    precision = cfg.precision.trainer_precision
    with quiet_lightning():
        trainer = pl.Trainer(
            precision=precision, accelerator=cfg.trainer.get("accelerator", "auto"), devices=1,
            logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
    return trainer.precision_plugin.convert_module(model)


# -- probe fits --------------------------------------------------------------------------
@dataclass(frozen=True)
class LinearFit:
    """The line through two measured points ``(x1, y1)``, ``(x2, y2)``."""

    x1: int
    y1: int
    x2: int
    y2: int

    @property
    def slope(self) -> float:
        return (self.y2 - self.y1) / (self.x2 - self.x1)

    def at(self, x: int) -> int:
        return max(0, round(self.y1 + self.slope * (x - self.x1)))


def probe_configs(cfg: DictConfig, key: str, batch: int) -> list[tuple[int, DictConfig]]:
    """Two ``(batch, config)`` pairs of ``cfg`` with ``key`` set to tiny valid batches: the
    smallest valid one >= :data:`MIN_PROBE_BATCH`, then the smallest valid one >= twice it
    (a value the config's validation rejects is skipped)."""
    found: list[tuple[int, DictConfig]] = []
    candidate = MIN_PROBE_BATCH
    while len(found) < 2 and candidate <= MAX_PROBE_BATCH:
        probe = copy.deepcopy(cfg)
        OmegaConf.update(probe, key, candidate, merge=False)
        try:
            validate(probe)
        except ConfigError:
            candidate += 1
            continue
        found.append((candidate, probe))
        candidate = 2 * candidate
    if len(found) < 2:
        raise ValueError(
            f"{cfg.model.name}: no two valid probe batches for {key} in "
            f"[{MIN_PROBE_BATCH}, {MAX_PROBE_BATCH}] (configured {batch})"
        )
    return found


@dataclass(frozen=True)
class Prediction:
    """A run's predicted training memory (see the module doc): ``breakdown`` has the predicted
    bytes per component, ``methods`` how each was obtained."""

    model: str
    breakdown: MemoryBreakdown
    batch_key: str | None
    batch_size: int | None
    probes: tuple[ProbeFit, ...] = ()
    seconds: float = 0.0
    notes: tuple[str, ...] = ()
    methods: Mapping[str, str] = field(default_factory=lambda: dict(COMPONENT_PREDICTIONS))

    @property
    def total_bytes(self) -> int:
        return self.breakdown.total_training_bytes

    @property
    def total_mb(self) -> float:
        return to_mb(self.total_bytes)

    def error_pct(self, measured_bytes: int) -> float | None:
        """(predicted - measured) / measured, in %."""
        return None if not measured_bytes else 100.0 * (self.total_bytes - measured_bytes) / measured_bytes


def _dynamic_peak(measured) -> int | None:
    """A probe fit's allocator peak minus its parameters, gradients, optimizer state and buffers
    (what grows with the batch), or None where no allocator peak was taken (CUDA)."""
    peak = measured.allocator_peak_bytes
    if peak is None:
        return None
    b = measured.breakdown
    return peak - (b.params_bytes + b.grads_bytes + b.optimizer_bytes + b.buffers_bytes)


def predict_footprint(
    cfg: DictConfig,
    factory: RunFactory,
    workdir: str | Path | None = None,
    probe_cache: dict[str, tuple[int, int, int | None]] | None = None,
) -> Prediction:
    """Predict the training footprint of the run ``cfg`` (composed and validated, e.g. by
    :func:`foxhunt.training.parts.measuring_config`; built by ``factory``) without running its
    configured batch.

    ``probe_cache``: a dict shared by several predictions of configs that differ only in the
    batch (their probe fits are the same): the measured ``(activations, model state)`` bytes
    per probe config (and the temporaries of their step)."""
    started = time.perf_counter()
    static = predict_static(cfg, factory)
    notes = list(static.notes)
    precision = cfg.precision
    if str(precision.get("weights", "fp32")) != "fp32" or str(precision.get("optimizer_states", "32bit")) != "32bit":
        notes.append(
            f"precision {precision.name}: quantized weights and 8-bit optimizer states are not modelled by "
            "the meta-device prediction of parameters and optimizer state"
        )
    key = factory.batch_key(cfg)
    batch = config_value(cfg, key)
    if key is None or batch is None:
        measured = measure_run(cfg, factory, extra_steps=0, workdir=workdir)
        activations, state = measured.breakdown.activations_bytes, measured.breakdown.model_state_bytes
        temporaries = measured.breakdown.temporaries_bytes
        probes: tuple[ProbeFit, ...] = ()
        allocator = None
        notes.append("no batch key known for this model: activations and model state measured at the configured batch")
    else:
        batch = int(batch)
        points: list[ProbeFit] = []
        for probe_batch, probe in probe_configs(cfg, key, batch):
            cache_key = OmegaConf.to_yaml(resolved_config(probe))
            if probe_cache is None or cache_key not in probe_cache:
                measured = measure_run(probe, factory, extra_steps=1, workdir=workdir)  # the step after: its peak too
                found = (measured.breakdown.activations_bytes, measured.breakdown.model_state_bytes,
                         _dynamic_peak(measured))  # fmt: skip
                if probe_cache is not None:
                    probe_cache[cache_key] = found
            else:
                found = probe_cache[cache_key]
            points.append((probe_batch, *found))
        (b1, a1, s1, d1), (b2, a2, s2, d2) = points
        activations = LinearFit(b1, a1, b2, a2).at(batch)
        state = LinearFit(b1, s1, b2, s2).at(batch)
        allocator = None if d1 is None or d2 is None else LinearFit(b1, d1, b2, d2).at(batch)
        # the allocator peak beyond the static components, extrapolated like the rest; what it
        # exceeds the predicted activations and state by is the temporaries
        temporaries = 0 if allocator is None else max(0, allocator - activations - state)
        probes = tuple(points)
    breakdown = MemoryBreakdown(
        params_bytes=static.params_bytes,
        grads_bytes=static.grads_bytes,
        optimizer_bytes=static.optimizer_bytes,
        buffers_bytes=static.buffers_bytes,
        model_state_bytes=state,
        activations_bytes=activations,
        temporaries_bytes=temporaries,
    )
    return Prediction(
        model=str(cfg.model.name),
        breakdown=breakdown,
        batch_key=key,
        batch_size=None if batch is None else int(batch),
        probes=probes,
        seconds=time.perf_counter() - started,
        notes=tuple(notes),
    )
