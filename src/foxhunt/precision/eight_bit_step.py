"""The step of the 8-bit Adam(W) a run trains with: int8 weights, 8-bit states, exact resume.

:func:`foxhunt.precision.optim.convert_optimizer` builds torchao's ``Adam(W)8bit`` /
``Adam(W)Fp8`` with :class:`EightBitStep` mixed in: torchao's classes keep their states
(``OptimStateFp8`` / ``OptimState8bit``: one byte per element and one fp32 scale per
``optimizer_block_size`` elements), their state creation and their checkpoint layout; the step
is this module's. Per tensor:

- an int8 weight, or a tensor with 8-bit states: :func:`adam_update`, torch.compile'd once per
  shape (``compile_optimizer: false``, or under a ``TorchDispatchMode``: the same function run
  op by op), on the plain tensors inside torchao's subclasses;
- a tensor torchao keeps fp32 states for (under 4,096 elements, or not a multiple of the block
  size; never an int8 weight): with ``fuse_fp32_states`` one call of torch's fused Adam(W) kernel
  over all of them, else torchao's own per-tensor update.

Why the update is written here and not torchao's. torchao's update re-quantizes an int8 weight
through the weight subclass's ``copy_``, whose stochastic rounding draws ``torch.rand_like``: under
torch.compile on a CPU that is one scalar Philox call per element, most of the update's time, and
on every call the subclasses are flattened and rebuilt around the compiled graph. Here the draws are
a counter-based hash of (seed, tensor, step, element) in 32-bit integer arithmetic, which inductor
vectorizes, and the compiled function takes the subclasses' plain tensors: a few times faster per
element than torchao's update on a CPU, the same math otherwise (measured: ``scripts/bench_int8_step.py
--parts``; figures in docs/benchmarks.md). One compiled call over all tensors (a multi-tensor
update) was measured too: no faster at run time, and its compilation takes minutes.

What the update keeps:

- the moments: dequantized, updated in fp32 as torchao's ``single_param_adam``, re-quantized per
  block with torchao's own quantizers (``quantize_fp8``; ``scale_tensor`` and
  ``quantize_8bit_with_qmap`` for dynamic-map codes);
- an int8 weight: re-quantized per row as torchao's ``quantize_int8_rowwise`` (absmax / 127 per
  row), each value ``x`` (in int8 steps) rounded up with probability ``x - floor(x)``, else down
  (:func:`stochastic_round`: unbiased up to 2^-24 of one int8 step), so updates far smaller than
  a row's step are kept on average;
- exact resume: the draws of a step are a function of the group's ``rounding_seed``
  (:data:`ROUNDING_SEED`: ``torch.initial_seed()`` when the group is built, saved and restored with
  the optimizer's state dict), the tensor's position in the optimizer, its ``step`` and the
  element's index, all in a checkpoint: an optimizer restored from one takes the next step bit
  for bit as the optimizer that wrote it would have. No generator state is read or advanced.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor
from torch.optim.adam import adam
from torch.utils._python_dispatch import _get_current_dispatch_mode

# Lazy imports: (c) torchao and foxhunt.precision.quantize (which imports torchao, seconds), in the update's functions: every model imports this module through make_optimizer (foxhunt.precision.optim), a run needs torchao only when it trains with 8-bit states

#: The param-group key of the seed of an optimizer's stochastic rounding (see the module doc).
ROUNDING_SEED = "rounding_seed"
#: The smallest row scale the re-quantization divides by (torchao's ``quantize_int8_rowwise``).
_ROW_EPS = 1e-12
_INT8_MAX = 127

_MASK64 = (1 << 64) - 1
_GOLDEN64 = 0x9E3779B97F4A7C15


def _mix64(z: int) -> int:
    """SplitMix64's finalizer: a bijection of 64-bit integers that mixes every bit into every other."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def rounding_key(seed: int, tensor: int, step: int) -> tuple[int, int]:
    """The two signed 32-bit words keying the draws of ``tensor`` (its position in the optimizer)
    at ``step`` under ``seed``."""
    z = _mix64(_mix64(_mix64((seed & _MASK64) ^ _GOLDEN64) ^ tensor) ^ (step & _MASK64))
    low, high = z & 0xFFFFFFFF, z >> 32
    return low - (1 << 32) * (low >> 31), high - (1 << 32) * (high >> 31)


def _hash32(x: Tensor) -> Tensor:
    """Chris Wellons' ``lowbias32`` on int32 tensors (wrapping products; logical shifts by masks):
    a bijection of 32-bit integers with low bias, in operations every torch backend vectorizes."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * 0x7FEB352D
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * -0x7B935975  # 0x846CA68B as a signed 32-bit integer
    return x ^ ((x >> 16) & 0xFFFF)


def uniform(key: Tensor, shape: torch.Size) -> Tensor:
    """Uniform draws in [0, 1) on a grid of 2^-24, one per element of ``shape`` (row-major index),
    from ``key`` (two int32 words, :func:`rounding_key`): the same numbers eager and compiled, on
    every device, for the same key."""
    index = torch.arange(shape.numel(), dtype=torch.int32, device=key.device).view(shape)
    bits = _hash32(_hash32(index + key[0]) + key[1])
    return ((bits >> 8) & 0xFFFFFF).float() * (1.0 / (1 << 24))


def stochastic_round(x: Tensor, u: Tensor) -> Tensor:
    """``x`` rounded to an integer: up with probability ``frac(x)`` given uniform draws ``u``, so
    the expected result is ``x`` (to the draws' 2^-24 grid). The fraction is exact in float
    arithmetic, unlike ``floor(x + u)``, whose sum rounds ``u`` to the precision left beside ``x``."""
    down = x.floor()
    return down + (u < x - down).to(x.dtype)


def requantize_rows(value: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
    """``value`` (rows, columns) as int8 values and one fp32 absmax scale per row, stochastically
    rounded with the draws of ``key``: torchao's ``quantize_int8_rowwise(stochastic_rounding=True)``
    with counter-based draws."""
    scale = value.abs().amax(1) / _INT8_MAX
    scaled = value.float() * (1.0 / scale.float().clip(_ROW_EPS)).view(-1, 1)
    codes = stochastic_round(scaled, uniform(key, scaled.shape)).clip(-_INT8_MAX - 1, _INT8_MAX).to(torch.int8)
    return codes, scale


# -- the tensors of an update, as tuples of plain tensors -----------------------------------------
# a weight: (fp32,) or (int8 values, row scales); a state: (fp32,), (fp8 codes, block scales) or
# (dynamic-map codes, block scales, qmap): plain tensors, so the compiled graph takes them as they are.
def _state_value(state: tuple[Tensor, ...]) -> Tensor:
    from torchao.optim.quant_utils import dequant_with_qmap

    if len(state) == 1:
        return state[0].float()
    if len(state) == 3:
        codes, scale, qmap = state
        return dequant_with_qmap(codes, qmap, scale)
    codes, scale = state  # fp8: OptimStateFp8.dequantize
    return (codes.float().view(-1, codes.numel() // scale.numel()) * scale.view(-1, 1)).view(codes.shape)


def _store_state(state: tuple[Tensor, ...], value: Tensor) -> None:
    from torchao.optim.quant_utils import quantize_8bit_with_qmap, scale_tensor
    from torchao.optim.subclass_fp8 import quantize_fp8

    if len(state) == 1:
        state[0].copy_(value)
        return
    codes, scale = state[0], state[1]
    block = codes.numel() // scale.numel()
    if len(state) == 3:
        scaled, new_scale = scale_tensor(value, block)
        new_codes = quantize_8bit_with_qmap(scaled, state[2])
    else:
        new_codes, new_scale = quantize_fp8(value, block)
    codes.copy_(new_codes)
    scale.copy_(new_scale)


def _weight_value(weight: tuple[Tensor, ...]) -> Tensor:
    if len(weight) == 1:
        return weight[0].float()
    values, scale = weight  # Int8QuantizedTrainingLinearWeight.dequantize
    return values * scale.view(-1, 1)


def _store_weight(weight: tuple[Tensor, ...], value: Tensor, key: Tensor) -> None:
    if len(weight) == 1:
        weight[0].copy_(value)
        return
    values, scale = weight
    new_values, new_scale = requantize_rows(value, key)
    values.copy_(new_values)
    scale.copy_(new_scale)


def adam_update(
    weight: tuple[Tensor, ...],
    grad: Tensor,
    exp_avg: tuple[Tensor, ...],
    exp_avg_sq: tuple[Tensor, ...],
    max_exp_avg_sq: tuple[Tensor, ...] | None,
    step: Tensor,
    lr: Tensor,
    key: Tensor,
    beta1: float,
    beta2: float,
    weight_decay: float,
    eps: float,
    adamw: bool,
) -> None:
    """One Adam(W) update of one tensor, in place: torchao's ``single_param_adam`` (the same fp32
    operations in the same order) on the tensors' plain parts (see the comment above), the int8
    weight re-quantized with the draws of ``key``."""
    p = _weight_value(weight)
    g = grad.float()
    if adamw:
        p = p - lr * weight_decay * p
    else:
        g = g + weight_decay * p
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    m = _state_value(exp_avg).lerp(g, 1 - beta1)
    v = _state_value(exp_avg_sq).lerp(g.square(), 1 - beta2)
    _store_state(exp_avg, m)
    _store_state(exp_avg_sq, v)
    if max_exp_avg_sq is not None:
        v = torch.maximum(_state_value(max_exp_avg_sq), v)
        _store_state(max_exp_avg_sq, v)
    denom = (v.sqrt() / bias_correction2.sqrt()) + eps
    _store_weight(weight, p - lr * (m / bias_correction1) / denom, key)


@functools.cache
def _compiled_update() -> Any:
    """:func:`adam_update` under torch.compile (one wrapper per process; a graph per shape and format)."""
    return torch.compile(adam_update, fullgraph=True, dynamic=False)


def _parts(tensor: Tensor) -> tuple[Tensor, ...]:
    """The plain tensors of a weight or a state (see the comment above :func:`_state_value`)."""
    from torchao.optim.subclass_8bit import OptimState8bit
    from torchao.optim.subclass_fp8 import OptimStateFp8

    from foxhunt.precision.quantize import is_int8_weight

    if is_int8_weight(tensor):
        return tensor.int_data, tensor.scale  # type: ignore[attr-defined]
    if isinstance(tensor, OptimStateFp8):
        return tensor.codes, tensor.scale
    if isinstance(tensor, OptimState8bit):
        return tensor.codes, tensor.scale, tensor.qmap
    return (tensor.detach(),)


class EightBitStep:
    """The step of torchao's 8-bit Adam(W) it is mixed into (see the module doc). ``compile_update``
    and ``fuse_fp32_states`` are set by :func:`foxhunt.precision.optim.convert_optimizer`."""

    # what it reads of the torchao optimizer it is mixed into
    block_size: int
    is_adamw: bool
    state: dict[Tensor, dict[str, Any]]
    param_groups: list[dict[str, Any]]
    compile_update: bool = True
    fuse_fp32_states: bool = False

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)  # type: ignore[misc]
        self.param_groups[-1].setdefault(ROUNDING_SEED, torch.initial_seed())

    def plain_fp32(self, p: Tensor) -> bool:
        """Whether ``p`` is an fp32 weight whose states torchao keeps in fp32 (its ``_new_buffer``
        rule: under 4,096 elements or not a multiple of the block size), updated as such (torch's
        fused Adam(W) or torchao's update); an int8 weight never is, whatever its states."""
        from foxhunt.precision.quantize import is_int8_weight

        return not is_int8_weight(p) and not (p.numel() >= 4096 and p.numel() % self.block_size == 0)

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 (torch's signature)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # under a TorchDispatchMode (one that watches every op) torch.compile cannot trace: op by op
        compiled = self.compile_update and _get_current_dispatch_mode() is None
        with torch._dynamo.utils.disable_cache_limit():  # a graph per shape and state format: a model has few
            self._step_groups(compiled)
        return loss

    def _step_groups(self, compiled: bool) -> None:
        position = 0
        for group in self.param_groups:
            if not isinstance(group["lr"], Tensor):
                raise RuntimeError("lr was changed to a non-Tensor object: set it with param_groups[i]['lr'].fill_(new_lr)")
            fused = []
            for p in group["params"]:
                position += 1
                grad = p.grad
                if grad is None:
                    continue
                if grad.is_sparse:
                    raise RuntimeError("Sparse gradient is not supported")
                state = self.state[p]
                if len(state) == 0:
                    self._init_state(p, state, group)
                if self.fuse_fp32_states and self.plain_fp32(p) and not group["amsgrad"]:
                    fused.append(p)
                else:
                    state["step"] += 1
                    self._update(p, grad, state, group, position - 1, compiled)
            if fused:
                self._fused_update(group, fused)

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        """The states of ``p``, as torchao's step initializes them."""
        new_buffer = self._new_buffer  # type: ignore[attr-defined]
        state["step"] = torch.tensor(0.0)
        state["exp_avg"] = new_buffer(p, True)
        state["exp_avg_sq"] = new_buffer(p, False)
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = new_buffer(p, False)

    def _update(
        self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any], position: int, compiled: bool
    ) -> None:
        beta1, beta2 = group["betas"]
        if self.plain_fp32(p):  # fp32 weight and states: torchao's update
            from torchao.optim.adam import single_param_adam

            update = torch.compile(single_param_adam, fullgraph=True, dynamic=False) if compiled else single_param_adam
            update(p.detach(), grad, state["step"], state["exp_avg"], state["exp_avg_sq"], state.get("max_exp_avg_sq"),
                   group["lr"], beta1, beta2, group["weight_decay"], group["eps"], self.is_adamw, False)  # fmt: skip
            return
        key = torch.tensor(
            rounding_key(int(group[ROUNDING_SEED]), position, int(state["step"])), dtype=torch.int32, device=p.device
        )
        maximum = state.get("max_exp_avg_sq")
        update = _compiled_update() if compiled else adam_update
        update(_parts(p), grad, _parts(state["exp_avg"]), _parts(state["exp_avg_sq"]),
               None if maximum is None else _parts(maximum), state["step"], group["lr"], key, beta1, beta2,
               group["weight_decay"], group["eps"], self.is_adamw)  # fmt: skip

    def _fused_update(self, group: dict[str, Any], params: list[Tensor]) -> None:
        """torch's fused Adam(W) over ``params`` (fp32 states, as torchao initializes them)."""
        states = [self.state[p] for p in params]
        beta1, beta2 = group["betas"]
        grads = [p.grad for p in params if p.grad is not None]  # step() passes tensors with a gradient only
        steps, lr = [s["step"] for s in states], group["lr"]
        device = params[0].device
        if device.type != "cpu":
            # A device's fused kernel reads the step counts and a tensor lr in device memory (a CPU
            # tensor there is an illegal memory access on CUDA); the states keep them on the CPU, as
            # torchao's step and its checkpoints do: counted on the device, copied back.
            steps, lr = [step.to(device) for step in steps], lr.to(device) if isinstance(lr, Tensor) else lr
        adam(params, grads, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [], steps,
             fused=True, decoupled_weight_decay=self.is_adamw, amsgrad=False, beta1=beta1, beta2=beta2, lr=lr,
             weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)  # fmt: skip
        for state, step in zip(states, steps, strict=True):
            if step is not state["step"]:
                state["step"].copy_(step)
