"""The weights of a trained member, read out of its torch module once, for the batch-1 runtimes.

At batch 1 a small network is bound by dispatch and memory traffic, not arithmetic: torch eager
spends microseconds per operator on argument checks, dispatch keys and autograd bookkeeping,
numpy about one, a numba kernel (:mod:`foxhunt.ensemble.kernels`) a fraction. So a member can run
the same math outside torch, on these arrays (float32 arrays share memory with the module's CPU
parameters, which a member never changes; int8 codes and scales are new arrays).

Each torch layer type a kernel implements has one reader here, giving that kernel's arguments:
:func:`linear_arrays` (``nn.Linear``, float32 or int8 rows with one scale each), :func:`rms_norm_arrays`,
:func:`conv_step_arrays` (a depthwise causal ``nn.Conv1d``), :func:`ssm_arrays` (a Mamba-2 mixer's
dt_bias, A, D), :func:`gated_rms_norm_arrays`; a layer of any other type, or a quantized torch layer, is
refused (:class:`UnsupportedModule`: the member runs torch). A model's arrays are its layers' in the
model's order: :func:`mlp_layers` for the agents' greedy network (numba or numpy), :func:`mamba2_arrays`
for :func:`foxhunt.ensemble.kernels.mamba2_step` (the input projection, each block's layers by
:func:`mamba2_block_arrays`, stacked over ``backbone.blocks``, the final norm, the head). Which runtime
a member uses is chosen by measurement (:mod:`foxhunt.ensemble.members`), and the parity tests hold
every runtime to the module's own outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from foxhunt.ensemble.kernels import ACTIVATIONS, quantize_rows
from foxhunt.models.mamba2 import GatedRMSNorm, Mamba2Block, Mamba2Forecaster, Mamba2Mixer

L = TypeVar("L", bound=nn.Module)


class UnsupportedModule(ValueError):
    """The module holds a layer these runtimes do not implement (the torch runtime runs it)."""


def _array(tensor: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.detach().to("cpu", torch.float32).numpy())


def _plain(parameters) -> bool:
    return all(type(p) in (torch.Tensor, nn.Parameter) for p in parameters)


def _matrix(tensor: torch.Tensor, int8: bool) -> tuple[np.ndarray, np.ndarray]:
    """(weights, per-row scales): float32 and ones, or int8 codes and their scales."""
    if not isinstance(tensor, torch.Tensor):  # a quantized layer's weight() is a method: torch runs it
        raise UnsupportedModule(f"runtime: a {type(tensor).__name__} weight, not a tensor (a quantized layer)")
    values = _array(tensor)
    return quantize_rows(values) if int8 else (values, np.ones(values.shape[:-1], np.float32))


def _as(layer: object, kind: type[L], what: str) -> L:
    """``layer`` as the layer type ``kind`` a kernel implements; any other type: UnsupportedModule."""
    if not isinstance(layer, kind):
        name = f"{type(layer).__module__}.{type(layer).__qualname__}"
        raise UnsupportedModule(f"runtime: a {name} where the kernels take {what}")
    return layer


# ------------------------------------------------------------ one layer each: the kernels' arguments
def linear_arrays(layer: nn.Module, int8: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An ``nn.Linear`` for :func:`foxhunt.ensemble.kernels.linear_row`: (weight (O, F), per-row scale (O,),
    bias (O,)), the weight float32 with unit scales or, ``int8``, int8 codes with their scales."""
    layer = _as(layer, nn.Linear, "an nn.Linear")
    if not _plain(layer.parameters()):
        raise UnsupportedModule("runtime: quantized weights (an int8 torch copy runs in torch)")
    weight, scale = _matrix(layer.weight, int8)
    bias = layer.bias
    return weight, scale, _array(bias) if bias is not None else np.zeros(len(weight), np.float32)


def rms_norm_arrays(norm: nn.Module) -> tuple[np.ndarray, np.float32]:
    """An ``nn.RMSNorm`` over the last axis for :func:`foxhunt.ensemble.kernels.rms_norm`: (weight, eps)
    (ones without an affine weight; torch's float32 epsilon where eps is None, as torch does)."""
    norm = _as(norm, nn.RMSNorm, "an nn.RMSNorm")
    if len(norm.normalized_shape) != 1:
        raise UnsupportedModule(f"runtime: an RMSNorm over {len(norm.normalized_shape)} axes, not the last one")
    weight = _array(norm.weight) if norm.weight is not None else np.ones(norm.normalized_shape, np.float32)
    return weight, np.float32(np.finfo(np.float32).eps if norm.eps is None else norm.eps)


def conv_step_arrays(conv: nn.Module) -> tuple[np.ndarray, np.ndarray]:
    """A depthwise causal ``nn.Conv1d`` (groups = channels, stride and dilation 1, zero padding
    kernel_size - 1) for :func:`foxhunt.ensemble.kernels.depthwise_conv_step`: (weight (C, K), bias (C,))."""
    conv = _as(conv, nn.Conv1d, "an nn.Conv1d")
    channels, (width,) = conv.in_channels, conv.kernel_size
    if (conv.groups, conv.out_channels, conv.stride, conv.dilation, conv.padding, conv.padding_mode) != (
        channels, channels, (1,), (1,), (width - 1,), "zeros"
    ):  # fmt: skip
        raise UnsupportedModule("runtime: a Conv1d that is not depthwise and causal "
                                "(groups = channels, stride 1, dilation 1, zero padding kernel_size - 1)")  # fmt: skip
    bias = _array(conv.bias) if conv.bias is not None else np.zeros(channels, np.float32)
    return _array(conv.weight.squeeze(1)), bias


def ssm_arrays(mixer: nn.Module) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Mamba-2 mixer's selective state space parameters for
    :func:`foxhunt.ensemble.kernels.selective_state_step`: (dt_bias, A = -exp(A_log), D), one per head."""
    mixer = _as(mixer, Mamba2Mixer, "a Mamba2Mixer")
    return _array(mixer.dt_bias), -np.exp(_array(mixer.A_log)), _array(mixer.D)


def gated_rms_norm_arrays(norm: nn.Module) -> tuple[np.ndarray, np.float32, int]:
    """A :class:`foxhunt.models.mamba2.GatedRMSNorm` for :func:`foxhunt.ensemble.kernels.gated_rms_norm`:
    (weight, eps, group size)."""
    norm = _as(norm, GatedRMSNorm, "a GatedRMSNorm")
    return _array(norm.weight), np.float32(norm.eps), int(norm.group_size)


def _stacked(layers: list[tuple]) -> tuple:
    """The arguments of equal layers (one tuple each, in order), each array stacked on a new first axis;
    a scalar argument is the layers' one value."""
    stacked: list[Any] = []
    for position, values in enumerate(zip(*layers)):
        if isinstance(values[0], np.ndarray):
            if len({(v.shape, v.dtype) for v in values}) > 1:
                raise UnsupportedModule(f"runtime: the blocks' argument {position} differs in shape or dtype")
            stacked.append(np.ascontiguousarray(np.stack(values)))
        elif len(set(values)) > 1:
            raise UnsupportedModule(f"runtime: the blocks' argument {position} differs: {sorted(set(values))}")
        else:
            stacked.append(values[0])
    return tuple(stacked)


# ------------------------------------------------------------------------------- the agents' MLP
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
        if isinstance(layer, nn.Linear):
            weight, _, bias = linear_arrays(layer)
            layers.append([weight, bias, ACTIVATIONS["identity"]])
        elif type(layer) in _TORCH_ACTIVATIONS and layers and layers[-1][2] == ACTIVATIONS["identity"]:
            if isinstance(layer, nn.ELU) and layer.alpha != 1.0:
                raise UnsupportedModule("runtime: ELU with alpha != 1")
            layers[-1][2] = ACTIVATIONS[_TORCH_ACTIVATIONS[type(layer)]]
        else:
            raise UnsupportedModule(f"runtime: no {type(layer).__name__} layer here")
    return [tuple(layer) for layer in layers]


# ------------------------------------------------------------------------------- Mamba-2
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


def mamba2_block_arrays(block: nn.Module, int8: bool = False) -> tuple:
    """One :class:`foxhunt.models.mamba2.Mamba2Block`'s layers in their order, each as its kernel's arguments:
    pre-norm, in_proj, conv1d, the selective state space, the gated norm, out_proj."""
    block = _as(block, Mamba2Block, "a Mamba2Block")
    mixer = block.mixer
    return (*rms_norm_arrays(block.norm), *linear_arrays(mixer.in_proj, int8), *conv_step_arrays(mixer.conv1d),
            *ssm_arrays(mixer), *gated_rms_norm_arrays(mixer.norm), *linear_arrays(mixer.out_proj, int8))  # fmt: skip


def mamba2_arrays(model: Mamba2Forecaster, int8: bool = False) -> Mamba2Arrays:
    """The weights of a :class:`foxhunt.models.mamba2.Mamba2Forecaster` for the numba step, read layer by
    layer in the model's order: input projection, its blocks (``backbone.blocks``, stacked), final norm, head;
    ``int8``: every projection as int8 rows with scales. A layer the kernels do not implement: UnsupportedModule."""
    blocks = model.backbone.blocks
    weights = (*linear_arrays(model.input_proj, int8), *_stacked([mamba2_block_arrays(b, int8) for b in blocks]),
               *rms_norm_arrays(model.backbone.norm_f), *linear_arrays(model.head.linear, int8))  # fmt: skip
    first = blocks[0].mixer
    dims = (first.d_inner, first.conv_dim, first.nheads, first.headdim, first.ngroups, first.d_state)
    return Mamba2Arrays(weights, dims, (len(blocks), first.conv_dim, first.d_conv),
                        (len(blocks), first.nheads, first.headdim, first.d_state))  # fmt: skip
