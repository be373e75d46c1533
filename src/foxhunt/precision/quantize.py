"""Int8 weight storage for training: which layers, the conversion, the list of what was done.

The weight matrices a :class:`~foxhunt.precision.policy.PrecisionPolicy` selects are stored as
torchao's ``Int8QuantizedTrainingLinearWeight``: int8 values and one fp32 absmax scale per row;
the optimizer's update (:mod:`foxhunt.precision.eight_bit_step`) re-quantizes the updated row with
stochastic rounding, so small updates are not lost on average. The conversion is ``torchao.quantize_``
with :class:`Int8WeightTrainingConfig`, whose handler swaps

- ``nn.Linear`` -> :class:`Int8Linear`;
- ``nn.LSTM`` -> :class:`Int8LSTM`.

Both modules are written here rather than taken from torchao for two reasons. torchao's
``Int8WeightOnlyQuantizedTrainingConfig`` converts linear layers only, and an LSTM's gate
matrices are a quarter of the TFT's parameters. And its ``F.linear`` backward calls ``.view``
on its input and output gradient, which fails on the non-contiguous inputs the models pass
(the TFT feeds ``embedded[..., i, :]`` slices to its variable GRNs); it also computes the
input's gradient when none is needed and applies scale and bias as two extra passes over the
output. :func:`int8_linear` dequantizes the (small) weight matrix and runs one ``addmm``, and
its backward dequantizes again instead of saving an fp32 copy, so between the forward and the
backward only the int8 weight is held.

``Int8LSTM`` is ``nn.LSTM`` with int8 weight matrices: each forward dequantizes them through a
straight-through function (the matrix's gradient is the weight's gradient) and runs the fused
``torch.lstm`` kernel nn.LSTM runs; unlike nn.LSTM it keeps no flat weight list between calls,
which would keep the dequantized fp32 matrices alive.

:func:`quantization_plan` decides, per parameter, ``int8`` or ``fp32`` with the reason;
:func:`quantize_model` applies it (idempotent: an int8 weight is left as it is) and returns it;
:func:`plan_text` is the ``quantized_layers.txt`` a run logs. Parameter names and
``requires_grad`` are unchanged, so an int8 checkpoint has the keys of an fp32 one.

Checkpoints: an int8 module saves each int8 weight as two plain tensors, ``<name>`` (the
int8 values) and ``<name>_int8_scale`` (the fp32 row scales), and rebuilds the int8 weight
when it loads them (``_save_to_state_dict`` / ``_load_from_state_dict``, torch's hooks for a
module's own state layout). A plain representation rather than an allow-listed tensor
subclass: torch cannot rebuild a wrapper subclass under the callable ``map_location``
Lightning loads checkpoints with, and plain tensors load with ``torch.load(weights_only=True)``
anywhere, with nothing imported first. Loading an fp32 state dict into an int8 module
quantizes it; :func:`dequantize_state_dict` turns an int8 state dict into an fp32 one.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchao.core.config import AOBaseConfig
from torchao.prototype.quantized_training import Int8QuantizedTrainingLinearWeight
from torchao.quantization import quantize_
from torchao.quantization.transform_module import register_quantize_module_handler

from foxhunt.precision.policy import PrecisionPolicy

INT8 = "int8"
FP32 = "fp32"
QUANTIZED_LAYERS_FILE = "quantized_layers.txt"
#: Suffix of the state-dict entry holding an int8 weight's row scales.
SCALE_SUFFIX = "_int8_scale"


def is_int8_weight(tensor: Tensor) -> bool:
    return isinstance(tensor, Int8QuantizedTrainingLinearWeight)


def int8_weight(param: Tensor) -> nn.Parameter:
    """``param`` stored as an int8 training weight (no stochastic rounding here)."""
    return nn.Parameter(Int8QuantizedTrainingLinearWeight.from_float(param.detach()), requires_grad=param.requires_grad)


class _DequantizeStraightThrough(torch.autograd.Function):
    """int8 weight -> float matrix; the matrix's gradient is the weight's gradient."""

    @staticmethod
    def forward(ctx, weight: Tensor) -> Tensor:
        return weight.dequantize()

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad


def dequantized(weight: Tensor) -> Tensor:
    """``weight`` as a plain float matrix (differentiable); plain tensors pass through."""
    return _DequantizeStraightThrough.apply(weight) if is_int8_weight(weight) else weight


class _Int8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(input, weight)
        ctx.has_bias = bias is not None
        return F.linear(input, weight.dequantize().to(input.dtype), bias)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        input, weight = ctx.saved_tensors
        need_input, need_weight, need_bias = ctx.needs_input_grad
        grad_input = grad_weight = grad_bias = None
        if need_input:
            grad_input = grad_output @ weight.dequantize().to(grad_output.dtype)
        rows = grad_output.reshape(-1, grad_output.shape[-1])
        if need_weight:
            grad_weight = rows.T @ input.reshape(-1, input.shape[-1])
        if need_bias and ctx.has_bias:
            grad_bias = rows.sum(0)
        return grad_input, grad_weight, grad_bias


def int8_linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear`` with an int8 training weight (see the module doc); plain weights: F.linear."""
    if not is_int8_weight(weight):
        return F.linear(input, weight, bias)
    return _Int8Linear.apply(input, weight, bias)


class _Int8StateDict:
    """State-dict layout of an int8 module: each int8 weight as int8 values + row scales."""

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # noqa: ANN001 (torch's signature)
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, param in self._parameters.items():
            if param is not None and is_int8_weight(param):
                destination[prefix + name] = param.int_data if keep_vars else param.int_data.detach()
                destination[prefix + name + SCALE_SUFFIX] = param.scale if keep_vars else param.scale.detach()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # noqa: ANN001 (torch's signature)
        for name in self._parameters:
            scale = state_dict.pop(prefix + name + SCALE_SUFFIX, None)
            if scale is not None and prefix + name in state_dict:
                state_dict[prefix + name] = Int8QuantizedTrainingLinearWeight(state_dict[prefix + name], scale)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def dequantize_state_dict(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """An int8 module's state dict as the fp32 state dict of the same model without int8 weights."""
    plain = {}
    for key, value in state_dict.items():
        if key.endswith(SCALE_SUFFIX):
            continue
        scale = state_dict.get(key + SCALE_SUFFIX)
        plain[key] = value if scale is None else value.to(scale.dtype) * scale.view(-1, 1)
    return plain


class Int8Linear(_Int8StateDict, nn.Linear):
    """``nn.Linear`` whose weight is an int8 training weight; built by :meth:`from_float`."""

    @classmethod
    def from_float(cls, linear: nn.Linear) -> Int8Linear:
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        new.weight = int8_weight(linear.weight)
        new.bias = linear.bias
        new.train(linear.training)
        return new

    def to_float(self) -> nn.Linear:
        plain = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        weight = self.weight
        plain.weight = nn.Parameter(
            weight.dequantize() if is_int8_weight(weight) else weight.detach(), requires_grad=weight.requires_grad
        )
        plain.bias = self.bias
        plain.train(self.training)
        return plain

    def forward(self, input: Tensor) -> Tensor:
        return int8_linear(input, self.weight, self.bias)


class Int8LSTM(_Int8StateDict, nn.LSTM):
    """``nn.LSTM`` whose weight matrices may be int8 (see the module doc). Batched inputs
    (3-D tensors) only; built from an ``nn.LSTM`` by :meth:`from_float`."""

    @classmethod
    def from_float(cls, lstm: nn.LSTM, min_numel: int) -> Int8LSTM:
        """Weight matrices with at least ``min_numel`` elements become int8."""
        if lstm.proj_size:
            raise ValueError("Int8LSTM: LSTMs with proj_size > 0 are not converted")
        new = cls(**_lstm_arguments(lstm), device="meta")  # parameters replaced below
        for name in lstm._flat_weights_names:
            param = getattr(lstm, name)
            big_matrix = name.startswith("weight_") and param.numel() >= min_numel
            setattr(new, name, int8_weight(param) if big_matrix and not is_int8_weight(param) else param)
        new.train(lstm.training)
        return new

    def to_float(self) -> nn.LSTM:
        """A plain ``nn.LSTM`` with the dequantized weights."""
        plain = nn.LSTM(**_lstm_arguments(self), device="meta")
        for name in self._flat_weights_names:
            param = getattr(self, name)
            value = param.dequantize() if is_int8_weight(param) else param.detach()
            setattr(plain, name, nn.Parameter(value, requires_grad=param.requires_grad))
        plain.flatten_parameters()
        plain.train(self.training)
        return plain

    def flatten_parameters(self) -> None:
        """No cuDNN flat weight buffer: it would hold an fp32 copy of the int8 weights."""

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None):  # type: ignore[override]  # batched tensors only, no PackedSequence
        if not isinstance(input, Tensor) or input.dim() != 3:
            raise ValueError("Int8LSTM: input must be a batched 3-D tensor (packed sequences are not supported)")
        if hx is None:
            batch = input.shape[0] if self.batch_first else input.shape[1]
            directions = 2 if self.bidirectional else 1
            zeros = input.new_zeros(self.num_layers * directions, batch, self.hidden_size)
            hx = (zeros, zeros)
        weights = [dequantized(getattr(self, name)) for name in self._flat_weights_names]
        output, h, c = torch.lstm(
            input, hx, weights, self.bias, self.num_layers, float(self.dropout), self.training,
            self.bidirectional, self.batch_first,
        )  # fmt: skip
        return output, (h, c)


def _lstm_arguments(lstm: nn.LSTM) -> dict:
    return {
        "input_size": lstm.input_size,
        "hidden_size": lstm.hidden_size,
        "num_layers": lstm.num_layers,
        "bias": lstm.bias,
        "batch_first": lstm.batch_first,
        "dropout": lstm.dropout,
        "bidirectional": lstm.bidirectional,
    }


@dataclass
class Int8WeightTrainingConfig(AOBaseConfig):
    """torchao config: int8 training weights for Linear and LSTM modules (see the module doc);
    an LSTM weight matrix under ``min_numel`` elements stays fp32."""

    min_numel: int


@register_quantize_module_handler(Int8WeightTrainingConfig)
def _int8_weight_training_transform(module: nn.Module, config: Int8WeightTrainingConfig) -> nn.Module:
    if isinstance(module, nn.LSTM):
        return Int8LSTM.from_float(module, config.min_numel)
    if isinstance(module, nn.Linear) and not isinstance(module, Int8Linear):
        return Int8Linear.from_float(module)
    return module


# -- the plan --------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerDecision:
    """What a parameter is stored as under a policy, and why."""

    name: str  # parameter name, as in the state dict
    module_type: str
    shape: tuple[int, ...]
    storage: str  # INT8 or FP32
    reason: str

    @property
    def int8(self) -> bool:
        return self.storage == INT8

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def int8_share(plan: list[LayerDecision]) -> tuple[int, float]:
    """(int8 weight tensors, % of the parameter elements they hold) of a plan."""
    total = sum(d.numel for d in plan) or 1
    return sum(d.int8 for d in plan), 100.0 * sum(d.numel for d in plan if d.int8) / total


def _weight_matrices(module: nn.Module) -> list[str]:
    """Names (within ``module``) of the weight matrices a quantizable module type has."""
    if isinstance(module, nn.Linear):
        return ["weight"]
    if isinstance(module, nn.LSTM) and not module.proj_size:
        return [n for n in module._flat_weights_names if n.startswith("weight_")]
    return []


def _type_key(module: nn.Module) -> str | None:
    if isinstance(module, nn.Linear):
        return "Linear"
    if isinstance(module, nn.LSTM):
        return "LSTM"
    return None


def quantization_plan(model: nn.Module, policy: PrecisionPolicy) -> list[LayerDecision]:
    """Per parameter of ``model`` (state-dict order): int8 or fp32 under ``policy``, and why."""
    decisions = []
    for module_name, module in model.named_modules():
        type_key = _type_key(module)
        matrices = _weight_matrices(module) if type_key in policy.quantize_types else []
        pattern = next((p for p in policy.keep_fp32 if fnmatch.fnmatchcase(module_name, p)), None)
        for param_name, param in module.named_parameters(recurse=False):
            name = f"{module_name}.{param_name}" if module_name else param_name
            decisions.append(
                LayerDecision(
                    name=name,
                    module_type=type(module).__name__,
                    shape=tuple(param.shape),
                    **_decide(param_name, param, matrices, pattern, policy),
                )
            )
    return decisions


def _decide(param_name: str, param: Tensor, matrices: list[str], pattern: str | None, policy: PrecisionPolicy) -> dict:
    if is_int8_weight(param):
        return {"storage": INT8, "reason": "int8 weight (row-wise absmax scale)"}
    if not policy.quantizes_weights:
        return {"storage": FP32, "reason": f"precision {policy.name} keeps weights in fp32"}
    if param_name not in matrices:
        what = "bias" if param_name.startswith("bias") else "not a weight matrix of " + "/".join(policy.quantize_types)
        return {"storage": FP32, "reason": what}
    if pattern is not None:
        return {"storage": FP32, "reason": f"kept: module name matches keep_fp32 pattern {pattern!r}"}
    if param.numel() < policy.int8_min_numel:
        return {
            "storage": FP32,
            "reason": f"kept: {param.numel()} elements < min_quantized_numel {policy.min_quantized_numel}",
        }
    return {"storage": INT8, "reason": "int8 weight (row-wise absmax scale)"}


def quantize_model(model: nn.Module, policy: PrecisionPolicy) -> list[LayerDecision]:
    """Store the weight matrices ``policy`` selects as int8, in place; return the plan.

    Idempotent: weights that are int8 already are left as they are (Lightning runs the setup
    hooks again for ``trainer.test``). A policy with fp32 weights changes nothing.
    """
    plan = quantization_plan(model, policy)
    if not policy.quantizes_weights:
        return plan
    pending = {d.name for d in plan if d.int8}
    targets = set()
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        for param_name in _weight_matrices(module):
            param = getattr(module, param_name)
            if f"{prefix}{param_name}" in pending and not is_int8_weight(param):
                targets.add(module_name)
    if targets:
        quantize_(
            model,
            Int8WeightTrainingConfig(min_numel=policy.int8_min_numel),
            filter_fn=lambda module, fqn: fqn in targets,
        )
    return plan


def dequantize_model(model: nn.Module) -> nn.Module:
    """Turn every int8 training weight of ``model`` back into a plain float parameter, in place
    (``Int8Linear`` -> ``nn.Linear``, ``Int8LSTM`` -> ``nn.LSTM``); returns ``model``."""
    for module_name, module in list(model.named_modules()):
        if isinstance(module, (Int8Linear, Int8LSTM)):
            _replace_module(model, module_name, module.to_float())
    return model


def _replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def plan_text(plan: list[LayerDecision], policy: PrecisionPolicy) -> str:
    """The ``quantized_layers.txt`` of a run: the rule, then every parameter, int8 ones first."""
    int8 = [d for d in plan if d.int8]
    fp32 = [d for d in plan if not d.int8]
    int8_numel = sum(d.numel for d in int8)
    total = sum(d.numel for d in plan)
    lines = [
        f"precision: {policy.name} (weights {policy.weights}, optimizer states {policy.optimizer_states})",
        f"rule: types {', '.join(policy.quantize_types) or '-'}; min_quantized_numel "
        f"{policy.min_quantized_numel}; keep_fp32 {', '.join(policy.keep_fp32) or '-'}",
        f"int8 parameters: {len(int8)} tensors, {int8_numel:,} of {total:,} elements ({int8_share(plan)[1]:.1f}%)",
        "",
        f"# int8 ({len(int8)})",
        *(f"{d.name}\t{d.module_type}\t{list(d.shape)}" for d in int8),
        "",
        f"# fp32 ({len(fp32)})",
        *(f"{d.name}\t{d.module_type}\t{list(d.shape)}\t{d.reason}" for d in fp32),
    ]
    return "\n".join(lines) + "\n"
