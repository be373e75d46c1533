"""The weights of a trained member, read out of its torch module once, for the batch-1 runtimes.

At batch 1 a small network is bound by dispatch and memory traffic, not arithmetic: torch eager
spends microseconds per operator on argument checks, dispatch keys and autograd bookkeeping
(about 25 us for the DQN's three layers on an AVX-512 CPU), numpy about one, a numba kernel
(:mod:`foxhunt.ensemble.kernels`) a fraction. So a member can run the same math outside torch,
on these arrays (float32 arrays share memory with the module's CPU parameters, which a member
never changes; int8 codes and scales are new arrays): :func:`mlp_layers` for the agents' greedy network (numba or numpy), and
:func:`mamba2_arrays` for the Mamba-2 step (numba), in float32 or, for int8, with each weight
matrix as int8 codes and one float32 scale per row. Which runtime a member uses is chosen by
measurement (:mod:`foxhunt.ensemble.members`), and the parity tests hold every runtime to the
module's own outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from foxhunt.ensemble.kernels import ACTIVATIONS, quantize_rows

if TYPE_CHECKING:
    from foxhunt.models.mamba2 import Mamba2Forecaster


class UnsupportedModule(ValueError):
    """The module holds a layer these runtimes do not implement (the torch runtime runs it)."""


def _array(tensor: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.detach().to("cpu", torch.float32).numpy())


def _plain(parameters) -> bool:
    return all(type(p) in (torch.Tensor, nn.Parameter) for p in parameters)


NUMPY_ACTIVATIONS = {
    ACTIVATIONS["relu"]: lambda x: np.maximum(x, 0.0, out=x),
    ACTIVATIONS["tanh"]: lambda x: np.tanh(x, out=x),
    ACTIVATIONS["silu"]: lambda x: x / (1.0 + np.exp(-x)),
    ACTIVATIONS["elu"]: lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
}
_TORCH_ACTIVATIONS = {nn.ReLU: "relu", nn.Tanh: "tanh", nn.SiLU: "silu", nn.ELU: "elu"}


def mlp_layers(sequential: nn.Sequential) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """An ``nn.Sequential`` of ``Linear`` and activation layers as (weight (O, F), bias (O,),
    activation code of :data:`foxhunt.ensemble.kernels.ACTIVATIONS`) per linear layer."""
    layers: list[list] = []
    for layer in sequential:
        if isinstance(layer, nn.Linear) and _plain(layer.parameters()):
            bias = _array(layer.bias) if layer.bias is not None else np.zeros(layer.out_features, np.float32)
            layers.append([_array(layer.weight), bias, ACTIVATIONS["identity"]])
        elif type(layer) in _TORCH_ACTIVATIONS and layers and layers[-1][2] == ACTIVATIONS["identity"]:
            if isinstance(layer, nn.ELU) and layer.alpha != 1.0:
                raise UnsupportedModule("runtime: ELU with alpha != 1")
            layers[-1][2] = ACTIVATIONS[_TORCH_ACTIVATIONS[type(layer)]]
        else:
            raise UnsupportedModule(f"runtime: no {type(layer).__name__} layer here")
    return [tuple(layer) for layer in layers]


def _matrix(tensor: torch.Tensor, int8: bool) -> tuple[np.ndarray, np.ndarray]:
    """(weights, per-row scales): float32 and ones, or int8 codes and their scales."""
    if not isinstance(tensor, torch.Tensor):  # a quantized layer's weight() is a method: torch runs it
        raise UnsupportedModule(f"runtime: a {type(tensor).__name__} weight, not a tensor (a quantized layer)")
    values = _array(tensor)
    return quantize_rows(values) if int8 else (values, np.ones(values.shape[:-1], np.float32))


@dataclass
class Mamba2Arrays:
    """The arguments of :func:`foxhunt.ensemble.kernels.mamba2_step` that are the model's:
    ``weights`` (in the kernel's order) and ``dims``; the state shapes."""

    weights: tuple
    dims: tuple
    conv_shape: tuple[int, ...]
    ssm_shape: tuple[int, ...]

    def zero_state(self, slots: int) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros((slots, *self.conv_shape), np.float32), np.zeros((slots, *self.ssm_shape), np.float32)


def mamba2_arrays(model: Mamba2Forecaster, int8: bool = False) -> Mamba2Arrays:
    """The weights of a :class:`foxhunt.models.mamba2.Mamba2Forecaster` for the numba step;
    ``int8``: its input, block and head projections as int8 rows with scales."""
    if not _plain(model.parameters()):
        raise UnsupportedModule("runtime: quantized weights (an int8 torch copy runs in torch)")
    blocks: list[Any] = list(model.backbone.layers)  # Mamba2Blocks (a ModuleList yields nn.Modules)
    mixers = [b.mixer for b in blocks]
    first = mixers[0]

    def stack(get) -> np.ndarray:
        return np.ascontiguousarray(np.stack([get(m) for m in mixers]).astype(np.float32))

    def stacked_matrix(get) -> tuple[np.ndarray, np.ndarray]:
        pairs = [_matrix(get(m), int8) for m in mixers]
        return np.ascontiguousarray(np.stack([w for w, _ in pairs])), np.ascontiguousarray(np.stack([s for _, s in pairs]))

    input_w, input_s = _matrix(model.input_proj.weight, int8)
    in_w, in_s = stacked_matrix(lambda m: m.in_proj.weight)
    out_w, out_s = stacked_matrix(lambda m: m.out_proj.weight)
    head_w, head_s = _matrix(model.head.linear.weight, int8)
    conv_b = stack(lambda m: m.conv1d.bias.detach().numpy() if m.conv1d.bias is not None else np.zeros(m.conv_dim, np.float32))
    weights = (
        input_w, input_s, _array(model.input_proj.bias),
        np.ascontiguousarray(np.stack([_array(b.norm.weight) for b in blocks])), np.float32(blocks[0].norm.eps),
        in_w, in_s, stack(lambda m: _array(m.in_proj.bias)),
        stack(lambda m: _array(m.conv1d.weight.squeeze(1))), conv_b,
        stack(lambda m: _array(m.dt_bias)), stack(lambda m: -np.exp(_array(m.A_log))), stack(lambda m: _array(m.D)),
        stack(lambda m: _array(m.norm.weight)), np.float32(first.norm.eps), int(first.norm.group_size),
        out_w, out_s, stack(lambda m: _array(m.out_proj.bias)),
        _array(model.backbone.norm_f.weight), np.float32(model.backbone.norm_f.eps),
        head_w, head_s, _array(model.head.linear.bias),
    )  # fmt: skip
    dims = (first.d_inner, first.conv_dim, first.nheads, first.headdim, first.ngroups, first.d_state)
    layers = len(mixers)
    return Mamba2Arrays(weights, dims, (layers, first.conv_dim, first.d_conv),
                        (layers, first.nheads, first.headdim, first.d_state))  # fmt: skip
