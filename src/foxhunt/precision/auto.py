"""``precision=auto``: bf16 where the device computes bf16 natively, fp32 elsewhere.

``conf/precision/auto.yaml`` fills ``name``, ``trainer_precision`` and ``choice`` of the policy
through the OmegaConf resolver :data:`RESOLVER` (``${foxhunt.auto_precision:<field>,
${trainer.accelerator}}``), registered when :mod:`foxhunt` is imported. The choice is made
from what the device the run trains on supports, probed by :func:`foxhunt.precision.bf16.bf16_support`
(the same per-device probe and fp32 islands a ``precision=bf16`` run uses):

- bf16 (``bf16-mixed``) where bf16 arithmetic is native there (a CPU with ``avx512_bf16`` /
  ``amx_bf16`` (Arm: ``bf16``) and a oneDNN with bf16; a CUDA device of compute capability
  >= 8.0) and bf16 autocast runs (families without a bf16 kernel still become fp32 islands);
- fp32 (``32-true``) elsewhere: an emulated bf16 (an AVX2-only CPU, a pre-Ampere GPU) saves
  activation memory but not time, and a device where bf16 autocast fails cannot use it.

Because the fields resolve to the chosen option's values, everything that reads the config
(the run name ``{model}-{asset}-{precision}``, the ``precision`` tag, the config hash, the
memory commands' prediction and measurement) sees the precision actually used, never ``auto``.
``choice`` is the one line that says what was chosen and why; it is logged once per process
and recorded in the run's tag ``precision.choice`` (:func:`foxhunt.training.cell.run_tags`).

Works on any device and knows no model.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

# Lazy imports: (c) torch, foxhunt.precision.bf16 (torch) and OmegaConf, in the functions: foxhunt/__init__ imports this module at every start (foxhunt --help, tab completion, the job supervisor), which loads neither until a config resolves precision=auto

log = logging.getLogger(__name__)

RESOLVER = "foxhunt.auto_precision"
#: The options auto picks between: (``conf/precision`` option, its Lightning precision).
NATIVE_OPTION = ("bf16", "bf16-mixed")
FALLBACK_OPTION = ("fp32", "32-true")
FIELDS = ("name", "trainer_precision", "choice")


@dataclass(frozen=True)
class AutoChoice:
    name: str
    trainer_precision: str
    choice: str


def device_for(accelerator: str) -> str:
    """The torch device type a Trainer with ``accelerator`` trains on (``auto``: CUDA when
    available, else the CPU, as Lightning picks; MPS is not told apart here)."""
    accelerator = str(accelerator).lower()
    if accelerator in ("gpu", "cuda"):
        return "cuda"
    if accelerator == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return accelerator


def choose(support) -> AutoChoice:
    """bf16 where ``support`` (a :class:`foxhunt.precision.bf16.Bf16Support`) says bf16 is native
    and runs, fp32 otherwise; with the line that says why."""
    head = f"precision=auto on {support.device} ({support.hardware})"
    if support.native and support.usable:
        (name, lightning), why = NATIVE_OPTION, "native bf16 arithmetic"
    elif not support.usable:
        (name, lightning), why = FALLBACK_OPTION, "bf16 autocast cannot run here"
    else:
        (name, lightning), why = (
            FALLBACK_OPTION,
            "no native bf16 arithmetic (bf16 would be emulated: less activation memory, not faster)",
        )
    return AutoChoice(name, lightning, f"{head}: {name} ({lightning}), {why}")


@functools.cache
def auto_choice(device_type: str) -> AutoChoice:
    """The choice for ``device_type``, probed and logged once per process."""
    from foxhunt.precision.bf16 import bf16_support

    made = choose(bf16_support(device_type))
    log.info("%s", made.choice)
    return made


def _resolve(field: str, accelerator: str) -> str:
    if field not in FIELDS:
        raise ValueError(f"precision: ${{{RESOLVER}:{field},...}}: the field must be one of {', '.join(FIELDS)}")
    return getattr(auto_choice(device_for(accelerator)), field)


def register_resolver() -> None:
    """Register :data:`RESOLVER` with OmegaConf (idempotent)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, _resolve)
