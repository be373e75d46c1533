"""The Mamba-2 streaming step of every layer as one numba-compiled function (see
:class:`foxhunt.ensemble.runtimes.NumbaMamba2`): per layer RMSNorm, input projection, the
depthwise causal conv over the last ``d_conv`` inputs, SiLU, dt = softplus, the SSM state update
``h = exp(dt A) h + dt x B^T`` and readout ``y = h C + D x``, the gated grouped RMSNorm, the
output projection and the residual; then the final RMSNorm and the head (raw quantiles).
``fastmath`` lets LLVM vectorize the dot products (the sums are reassociated: float32 results
differ from torch's by rounding only, ~1e-6, checked by the parity tests).
"""

from __future__ import annotations

import math

import numba
import numpy as np

SOFTPLUS_THRESHOLD = 20.0  # torch's softplus returns x itself above this


@numba.njit(cache=True, fastmath=True)
def mamba2_step(x, input_w, input_b, norm, norm_eps, in_w, in_b, conv_w, conv_b, dt_bias, A, D, gnorm, gnorm_eps,
                group, out_w, out_b, norm_f, norm_f_eps, head_w, head_b, conv_state, ssm, d_inner, conv_dim, nheads,
                headdim, ngroups, d_state):  # fmt: skip  # pragma: no cover (compiled)
    d_model = input_w.shape[0]
    u = np.empty(d_model, np.float32)
    for i in range(d_model):
        acc = input_b[i]
        for j in range(x.shape[0]):
            acc += input_w[i, j] * x[j]
        u[i] = acc
    projected = in_w.shape[1]
    h = np.empty(d_model, np.float32)
    zx = np.empty(projected, np.float32)
    xbc = np.empty(conv_dim, np.float32)
    y = np.empty(d_inner, np.float32)
    gn = ngroups * d_state
    per_group = nheads // ngroups
    width = conv_state.shape[2]
    for layer in range(in_w.shape[0]):
        squares = np.float32(0.0)
        for i in range(d_model):
            squares += u[i] * u[i]
        scale = np.float32(1.0 / math.sqrt(squares / d_model + norm_eps))
        for i in range(d_model):
            h[i] = u[i] * scale * norm[layer, i]
        for i in range(projected):
            acc = in_b[layer, i]
            for j in range(d_model):
                acc += in_w[layer, i, j] * h[j]
            zx[i] = acc
        for c in range(conv_dim):
            for k in range(width - 1):
                conv_state[layer, c, k] = conv_state[layer, c, k + 1]
            conv_state[layer, c, width - 1] = zx[d_inner + c]
            acc = conv_b[layer, c]
            for k in range(width):
                acc += conv_state[layer, c, k] * conv_w[layer, c, k]
            xbc[c] = acc / (np.float32(1.0) + np.float32(math.exp(-acc)))
        for head in range(nheads):
            v = zx[d_inner + conv_dim + head] + dt_bias[layer, head]
            dt = v if v > SOFTPLUS_THRESHOLD else np.float32(math.log1p(math.exp(v)))
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
            acc = out_b[layer, i]
            for j in range(d_inner):
                acc += out_w[layer, i, j] * y[j]
            u[i] += acc
    squares = np.float32(0.0)
    for i in range(d_model):
        squares += u[i] * u[i]
    scale = np.float32(1.0 / math.sqrt(squares / d_model + norm_f_eps))
    for i in range(d_model):
        h[i] = u[i] * scale * norm_f[i]
    out = np.empty(head_w.shape[0], np.float32)
    for i in range(head_w.shape[0]):
        acc = head_b[i]
        for j in range(d_model):
            acc += head_w[i, j] * h[j]
        out[i] = acc
    return out
