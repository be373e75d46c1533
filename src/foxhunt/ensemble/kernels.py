"""The numba kernels of the streaming members: generic layer kernels, and the Mamba-2 step composed of them.

Why hand-written. Batch-1 inference of small networks is bound by call overhead and memory traffic,
not by arithmetic: torch eager spends microseconds per operator on dispatch, numpy about one, and
ONNX Runtime (which the TFT uses, :mod:`foxhunt.ensemble.onnx_runtime`) tens of microseconds per
call, more than these networks' whole arithmetic. One numba call costs a fraction of a microsecond,
so a member's bar, for all its streams, is one compiled call per layer (the agents) or one in all (Mamba-2).

Design. Each kernel below is the numba form of one torch layer type, on one stream's row (a 1-D
vector) and usable by any model made of such layers; a model's runtime is a short composition of
them following the model's own layer list, itself compiled, so a bar of all streams is still one
call from Python. A compiled caller calls a compiled callee as a native function (nanoseconds,
against a layer's microseconds); the two smallest, :func:`activate` (per value) and :func:`linear_row`
(per row of a batch), are inlined into their callers in numba's IR (``inline="always"``), where
a call's cost would show beside their arithmetic:

- :func:`linear_row` (and :func:`linear`, its form over a batch of rows, which the agents'
  networks call layer by layer): ``nn.Linear`` and its activation (:data:`ACTIVATIONS`);
- :func:`rms_norm`: ``nn.RMSNorm``;
- :func:`depthwise_conv_step`: a depthwise causal ``nn.Conv1d``'s output at the newest bar, its
  window of the last ``kernel_size`` inputs rolled in place, and an activation;
- :func:`selective_state_step`: the selective state space update of Mamba's SSD/S6 layer,
  ``h = exp(dt A) h + dt B x``, ``y = C h + D x`` with ``dt = softplus(dt + dt_bias)`` per head,
  B and C shared by groups of heads (the one-bar form of
  :func:`foxhunt.models.mamba2.ssd_naive` and the mixer's D skip);
- :func:`gated_rms_norm`: :class:`foxhunt.models.mamba2.GatedRMSNorm`;
- :func:`quantile_head`: :class:`foxhunt.models.quantiles.QuantileHead`, its linear layer and the
  ordered quantiles of :func:`foxhunt.models.quantiles.ordered_quantiles_row` (the head's one
  numba form, with its softplus, beside the torch one).

:func:`mamba2_step` composes them in the order of :class:`foxhunt.models.mamba2.Mamba2Forecaster`:
input projection; per block (``backbone.blocks`` in order, their weights stacked by
:func:`foxhunt.ensemble.runtimes.mamba2_arrays`) RMSNorm, in_proj, conv step with SiLU, selective
state step, gated norm, out_proj, residual; final RMSNorm; quantile head.

Weights. Each weight matrix is float32 (fp32 weights) or int8 with one float32 scale per output
row (weight-only int8, the activations staying float32: a quarter of the bytes read per step);
numba compiles one specialization per dtype. ``fastmath`` lets LLVM vectorize the dot products
(sums reassociated: float32 results differ from torch's by rounding, ~1e-6, checked by the parity
tests against the torch layers and the model's own ``step``). Compiled once per machine (seconds;
cached on disk beside the modules).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from foxhunt.models.quantiles import ordered_quantiles_row, softplus

IDENTITY, RELU, TANH, SILU, ELU = range(5)
ACTIVATIONS = {"identity": IDENTITY, "relu": RELU, "tanh": TANH, "silu": SILU, "elu": ELU}


@numba.njit(cache=True, fastmath=True, inline="always")
def activate(v, activation):  # pragma: no cover (compiled)
    """One float32 value through the activation coded ``activation`` (:data:`ACTIVATIONS`)."""
    if activation == RELU:
        return v if v > 0 else np.float32(0.0)
    if activation == TANH:
        return np.float32(math.tanh(v))
    if activation == SILU:
        return v / (np.float32(1.0) + np.float32(math.exp(-v)))
    if activation == ELU:
        return v if v > 0 else np.float32(math.expm1(v))
    return v


@numba.njit(cache=True, fastmath=True, inline="always")
def linear_row(x, w, scale, bias, activation, out):  # pragma: no cover (compiled)
    """``nn.Linear`` and its activation on one row: out = act(scale * (w @ x) + bias); x (F,), w (O, F)."""
    rows, inner = w.shape
    for i in range(rows):
        acc = np.float32(0.0)
        for j in range(inner):
            acc += np.float32(w[i, j]) * x[j]
        out[i] = activate(acc * scale[i] + bias[i], activation)
    return out


@numba.njit(cache=True, fastmath=True)
def linear(x, w, scale, bias, activation, out):  # pragma: no cover (compiled)
    """:func:`linear_row` on every row b of x (B, F) into out (B, O)."""
    for b in range(x.shape[0]):
        linear_row(x[b], w, scale, bias, activation, out[b])
    return out


@numba.njit(cache=True, fastmath=True)
def rms_norm(x, weight, eps, out):  # pragma: no cover (compiled)
    """``nn.RMSNorm`` on one row: out = x / sqrt(mean(x^2) + eps) * weight; out may be x."""
    n = x.shape[0]
    squares = np.float32(0.0)
    for i in range(n):
        squares += x[i] * x[i]
    scale = np.float32(1.0 / math.sqrt(squares / n + eps))
    for i in range(n):
        out[i] = x[i] * scale * weight[i]
    return out


@numba.njit(cache=True, fastmath=True)
def depthwise_conv_step(x, window, weight, bias, activation, out):  # pragma: no cover (compiled)
    """A depthwise causal ``nn.Conv1d`` (groups = channels, padding kernel_size - 1) at the newest bar.

    x (C,) the bar's inputs; window (C, K) the last K inputs, oldest first, rolled in place (x becomes
    the newest); weight (C, K) (the conv's (C, 1, K) squeezed), bias (C,); out (C,) = act(sum_k window * weight + bias).
    """
    width = window.shape[1]
    for c in range(window.shape[0]):
        for k in range(width - 1):
            window[c, k] = window[c, k + 1]
        window[c, width - 1] = x[c]
        acc = bias[c]
        for k in range(width):
            acc += window[c, k] * weight[c, k]
        out[c] = activate(acc, activation)
    return out


@numba.njit(cache=True, fastmath=True)
def selective_state_step(state, x, dt, dt_bias, A, B, C, D, out):  # pragma: no cover (compiled)
    """One bar of the selective state space layer (Mamba-2's SSD recurrence, one step), per head h:
    dt_h = softplus(dt[h] + dt_bias[h]); state[h] = exp(dt_h A[h]) state[h] + dt_h x_h B_g (outer product);
    y_h = state[h] C_g + D[h] x_h, with g = h // (heads / groups) the group whose B and C the head reads.

    state (H, P, N) advanced in place; x (H * P,) the heads' channels; dt, dt_bias, A (negative), D (H,);
    B, C (G * N,); out (H * P,).
    """
    nheads, headdim, d_state = state.shape
    per_group = nheads // (B.shape[0] // d_state)
    for head in range(nheads):
        delta = softplus(dt[head] + dt_bias[head])
        decay = np.float32(math.exp(delta * A[head]))
        g0 = (head // per_group) * d_state
        for p in range(headdim):
            xv = x[head * headdim + p]
            dx = delta * xv
            acc = np.float32(0.0)
            for n in range(d_state):
                s = state[head, p, n] * decay + dx * B[g0 + n]
                state[head, p, n] = s
                acc += s * C[g0 + n]
            out[head * headdim + p] = acc + xv * D[head]
    return out


@numba.njit(cache=True, fastmath=True)
def gated_rms_norm(y, z, weight, group, eps, out):  # pragma: no cover (compiled)
    """:class:`foxhunt.models.mamba2.GatedRMSNorm` on one row: rmsnorm(y * silu(z)) over each group of
    ``group`` channels, times weight; out may be y."""
    for start in range(0, y.shape[0], group):
        squares = np.float32(0.0)
        for i in range(start, start + group):
            v = y[i] * activate(z[i], SILU)
            out[i] = v
            squares += v * v
        scale = np.float32(1.0 / math.sqrt(squares / group + eps))
        for i in range(start, start + group):
            out[i] = out[i] * scale * weight[i]
    return out


@numba.njit(cache=True, fastmath=True)
def quantile_head(x, w, scale, bias, median, raw, out):  # pragma: no cover (compiled)
    """:class:`foxhunt.models.quantiles.QuantileHead` on one row: x (F,) -> ordered quantiles out (horizon, Q);
    raw (horizon * Q,) holds the linear layer's outputs."""
    linear_row(x, w, scale, bias, IDENTITY, raw)
    n_quantiles = out.shape[1]
    for t in range(out.shape[0]):
        ordered_quantiles_row(raw[t * n_quantiles : (t + 1) * n_quantiles], median, out[t])
    return out


@numba.njit(cache=True, fastmath=True)
def mamba2_step(x, slots, input_w, input_s, input_b, norm, norm_eps, in_w, in_s, in_b, conv_w, conv_b, dt_bias, A, D,
                gnorm, gnorm_eps, group, out_w, out_s, out_b, norm_f, norm_f_eps, head_w, head_s, head_b, conv_pool,
                ssm_pool, d_inner, conv_dim, nheads, headdim, ngroups, d_state, horizon, n_quantiles, median,
                out):  # fmt: skip  # pragma: no cover (compiled)
    """:meth:`foxhunt.models.mamba2.Mamba2Forecaster.step` for one bar of every stream b: input row x[b] (F,),
    its state ``conv_pool[slots[b]]``, ``ssm_pool[slots[b]]`` (one entry per block, advanced in place) ->
    ordered quantile forecasts out[b] (horizon, Q). The weights are :func:`foxhunt.ensemble.runtimes.mamba2_arrays`'
    (a block's stacked on the first axis); the in_proj's output packs (z, x B C, dt) of d_inner, conv_dim and
    nheads channels, the conv's (x, B, C) of nheads * headdim and ngroups * d_state twice."""
    d_model = input_w.shape[0]
    gn = ngroups * d_state
    u = np.empty(d_model, np.float32)  # the residual stream
    h = np.empty(d_model, np.float32)
    zxbcdt = np.empty(in_w.shape[1], np.float32)
    xbc = np.empty(conv_dim, np.float32)
    y = np.empty(d_inner, np.float32)
    mixed = np.empty(d_model, np.float32)
    raw = np.empty(horizon * n_quantiles, np.float32)
    z, xbc_in, dt = zxbcdt[:d_inner], zxbcdt[d_inner : d_inner + conv_dim], zxbcdt[d_inner + conv_dim :]
    xs, B, C = xbc[: nheads * headdim], xbc[d_inner : d_inner + gn], xbc[d_inner + gn : d_inner + 2 * gn]
    for b in range(x.shape[0]):
        linear_row(x[b], input_w, input_s, input_b, IDENTITY, u)
        for block in range(in_w.shape[0]):
            rms_norm(u, norm[block], norm_eps, h)
            linear_row(h, in_w[block], in_s[block], in_b[block], IDENTITY, zxbcdt)
            depthwise_conv_step(xbc_in, conv_pool[slots[b], block], conv_w[block], conv_b[block], SILU, xbc)
            selective_state_step(ssm_pool[slots[b], block], xs, dt, dt_bias[block], A[block], B, C, D[block], y)
            gated_rms_norm(y, z, gnorm[block], group, gnorm_eps, y)
            linear_row(y, out_w[block], out_s[block], out_b[block], IDENTITY, mixed)
            for i in range(d_model):
                u[i] += mixed[i]
        rms_norm(u, norm_f, norm_f_eps, h)
        quantile_head(h, head_w, head_s, head_b, median, raw, out[b])
    return out


def quantize_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per output row (the last axis is the input): (codes int8, scales float32)
    with ``w ~= codes * scales[..., None]``; a zero row gets scale 1."""
    peak = np.abs(w).max(axis=-1)
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    codes = np.clip(np.rint(w / scale[..., None]), -127, 127).astype(np.int8)
    return codes, scale
