"""The Trainer's precision plugin: a run's precision policy, applied by Lightning.

:func:`precision_plugin` is the one place a :class:`~foxhunt.precision.policy.PrecisionPolicy`
becomes Lightning's: every Trainer of a run gets it as its precision plugin
(``Trainer(plugins=[precision_plugin(policy, accelerator)])``, built once per run by
:func:`foxhunt.training.parts.build_parts`), and the policy lives there alone
(``trainer.precision_plugin.policy``). It is Lightning's own plugin for
``policy.trainer_precision`` (``32-true``: ``Precision``; ``bf16-mixed`` / ``16-mixed``:
``MixedPrecision``; ``bf16-true``: ``HalfPrecision``) with three of its hooks extended:

- ``convert_module``: under int8 weights, stores the weight matrices the policy selects as int8
  (:func:`foxhunt.precision.quantize.quantize_model`; idempotent). Under ``bf16-mixed`` it fits
  the policy to the device (:mod:`foxhunt.precision.bf16`): modules of an op family with no
  bf16 kernel there become fp32 islands (the LSTMs on an AVX2-only CPU), and where bf16 autocast
  cannot run at all the plugin runs without autocast and reports ``32-true``; it logs that as
  one line, once.
- ``connect`` (after the model's ``configure_optimizers``, before a checkpoint's optimizer
  state is restored): replaces each optimizer by the one the policy trains with
  (:func:`foxhunt.precision.optim.convert_optimizer`: torchao's 8-bit Adam(W) under 8-bit
  states). The models build plain torch optimizers and know no precision.

Lightning restores a checkpoint's weights before ``convert_module`` runs, so an int8 run's
weights must be int8 earlier: :class:`foxhunt.precision.callback.PrecisionCallback` calls
:meth:`quantize` in ``setup`` (and writes the reports). Without that callback a fresh fit is
still quantized here; resuming an int8 checkpoint needs it.

Written here rather than taken from Lightning: its plugins cast a whole module to one dtype
(``bf16-true``) or swap every linear layer for bitsandbytes' (CUDA only); none stores chosen
matrices as int8 on CPU and CUDA or picks the optimizer's state format.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, Literal

import torch
from lightning.pytorch.plugins.precision import HalfPrecision, MixedPrecision, Precision

from foxhunt.precision.bf16 import bf16_support, describe, keep_fp32
from foxhunt.precision.optim import convert_optimizer
from foxhunt.precision.policy import PrecisionPolicy

# Lazy imports: (c) foxhunt.precision.quantize (it imports torchao, seconds), in quantize: every run builds this plugin, only an int8 run quantizes

log = logging.getLogger(__name__)


class _PolicyHooks(Precision):
    """What a foxhunt plugin adds to Lightning's plugin of the same precision (put before it)."""

    def _attach(self, policy: PrecisionPolicy, device: str) -> None:
        if not isinstance(policy, PrecisionPolicy):
            raise ValueError(f"precision: expected a PrecisionPolicy, got {type(policy).__name__}")
        self.policy = policy
        self.device = device
        self.plan: list = []  # per parameter: int8 or fp32, and why (foxhunt.precision.quantize)
        self.islands: dict[str, str] = {}  # bf16: module name -> type run in fp32
        self.bf16_line: str | None = None  # what bf16 runs as on this device, said once
        self.autocast = True

    def quantize(self, module: torch.nn.Module) -> list:
        """Store ``module``'s selected weight matrices as int8 (idempotent); the plan."""
        if self.policy.quantizes_weights:
            from foxhunt.precision.quantize import quantize_model

            self.plan = quantize_model(module, self.policy)
        return self.plan

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        module = super().convert_module(module)
        self.quantize(module)
        if self.policy.trainer_precision == "bf16-mixed":
            self._fit_bf16_to_device(module)
        return module

    def _fit_bf16_to_device(self, module: torch.nn.Module) -> None:
        trainer = getattr(module, "_trainer", None)  # set while a Trainer runs the module
        device = trainer.strategy.root_device if trainer is not None else torch.device(self.device)
        self.device = device.type
        support = bf16_support(device)
        if support.usable:
            self.islands = keep_fp32(module, support)
        else:  # the whole run is fp32 from here on
            self.autocast = False
            self.precision = "32-true"
        if self.bf16_line is None:
            self.bf16_line = describe(support, self.islands)
            fell_back = self.islands or not support.usable or not support.native
            (log.warning if fell_back else log.info)("%s", self.bf16_line)

    def connect(self, model: Any, optimizers: list, lr_scheduler_configs: list) -> tuple[Any, list, list]:
        model, optimizers, lr_scheduler_configs = super().connect(model, optimizers, lr_scheduler_configs)
        converted = [convert_optimizer(optimizer, self.policy) for optimizer in optimizers]
        replaced = {id(old): new for old, new in zip(optimizers, converted) if new is not old}
        for config in lr_scheduler_configs:  # a scheduler steps the optimizer that trains
            scheduler = config.scheduler
            if id(getattr(scheduler, "optimizer", None)) in replaced:
                scheduler.optimizer = replaced[id(scheduler.optimizer)]
        return model, converted, lr_scheduler_configs


class PolicyPrecision(_PolicyHooks, Precision):
    """``32-true`` (fp32, or int8 weights with fp32 arithmetic) under a policy."""

    def __init__(self, policy: PrecisionPolicy, device: str = "cpu") -> None:
        super().__init__()
        self._attach(policy, device)


class PolicyMixedPrecision(_PolicyHooks, MixedPrecision):
    """``bf16-mixed`` / ``16-mixed`` autocast under a policy."""

    def __init__(self, policy: PrecisionPolicy, device: str = "cpu") -> None:
        super().__init__(_MIXED[policy.trainer_precision], device)
        self._attach(policy, device)

    @contextmanager
    def forward_context(self):
        if not self.autocast:  # bf16 cannot run on this device: fp32
            yield
            return
        with self.autocast_context_manager():
            yield


class PolicyHalfPrecision(_PolicyHooks, HalfPrecision):
    """``bf16-true`` (the whole module in bf16) under a policy."""

    def __init__(self, policy: PrecisionPolicy, device: str = "cpu") -> None:
        super().__init__(_HALF[policy.trainer_precision])
        self._attach(policy, device)


_MIXED: dict[str, Literal["16-mixed", "bf16-mixed"]] = {"bf16-mixed": "bf16-mixed", "16-mixed": "16-mixed"}
_HALF: dict[str, Literal["bf16-true", "16-true"]] = {"bf16-true": "bf16-true"}
PLUGINS: dict[str, Callable[[PrecisionPolicy, str], _PolicyHooks]] = {
    "32-true": PolicyPrecision,
    "bf16-mixed": PolicyMixedPrecision,
    "16-mixed": PolicyMixedPrecision,
    "bf16-true": PolicyHalfPrecision,
}


def precision_plugin(policy: PrecisionPolicy, accelerator: str = "auto") -> Precision:
    """The Trainer's precision plugin for ``policy`` on ``accelerator`` (the Trainer's
    ``accelerator`` argument: ``cpu``, ``gpu``/``cuda``, ``auto``...), built once per Trainer."""
    return PLUGINS[policy.trainer_precision](policy, _device_type(str(accelerator)))


def policy_of(trainer) -> PrecisionPolicy:
    """The policy ``trainer`` trains under; a Trainer built without :func:`precision_plugin` is a
    bug of the code that built it."""
    return policy_plugin(trainer).policy


def policy_plugin(trainer) -> _PolicyHooks:
    """The foxhunt precision plugin of ``trainer`` (TypeError for Lightning's own: see :func:`policy_of`)."""
    plugin = trainer.precision_plugin
    if not isinstance(plugin, _PolicyHooks):
        raise TypeError(
            f"the Trainer's precision plugin is Lightning's {type(plugin).__name__}: build it with "
            "plugins=[foxhunt.precision.plugin.precision_plugin(policy, accelerator)]"
        )
    return plugin


def _device_type(accelerator: str) -> str:
    """The autocast device of a Trainer's ``accelerator`` (corrected to the strategy's root
    device when the module is converted)."""
    if accelerator in ("gpu", "cuda"):
        return "cuda"
    if accelerator == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return accelerator
