"""The optimizer a run trains with: the model's, converted under its precision policy.

The models build plain torch optimizers in ``configure_optimizers`` (:func:`make_optimizer`:
torch's ``Adam`` / ``AdamW``, on its fused kernel where that applies). The Trainer's precision
plugin (:mod:`foxhunt.precision.plugin`) then hands each one to :func:`convert_optimizer`, which
under ``optimizer_states: 8bit`` / ``fp8`` rebuilds it, same parameter groups and
hyperparameters, as torchao's block-wise 8-bit ``Adam8bit`` / ``AdamW8bit`` (or
``AdamFp8`` / ``AdamWFp8``): each moment one byte per element plus one fp32 scale per
``optimizer_block_size`` elements; torchao keeps tensors under 4,096 elements, and those not a
multiple of the block size, in fp32. The rebuild happens before the first step and before a
checkpoint's optimizer state is restored, and torch's optimizers allocate their state at the
first step, so the fp32 optimizer never holds memory.

Their step is :class:`foxhunt.precision.eight_bit_step.EightBitStep` (mixed into torchao's
class: its states, state creation and checkpoint layout stay torchao's), which also updates int8
weights (the updated fp32 row re-quantized with counter-based stochastic rounding: exact on
resume); torch's ``AdamW`` cannot (its decoupled weight decay multiplies the int8 tensor in
place), so int8 weights need the 8-bit optimizers (the policy refuses int8 weights without 8-bit
states). ``compile_optimizer`` and ``fuse_fp32_states`` choose how the step runs (see that module).

Checkpoints: an 8-bit optimizer's ``state_dict`` holds each 8-bit state as a plain dict
(``format``, ``codes``, ``scale``, ...) and ``load_state_dict`` rebuilds torchao's state
tensors from it (the optimizer's public state-dict hooks), for the reason int8 weights are
saved as plain tensors (:mod:`foxhunt.precision.quantize`): Lightning loads checkpoints with a
callable ``map_location``, under which torch cannot rebuild a tensor subclass. Each param group
holds its stochastic rounding's seed (``rounding_seed``, an integer); a group saved before it was
kept takes the live group's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from foxhunt.precision.eight_bit_step import ROUNDING_SEED, EightBitStep
from foxhunt.precision.policy import PrecisionPolicy

# Lazy imports: (c) torchao (seconds to import), in the 8-bit paths: every model imports this module through make_optimizer, a run needs torchao only when it trains with 8-bit states

OPTIMIZER_KINDS = ("adam", "adamw")


def make_optimizer(
    params: Iterable[Any],
    kind: str,
    lr: float,
    weight_decay: float = 0.0,
    eps: float | None = None,
) -> torch.optim.Optimizer:
    """torch's ``kind`` (``adam`` | ``adamw``) over ``params`` (tensors or param-group dicts), on
    torch's fused kernel where it takes every tensor. ``eps=None``: the library's."""
    if kind not in OPTIMIZER_KINDS:
        raise ValueError(f"optimizer kind {kind!r}: must be one of {', '.join(OPTIMIZER_KINDS)}")
    options: dict[str, Any] = {"lr": lr, "weight_decay": weight_decay}
    if eps is not None:
        options["eps"] = eps
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    params = [dict(p, params=list(p["params"])) if isinstance(p, dict) else p for p in params]
    if _fused_supported(params):
        options["fused"] = True
    return cls(params, **options)


#: The hyperparameters of torch's Adam(W) that torchao's 8-bit Adam(W) takes too; torch's other
#: group keys (``foreach``, ``fused``, ``capturable``...) choose torch kernels and are dropped.
_SHARED_KEYS = ("lr", "betas", "eps", "weight_decay", "amsgrad")


def convert_optimizer(optimizer: torch.optim.Optimizer, policy: PrecisionPolicy) -> torch.optim.Optimizer:
    """The optimizer ``policy`` trains with in place of ``optimizer`` (built, never stepped):
    under 8-bit states torchao's 8-bit Adam(W) over the same parameter groups with the same
    hyperparameters; under ``16-mixed`` the unfused kernel (Lightning refuses to clip the
    gradients of an optimizer that unscales them itself, as torch's fused ones do); else
    ``optimizer`` itself (also when it is in the policy's form already: idempotent)."""
    from torchao.optim import Adam8bit, AdamFp8, AdamW8bit, AdamWFp8

    if policy.eight_bit_optimizer and not isinstance(optimizer, (Adam8bit, AdamW8bit, AdamFp8, AdamWFp8)):
        _never_stepped(optimizer)
        return _eight_bit(optimizer, policy)
    if policy.trainer_precision == "16-mixed" and optimizer.defaults.get("fused"):
        _never_stepped(optimizer)
        return type(optimizer)(_groups(optimizer, drop=("fused",)), **{**optimizer.defaults, "fused": False})
    return optimizer


def _never_stepped(optimizer: torch.optim.Optimizer) -> None:
    if optimizer.state:  # its states would be lost: a bug of the caller
        raise RuntimeError(f"convert_optimizer: {type(optimizer).__name__} has stepped already")


def _groups(optimizer: torch.optim.Optimizer, drop: Iterable[str]) -> list[dict[str, Any]]:
    dropped = set(drop)
    return [{k: v for k, v in group.items() if k not in dropped} for group in optimizer.param_groups]


def _eight_bit(optimizer: torch.optim.Optimizer, policy: PrecisionPolicy) -> torch.optim.Optimizer:
    from torchao.optim import Adam8bit, AdamFp8, AdamW8bit, AdamWFp8

    defaults = optimizer.defaults
    if isinstance(optimizer, torch.optim.AdamW) or defaults.get("decoupled_weight_decay"):
        kind = "adamw"
    elif isinstance(optimizer, torch.optim.Adam):
        kind = "adam"
    else:
        raise ValueError(
            f"precision {policy.name}: 8-bit optimizer states replace torch's Adam or AdamW, not {type(optimizer).__name__}"
        )
    if defaults.get("maximize"):
        raise ValueError(f"precision {policy.name}: torchao's 8-bit Adam(W) cannot maximize")
    if policy.optimizer_states == "fp8":
        cls = AdamWFp8 if kind == "adamw" else AdamFp8
    else:
        cls = AdamW8bit if kind == "adamw" else Adam8bit
    name = ("" if policy.compile_optimizer else "Eager") + ("FusedFp32" if policy.fuse_fp32_states else "") + cls.__name__
    step_options = {"compile_update": policy.compile_optimizer, "fuse_fp32_states": policy.fuse_fp32_states}
    cls = type(name, (EightBitStep, cls), step_options)
    torch_only = [key for key in defaults if key not in _SHARED_KEYS]
    options = {key: defaults[key] for key in _SHARED_KEYS if key in defaults}
    converted = cls(_groups(optimizer, drop=torch_only), block_size=policy.eight_bit_block_size, **options)
    converted.register_state_dict_post_hook(_plain_states)
    converted.register_load_state_dict_pre_hook(_subclass_states)
    return converted


def _fused_supported(params: list[Any]) -> bool:
    """Whether torch's fused Adam/AdamW kernel takes every tensor of ``params``: floating point,
    on a device it has kernels for (CPU and CUDA among them; not the meta device that memory
    prediction builds on). The fused step is one kernel per parameter instead of about ten
    element-wise ops, a few times faster for the agents' small networks on a CPU (the figures:
    docs/benchmarks.md; scripts/benchmark.py's RL section runs every optimizer step through it)."""
    devices = set(_get_fused_kernels_supported_devices())
    tensors = [t for p in params for t in (p["params"] if isinstance(p, dict) else [p])]
    return bool(tensors) and all(
        isinstance(t, torch.Tensor)
        and t.is_floating_point()
        and t.device.type in devices
        and type(t) in (torch.Tensor, torch.nn.Parameter)
        for t in tensors
    )


# -- 8-bit states in checkpoints ---------------------------------------------------------------
def _plain_states(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    from torchao.optim.subclass_8bit import OptimState8bit
    from torchao.optim.subclass_fp8 import OptimStateFp8

    packed = {}
    for index, param_state in state_dict["state"].items():
        plain = dict(param_state)  # the values are the live optimizer's: never mutate them
        for key, value in param_state.items():
            if isinstance(value, OptimState8bit):
                plain[key] = {"format": "8bit", "codes": value.codes, "scale": value.scale, "qmap": value.qmap,
                              "signed": bool(value.signed), "dtype": _dtype_name(value.dtype)}  # fmt: skip
            elif isinstance(value, OptimStateFp8):
                plain[key] = {"format": "fp8", "codes": value.codes, "scale": value.scale, "dtype": _dtype_name(value.dtype)}
        packed[index] = plain
    state_dict["state"] = packed
    return state_dict


def _subclass_states(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    from torchao.optim.subclass_8bit import OptimState8bit
    from torchao.optim.subclass_fp8 import OptimStateFp8

    state_dict = dict(state_dict)
    unpacked = {}
    for index, param_state in state_dict["state"].items():
        rebuilt = dict(param_state)
        for key, value in param_state.items():
            if isinstance(value, dict) and value.get("format") == "8bit":
                rebuilt[key] = OptimState8bit(value["codes"], value["scale"], value["qmap"], value["signed"],
                                              dtype=getattr(torch, value["dtype"]))  # fmt: skip
            elif isinstance(value, dict) and value.get("format") == "fp8":
                rebuilt[key] = OptimStateFp8(value["codes"], value["scale"], dtype=getattr(torch, value["dtype"]))
        unpacked[index] = rebuilt
    state_dict["state"] = unpacked
    state_dict["param_groups"] = [_with_rounding_seed(saved, live, index) for index, (saved, live)
                                  in enumerate(zip(state_dict["param_groups"], optimizer.param_groups))]  # fmt: skip
    return state_dict


def _with_rounding_seed(saved: dict[str, Any], live: dict[str, Any], index: int) -> dict[str, Any]:
    """A saved param group with its stochastic rounding's seed: the one it holds (checked: an
    integer of 64 bits), or, from a checkpoint written before the seed was kept, the live group's."""
    seed = saved.get(ROUNDING_SEED)
    if seed is None:
        return {**saved, ROUNDING_SEED: live[ROUNDING_SEED]}
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"optimizer state: param group {index} {ROUNDING_SEED}={seed!r}: not an integer in [0, 2**64)")
    return saved


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
