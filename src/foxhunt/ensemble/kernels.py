"""The numba kernels of the streaming members: a linear layer with its activation, and the whole
Mamba-2 step, over a batch of streams.

Batch-1 inference of small networks is bound by call overhead and memory traffic, not by
arithmetic: one numba call per layer costs a fraction of a microsecond against a few for a
numpy or torch operator, and the weights are read once per batch of streams. Each kernel takes
its weight matrices as float32 (fp32 weights) or int8 with one float32 scale per output row
(int8 weights, the activations staying float32: weight-only int8, a quarter of the bytes read
per step); numba compiles one specialization per dtype. ``fastmath`` lets LLVM vectorize the
dot products (sums reassociated: float32 results differ from torch's by rounding, ~1e-6,
checked by the parity tests).

Written here rather than taken from a library: ONNX Runtime (which the TFT uses,
:mod:`foxhunt.ensemble.onnx_runtime`) costs tens of microseconds per call at batch 1, more than
these networks' whole arithmetic; these are the arithmetic of :func:`foxhunt.models.agent.build_mlp`
and :meth:`foxhunt.models.mamba2.Mamba2Mixer.step`, operator for operator, with the head's ordered
quantiles and the softplus from :mod:`foxhunt.models.quantiles` (their one numba form). Compiled
once per machine (seconds; cached on disk beside the modules).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from foxhunt.models.quantiles import ordered_quantiles_row, softplus

ACTIVATIONS = {"identity": 0, "relu": 1, "tanh": 2, "silu": 3, "elu": 4}


@numba.njit(cache=True, fastmath=True)
def linear(x, w, scale, bias, activation, out):  # pragma: no cover (compiled)
    """out[b] = act(scale * (w @ x[b]) + bias) for every row b of x (B, F); w (O, F)."""
    rows, inner = w.shape
    for b in range(x.shape[0]):
        for i in range(rows):
            acc = np.float32(0.0)
            for j in range(inner):
                acc += np.float32(w[i, j]) * x[b, j]
            v = acc * scale[i] + bias[i]
            if activation == 1:
                v = v if v > 0 else np.float32(0.0)
            elif activation == 2:
                v = np.float32(math.tanh(v))
            elif activation == 3:
                v = v / (np.float32(1.0) + np.float32(math.exp(-v)))
            elif activation == 4:
                v = v if v > 0 else np.float32(math.expm1(v))
            out[b, i] = v
    return out


@numba.njit(cache=True, fastmath=True)
def _rms_scale(v, n, eps):  # pragma: no cover (compiled)
    squares = np.float32(0.0)
    for i in range(n):
        squares += v[i] * v[i]
    return np.float32(1.0 / math.sqrt(squares / n + eps))


@numba.njit(cache=True, fastmath=True)
def mamba2_step(x, slots, input_w, input_s, input_b, norm, norm_eps, in_w, in_s, in_b, conv_w, conv_b, dt_bias, A, D,
                gnorm, gnorm_eps, group, out_w, out_s, out_b, norm_f, norm_f_eps, head_w, head_s, head_b, conv_pool,
                ssm_pool, d_inner, conv_dim, nheads, headdim, ngroups, d_state, horizon, n_quantiles, median,
                out):  # fmt: skip  # pragma: no cover (compiled)
    """One bar of every stream b: input row x[b] (F,), its state ``conv_pool[slots[b]]``,
    ``ssm_pool[slots[b]]`` (advanced in place) -> ordered quantile forecasts out[b] (horizon, Q)."""
    d_model = input_w.shape[0]
    projected = in_w.shape[1]
    u = np.empty(d_model, np.float32)
    h = np.empty(d_model, np.float32)
    zx = np.empty(projected, np.float32)
    xbc = np.empty(conv_dim, np.float32)
    y = np.empty(d_inner, np.float32)
    raw = np.empty(head_w.shape[0], np.float32)
    gn = ngroups * d_state
    per_group = nheads // ngroups
    width = conv_pool.shape[3]
    for b in range(x.shape[0]):
        conv = conv_pool[slots[b]]
        ssm = ssm_pool[slots[b]]
        for i in range(d_model):
            acc = np.float32(0.0)
            for j in range(x.shape[1]):
                acc += np.float32(input_w[i, j]) * x[b, j]
            u[i] = acc * input_s[i] + input_b[i]
        for layer in range(in_w.shape[0]):
            scale = _rms_scale(u, d_model, norm_eps)
            for i in range(d_model):
                h[i] = u[i] * scale * norm[layer, i]
            for i in range(projected):
                acc = np.float32(0.0)
                for j in range(d_model):
                    acc += np.float32(in_w[layer, i, j]) * h[j]
                zx[i] = acc * in_s[layer, i] + in_b[layer, i]
            for c in range(conv_dim):
                for k in range(width - 1):
                    conv[layer, c, k] = conv[layer, c, k + 1]
                conv[layer, c, width - 1] = zx[d_inner + c]
                acc = conv_b[layer, c]
                for k in range(width):
                    acc += conv[layer, c, k] * conv_w[layer, c, k]
                xbc[c] = acc / (np.float32(1.0) + np.float32(math.exp(-acc)))
            for head in range(nheads):
                dt = softplus(zx[d_inner + conv_dim + head] + dt_bias[layer, head])
                decay = np.float32(math.exp(dt * A[layer, head]))
                g = head // per_group
                b0 = d_inner + g * d_state
                c0 = d_inner + gn + g * d_state
                for p in range(headdim):
                    xv = xbc[head * headdim + p]
                    dx = dt * xv
                    acc = np.float32(0.0)
                    for n in range(d_state):
                        s = ssm[layer, head, p, n] * decay + dx * xbc[b0 + n]
                        ssm[layer, head, p, n] = s
                        acc += s * xbc[c0 + n]
                    y[head * headdim + p] = acc + xv * D[layer, head]
            for start in range(0, d_inner, group):
                squares = np.float32(0.0)
                for i in range(start, start + group):
                    z = zx[i]
                    v = y[i] * (z / (np.float32(1.0) + np.float32(math.exp(-z))))
                    y[i] = v
                    squares += v * v
                scale = np.float32(1.0 / math.sqrt(squares / group + gnorm_eps))
                for i in range(start, start + group):
                    y[i] = y[i] * scale * gnorm[layer, i]
            for i in range(d_model):
                acc = np.float32(0.0)
                for j in range(d_inner):
                    acc += np.float32(out_w[layer, i, j]) * y[j]
                u[i] += acc * out_s[layer, i] + out_b[layer, i]
        scale = _rms_scale(u, d_model, norm_f_eps)
        for i in range(d_model):
            h[i] = u[i] * scale * norm_f[i]
        for i in range(head_w.shape[0]):
            acc = np.float32(0.0)
            for j in range(d_model):
                acc += np.float32(head_w[i, j]) * h[j]
            raw[i] = acc * head_s[i] + head_b[i]
        for t in range(horizon):
            ordered_quantiles_row(raw[t * n_quantiles : (t + 1) * n_quantiles], median, out[b, t])
    return out


def quantize_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per output row (the last axis is the input): (codes int8, scales float32)
    with ``w ~= codes * scales[..., None]``; a zero row gets scale 1."""
    peak = np.abs(w).max(axis=-1)
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    codes = np.clip(np.rint(w / scale[..., None]), -127, 127).astype(np.int8)
    return codes, scale
