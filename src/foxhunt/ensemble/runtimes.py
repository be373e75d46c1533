"""Batch-1 inference of a trained member in plain numpy: the agents' greedy network and the
Mamba-2 recurrent step.

At batch 1 a small network is bound by dispatch, not arithmetic: torch eager spends microseconds
per operator on argument checks, dispatch keys and autograd bookkeeping (about 27 us for the
DQN's three layers on an AVX-512 CPU), numpy about one. So a member can run the same math in
numpy, on weights copied out of its module once at load. Which runtime a member uses is chosen
by measurement (:mod:`foxhunt.ensemble.members`), and the parity tests hold every runtime to
the module's own outputs.

The Mamba-2 step has a third runtime, :class:`NumbaMamba2`: the same arithmetic as loops
compiled by numba (one call per bar instead of ~40 numpy calls per layer; measured 3x faster
than numpy on the seed-size model). It compiles once per machine (seconds; cached on disk
beside this module).

Written by hand: ONNX Runtime or torch.compile would need a native runtime or a C++ compiler
per platform for a few matrix-vector products; these classes are the arithmetic of
:func:`foxhunt.models.agent.build_mlp` and :meth:`foxhunt.models.mamba2.Mamba2Mixer.step`,
operator for operator, in float32.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

#: torch's softplus returns x itself above this (F.softplus threshold=20).
SOFTPLUS_THRESHOLD = 20.0


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float32).numpy().copy()


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0, out=x)


def _tanh(x: np.ndarray) -> np.ndarray:
    return np.tanh(x, out=x)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _elu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0.0)))


def softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > SOFTPLUS_THRESHOLD, x, np.log1p(np.exp(np.minimum(x, SOFTPLUS_THRESHOLD))))


NUMPY_ACTIVATIONS = {nn.ReLU: _relu, nn.Tanh: _tanh, nn.SiLU: _silu, nn.ELU: _elu}


class UnsupportedModule(ValueError):
    """The module holds a layer the numpy runtime does not implement (the torch runtime runs it)."""


class NumpyMLP:
    """An ``nn.Sequential`` of ``Linear`` and activation layers, evaluated on one vector."""

    def __init__(self, sequential: nn.Sequential) -> None:
        self.layers: list = []
        for layer in sequential:
            if isinstance(layer, nn.Linear) and type(layer.weight) in (torch.Tensor, nn.Parameter):
                bias = _array(layer.bias) if layer.bias is not None else np.zeros(layer.out_features, np.float32)
                self.layers.append((_array(layer.weight), bias))
            elif type(layer) in NUMPY_ACTIVATIONS and not (isinstance(layer, nn.ELU) and layer.alpha != 1.0):
                self.layers.append(NUMPY_ACTIVATIONS[type(layer)])
            else:
                raise UnsupportedModule(f"numpy runtime: no {type(layer).__name__} layer")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        for layer in self.layers:
            if callable(layer):
                x = layer(x)
            else:
                weight, bias = layer
                x = weight @ x + bias
        return x


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * weight


class NumpyMamba2:
    """The streaming step of a :class:`foxhunt.models.mamba2.Mamba2Forecaster` in numpy:
    input projection, each block's RMSNorm + mixer step + residual, the final norm and the
    quantile head (ordered quantiles). State: per layer the conv window and the SSM state."""

    def __init__(self, model: nn.Module) -> None:
        if any(type(p) not in (torch.Tensor, nn.Parameter) for p in model.parameters()):
            raise UnsupportedModule("numpy runtime: quantized weights")
        self.input_w, self.input_b = _array(model.input_proj.weight), _array(model.input_proj.bias)
        self.layers = []
        for block in model.backbone.layers:
            mixer = block.mixer
            self.layers.append(
                {
                    "norm": _array(block.norm.weight), "norm_eps": float(block.norm.eps),
                    "in_w": _array(mixer.in_proj.weight), "in_b": _array(mixer.in_proj.bias),
                    "conv_w": _array(mixer.conv1d.weight.squeeze(1)),
                    "conv_b": _array(mixer.conv1d.bias) if mixer.conv1d.bias is not None else 0.0,
                    "dt_bias": _array(mixer.dt_bias), "A": -np.exp(_array(mixer.A_log)), "D": _array(mixer.D)[:, None],
                    "gnorm": _array(mixer.norm.weight), "gnorm_eps": float(mixer.norm.eps),
                    "group": int(mixer.norm.group_size),
                    "out_w": _array(mixer.out_proj.weight), "out_b": _array(mixer.out_proj.bias),
                }
            )  # fmt: skip
        first = model.backbone.layers[0].mixer
        self.d_inner, self.conv_dim, self.d_conv = first.d_inner, first.conv_dim, first.d_conv
        self.nheads, self.headdim, self.ngroups, self.d_state = first.nheads, first.headdim, first.ngroups, first.d_state
        self.norm_f, self.norm_f_eps = _array(model.backbone.norm_f.weight), float(model.backbone.norm_f.eps)
        self.head_w, self.head_b = _array(model.head.weight), _array(model.head.bias)
        self.horizon, self.n_quantiles, self.median = model.horizon, model.n_quantiles, model.median_index
        self.state = self.zero_state()

    def zero_state(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return [
            (np.zeros((self.conv_dim, self.d_conv), np.float32), np.zeros((self.nheads, self.headdim, self.d_state), np.float32))
            for _ in self.layers
        ]  # fmt: skip

    def reset(self) -> None:
        self.state = self.zero_state()

    def step(self, features: np.ndarray) -> np.ndarray:
        """One bar's input row (input_dim,) -> its forecast (horizon, Q); advances the state."""
        u = self.input_w @ features + self.input_b
        per_group = self.nheads // self.ngroups
        gn = self.ngroups * self.d_state
        for i, p in enumerate(self.layers):
            conv, ssm = self.state[i]
            h = _rms_norm(u, p["norm"], p["norm_eps"])
            zxbcdt = p["in_w"] @ h + p["in_b"]
            z = zxbcdt[: self.d_inner]
            conv[:, :-1] = conv[:, 1:]
            conv[:, -1] = zxbcdt[self.d_inner : self.d_inner + self.conv_dim]
            xbc = _silu((conv * p["conv_w"]).sum(axis=1) + p["conv_b"])
            x = xbc[: self.d_inner].reshape(self.nheads, self.headdim)
            B = xbc[self.d_inner : self.d_inner + gn].reshape(self.ngroups, self.d_state)
            C = xbc[self.d_inner + gn :].reshape(self.ngroups, self.d_state)
            dt = softplus(zxbcdt[self.d_inner + self.conv_dim :] + p["dt_bias"])
            Bh = np.repeat(B, per_group, axis=0) if self.ngroups > 1 else B
            Ch = np.repeat(C, per_group, axis=0) if self.ngroups > 1 else C
            ssm *= np.exp(dt * p["A"])[:, None, None]
            ssm += (dt[:, None] * x)[:, :, None] * Bh[:, None, :]
            y = (ssm @ Ch[..., None])[..., 0] + x * p["D"]
            gated = (y.reshape(-1) * _silu(z)).reshape(-1, p["group"])
            normed = _rms_norm(gated, 1.0, p["gnorm_eps"]).reshape(-1) * p["gnorm"]
            u = u + (p["out_w"] @ normed + p["out_b"])
        raw = (self.head_w @ _rms_norm(u, self.norm_f, self.norm_f_eps) + self.head_b).reshape(self.horizon, self.n_quantiles)
        return ordered_quantiles(raw, self.median)


class NumbaMamba2(NumpyMamba2):
    """:class:`NumpyMamba2` with the whole step as one numba-compiled function (the layers'
    weights stacked per kind, the state as two arrays)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        from foxhunt.ensemble.mamba2_kernel import mamba2_step  # compiles on first use

        self._kernel = mamba2_step

        def stack(key: str) -> np.ndarray:
            return np.ascontiguousarray(np.stack([np.asarray(p[key], np.float32) for p in self.layers]))

        first = self.layers[0]
        self._weights = (
            self.input_w, self.input_b, stack("norm"), np.float32(first["norm_eps"]), stack("in_w"), stack("in_b"),
            stack("conv_w"), np.ascontiguousarray(np.stack([np.broadcast_to(np.asarray(p["conv_b"], np.float32), (self.conv_dim,)) for p in self.layers])),
            stack("dt_bias"), stack("A"), np.ascontiguousarray(np.stack([p["D"][:, 0] for p in self.layers])), stack("gnorm"),
            np.float32(first["gnorm_eps"]), int(first["group"]), stack("out_w"), stack("out_b"), self.norm_f,
            np.float32(self.norm_f_eps), self.head_w, self.head_b,
        )  # fmt: skip
        self._dims = (self.d_inner, self.conv_dim, self.nheads, self.headdim, self.ngroups, self.d_state)
        self.layers = [{} for _ in self.layers]  # the stacked copies above are the weights now
        self.reset()

    def zero_state(self):
        count = len(self.layers)
        return (np.zeros((count, self.conv_dim, self.d_conv), np.float32),
                np.zeros((count, self.nheads, self.headdim, self.d_state), np.float32))  # fmt: skip

    def step(self, features: np.ndarray) -> np.ndarray:
        conv, ssm = self.state
        raw = self._kernel(np.ascontiguousarray(features, np.float32), *self._weights, conv, ssm, *self._dims)
        return ordered_quantiles(raw.reshape(self.horizon, self.n_quantiles), self.median)


def ordered_quantiles(raw: np.ndarray, median_index: int) -> np.ndarray:
    """:func:`foxhunt.models.mamba2.ordered_quantiles` in numpy: (..., Q) raw -> ordered."""
    median = raw[..., median_index : median_index + 1]
    above = median + np.cumsum(softplus(raw[..., median_index + 1 :]), axis=-1)
    below = np.flip(np.cumsum(np.flip(softplus(raw[..., :median_index]), -1), axis=-1), -1)
    return np.concatenate([median - below, median, above], axis=-1)
