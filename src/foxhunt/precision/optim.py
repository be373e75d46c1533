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

torchao's optimizers also update int8 weights (they re-quantize the updated fp32 row with
stochastic rounding); torch's ``AdamW`` cannot (its decoupled weight decay multiplies the int8
tensor in place), so int8 weights need the 8-bit optimizers (the policy refuses int8 weights
without 8-bit states).

Checkpoints: an 8-bit optimizer's ``state_dict`` holds each 8-bit state as a plain dict
(``format``, ``codes``, ``scale``, ...) and ``load_state_dict`` rebuilds torchao's state
tensors from it (the optimizer's public state-dict hooks), for the reason int8 weights are
saved as plain tensors (:mod:`foxhunt.precision.quantize`): Lightning loads checkpoints with a
callable ``map_location``, under which torch cannot rebuild a tensor subclass.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from foxhunt.precision.policy import PrecisionPolicy

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
    if policy.fuse_fp32_states:
        cls = type(f"FusedFp32{cls.__name__}", (_FusedFp32States, cls), {})
    if policy.compile_optimizer:
        cls = type(cls.__name__, (_EagerUnderDispatchMode, cls), {})
    else:
        cls = type(f"Eager{cls.__name__}", (_EagerStep, cls), {})
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
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    devices = set(_get_fused_kernels_supported_devices())
    tensors = [t for p in params for t in (p["params"] if isinstance(p, dict) else [p])]
    return bool(tensors) and all(
        isinstance(t, torch.Tensor)
        and t.is_floating_point()
        and t.device.type in devices
        and type(t) in (torch.Tensor, torch.nn.Parameter)
        for t in tensors
    )


class _EagerStep:
    """torchao's step with its per-parameter ``torch.compile`` turned off (run eagerly)."""

    def step(self, closure=None):  # noqa: ANN001 (torch's signature)
        with torch.compiler.set_stance("force_eager"):
            return super().step(closure)


class _EagerUnderDispatchMode:
    """torchao's compiled step, run eagerly while a ``TorchDispatchMode`` is active.

    ``torch.compile(fullgraph=True)`` cannot trace under a non-infra dispatch mode ("found no
    compiled frames"): a mode that watches every op (the memory callback's allocator peak,
    :mod:`foxhunt.memory.allocations`; a FLOP counter) would stop the run at its first step.
    Under such a mode the update runs op by op, the same math, so the mode sees it; outside
    one (every other step) it runs compiled."""

    def step(self, closure=None):  # noqa: ANN001 (torch's signature)
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if _get_current_dispatch_mode() is None:
            return super().step(closure)
        with torch.compiler.set_stance("force_eager"):
            return super().step(closure)


class _FusedFp32States:
    """torchao's 8-bit Adam(W) whose plain fp32 tensors (those torchao keeps fp32 states for: fewer
    than 4,096 elements, or not a multiple of the block size; never an int8 weight) are updated by
    one call of torch's fused Adam(W) kernel over all of them, instead of one compiled torchao
    update per tensor, each with its guard checks and call overhead. Same states (``step``,
    ``exp_avg``, ``exp_avg_sq``, fp32 tensors), so the same memory and checkpoints; the tensors
    with 8-bit states and the int8 weights go through torchao's update as before."""

    # what it reads of the torchao optimizer it is mixed into
    block_size: int
    is_adamw: bool
    state: dict[torch.Tensor, dict[str, Any]]
    param_groups: list[dict[str, Any]]

    def _fp32_states(self, p: torch.Tensor) -> bool:
        return (type(p) in (torch.Tensor, torch.nn.Parameter) and p.is_floating_point()
                and not (p.numel() >= 4096 and p.numel() % self.block_size == 0))  # fmt: skip

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        held: list[tuple[dict, list[torch.Tensor], list[torch.Tensor]]] = []
        for group in self.param_groups:
            small = [p for p in group["params"] if p.grad is not None and self._fp32_states(p) and not group["amsgrad"]]
            grads = [p.grad for p in small]
            for p in small:  # torchao's loop skips a tensor without a gradient
                p.grad = None
            held.append((group, small, grads))
        try:
            super().step()
        finally:
            for _, small, grads in held:
                for p, grad in zip(small, grads):
                    p.grad = grad
        for group, small, grads in held:
            if small:
                self._fused_update(group, small, grads)
        return loss

    def _fused_update(self, group: dict, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        from torch.optim.adam import adam

        states = []
        for p in params:
            state = self.state[p]
            if len(state) == 0:  # as torchao initializes a tensor it keeps fp32 states for
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            states.append(state)
        beta1, beta2 = group["betas"]
        adam(params, grads, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [],
             [s["step"] for s in states], fused=True, decoupled_weight_decay=self.is_adamw, amsgrad=False,
             beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
             maximize=False)  # fmt: skip


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
    return state_dict


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
