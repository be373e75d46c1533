"""foxhunt.ensemble.kernels: the numba kernels equal the torch layers they are the form of, on random
inputs and shapes: ``linear`` (its rows through ``linear_row``) a ``Linear`` and its activation (fp32
rows, and int8 rows with their scales), ``rms_norm`` an ``nn.RMSNorm``, ``depthwise_conv_step`` a
depthwise causal ``Conv1d`` bar by bar, ``selective_state_step`` the SSD recurrence (``ssd_naive``)
with its softplus and D skip, ``gated_rms_norm`` the model's ``GatedRMSNorm``, ``quantile_head`` a
``QuantileHead``; ``mamba2_step``, their composition, the Mamba-2 forecaster's own ``step`` over many
streams in their pool slots; ``quantize_rows`` rounds each row within half a step."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from torch import nn

from foxhunt.ensemble.kernels import (
    ACTIVATIONS,
    depthwise_conv_step,
    gated_rms_norm,
    linear,
    mamba2_step,
    quantile_head,
    quantize_rows,  # fmt: skip
    rms_norm,
    selective_state_step,
)
from foxhunt.ensemble.runtimes import conv_step_arrays, gated_rms_norm_arrays, linear_arrays, mamba2_arrays, rms_norm_arrays
from foxhunt.models.mamba2 import GatedRMSNorm, Mamba2Forecaster, ssd_naive
from foxhunt.models.quantiles import QuantileHead

TORCH = {"identity": nn.Identity, "relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU, "elu": nn.ELU}


@settings(max_examples=60, deadline=None)
@given(activation=st.sampled_from(sorted(ACTIVATIONS)), batch=st.integers(1, 6), inner=st.integers(1, 40),
       rows=st.integers(1, 40), seed=st.integers(0, 2**16), scale=st.sampled_from([0.1, 1.0, 8.0]))  # fmt: skip
def test_linear_equals_torchs_linear_and_activation(activation, batch, inner, rows, seed, scale):
    torch.manual_seed(seed)
    layer = nn.Linear(inner, rows)
    x = torch.randn(batch, inner) * scale  # large inputs reach tanh's and silu's tails, elu's negative side
    with torch.no_grad():
        want = TORCH[activation]()(layer(x)).numpy()
    w, b = layer.weight.detach().numpy(), layer.bias.detach().numpy()
    out = np.full((batch, rows), np.nan, np.float32)
    got = linear(x.numpy(), w, np.ones(rows, np.float32), b, ACTIVATIONS[activation], out)
    assert got is out  # written in place
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, scale))


def test_linear_on_int8_rows_is_the_dequantized_products():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(24, 33)).astype(np.float32)
    x = rng.normal(size=(5, 33)).astype(np.float32)
    b = rng.normal(size=24).astype(np.float32)
    codes, scales = quantize_rows(w)
    got = linear(x, codes, scales, b, ACTIVATIONS["relu"], np.empty((5, 24), np.float32))
    want = np.maximum(x.astype(np.float64) @ (codes * scales[:, None].astype(np.float64)).T + b, 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # and within the rounding of the codes of the fp32 layer
    exact = np.maximum(x @ w.T + b, 0.0)
    assert np.max(np.abs(got - exact)) <= 0.5 * np.abs(x).sum(axis=1).max() * scales.max()


@settings(max_examples=100, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 8), st.integers(1, 20)),
              elements=st.floats(-1e4, 1e4, width=32, allow_subnormal=False)))  # fmt: skip
def test_quantize_rows_keeps_each_row_within_half_a_step(w):
    codes, scales = quantize_rows(w)
    assert codes.dtype == np.int8 and scales.dtype == np.float32 and scales.shape == (len(w),)
    assert np.all(np.abs(codes.astype(np.int16)) <= 127)
    peak = np.abs(w).max(axis=1)
    nonzero = peak > 0
    np.testing.assert_allclose(scales[nonzero], peak[nonzero] / 127.0, rtol=1e-6)
    assert np.all(scales[~nonzero] == 1.0) and np.all(codes[~nonzero] == 0)
    error = np.abs(w - codes * scales[:, None])
    assert np.all(error <= scales[:, None] * (0.5 + 1e-4))
    assert np.all(np.abs(codes).max(axis=1)[nonzero] == 127)  # the largest weight of a row takes the full range


def _f32(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().numpy(), np.float32)


@settings(max_examples=60, deadline=None)
@given(dim=st.integers(1, 64), eps=st.sampled_from([1e-6, 1e-5, 1e-2]), scale=st.sampled_from([0.01, 1.0, 100.0]),
       seed=st.integers(0, 2**16), in_place=st.booleans())  # fmt: skip
def test_rms_norm_equals_torchs_rms_norm(dim, eps, scale, seed, in_place):
    torch.manual_seed(seed)
    norm = nn.RMSNorm(dim, eps=eps)
    with torch.no_grad():
        norm.weight.mul_(1.0 + torch.randn(dim))
        x = torch.randn(dim) * scale
        want = norm(x).numpy()
    weight, eps32 = rms_norm_arrays(norm)
    row = _f32(x)
    out = row if in_place else np.full(dim, np.nan, np.float32)
    assert rms_norm(row, weight, eps32, out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(channels=st.integers(1, 12), width=st.integers(1, 5), bars=st.integers(1, 12), bias=st.booleans(),
       activation=st.sampled_from(["identity", "silu"]), seed=st.integers(0, 2**16))  # fmt: skip
def test_depthwise_conv_step_is_a_causal_conv1d_bar_by_bar(channels, width, bars, bias, activation, seed):
    """Bar t of the kernel is bar t of the conv over the whole sequence (zero padded before the first bar,
    as a fresh stream), and the window holds the last ``width`` inputs, oldest first."""
    torch.manual_seed(seed)
    conv = nn.Conv1d(channels, channels, width, groups=channels, padding=width - 1, bias=bias)
    sequence = torch.randn(1, channels, bars) * 2.0
    with torch.no_grad():
        want = TORCH[activation]()(conv(sequence)[0, :, :bars]).numpy()
    weight, b = conv_step_arrays(conv)
    window = np.zeros((channels, width), np.float32)
    inputs = _f32(sequence[0])
    for t in range(bars):
        out = np.full(channels, np.nan, np.float32)
        depthwise_conv_step(np.ascontiguousarray(inputs[:, t]), window, weight, b, ACTIVATIONS[activation], out)
        np.testing.assert_allclose(out, want[:, t], rtol=1e-5, atol=1e-5)
    padded = np.concatenate([np.zeros((channels, width), np.float32), inputs], axis=1)
    np.testing.assert_array_equal(window, padded[:, -width:])


@settings(max_examples=60, deadline=None)
@given(groups=st.integers(1, 3), per_group=st.integers(1, 3), headdim=st.integers(1, 6), d_state=st.integers(1, 8),
       bars=st.integers(1, 6), seed=st.integers(0, 2**16))  # fmt: skip
def test_selective_state_step_is_the_ssd_recurrence(groups, per_group, headdim, d_state, bars, seed):
    """From any state, bar by bar: the kernel's outputs and state are the sequential reference scan's
    (foxhunt.models.mamba2.ssd_naive) on dt = softplus(dt + dt_bias), plus the D skip, heads reading their group's B, C."""
    nheads = groups * per_group
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, bars, nheads, headdim, generator=g)
    dt_raw, dt_bias = torch.randn(1, bars, nheads, generator=g), torch.randn(nheads, generator=g)
    A = -torch.exp(torch.randn(nheads, generator=g))
    B, C = torch.randn(1, bars, groups, d_state, generator=g), torch.randn(1, bars, groups, d_state, generator=g)
    D = torch.randn(nheads, generator=g)
    start = torch.randn(1, nheads, headdim, d_state, generator=g)
    y, final = ssd_naive(x, F.softplus(dt_raw + dt_bias), A, B, C, start)
    want = (y + x * D[:, None]).reshape(bars, nheads * headdim).numpy()
    state = _f32(start[0])
    for t in range(bars):
        out = np.full(nheads * headdim, np.nan, np.float32)
        selective_state_step(state, _f32(x[0, t].flatten()), _f32(dt_raw[0, t]), _f32(dt_bias), _f32(A),
                             _f32(B[0, t].flatten()), _f32(C[0, t].flatten()), _f32(D), out)  # fmt: skip
        np.testing.assert_allclose(out, want[t], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state, final[0].numpy(), rtol=1e-4, atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(groups=st.integers(1, 4), group=st.integers(1, 16), eps=st.sampled_from([1e-6, 1e-5, 1e-2]),
       seed=st.integers(0, 2**16), in_place=st.booleans())  # fmt: skip
def test_gated_rms_norm_equals_the_models_gated_norm(groups, group, eps, seed, in_place):
    torch.manual_seed(seed)
    norm = GatedRMSNorm(groups * group, group_size=group, eps=eps)
    with torch.no_grad():
        norm.weight.mul_(1.0 + torch.randn(groups * group))
        y, z = torch.randn(groups * group) * 3.0, torch.randn(groups * group) * 3.0
        want = norm(y, z).numpy()
    weight, eps32, size = gated_rms_norm_arrays(norm)
    row = _f32(y)
    out = row if in_place else np.full(len(row), np.nan, np.float32)
    assert gated_rms_norm(row, _f32(z), weight, size, eps32, out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(features=st.integers(1, 32), horizon=st.integers(1, 5), n_quantiles=st.integers(1, 9), data=st.data(),
       scale=st.sampled_from([0.1, 1.0, 40.0]), seed=st.integers(0, 2**16))  # fmt: skip
def test_quantile_head_equals_the_models_head(features, horizon, n_quantiles, data, scale, seed):
    """The head's linear layer and ordered quantiles, for any median and raw values past softplus's threshold."""
    median = data.draw(st.integers(0, n_quantiles - 1), label="median")
    torch.manual_seed(seed)
    head = QuantileHead(features, n_quantiles, median, horizon)
    x = torch.randn(features) * scale
    with torch.no_grad():
        want = head(x).numpy()
    w, s, b = linear_arrays(head.linear)
    out = np.full((horizon, n_quantiles), np.nan, np.float32)
    raw = np.empty(horizon * n_quantiles, np.float32)
    assert quantile_head(_f32(x), w, s, b, median, raw, out) is out
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * scale)
    assert np.all(np.diff(out, axis=-1) >= 0)


MAMBA2 = dict(input_dim=16, seq_len=20, horizon=3, d_model=16, n_layers=2, d_state=8, d_conv=4, expand=2, headdim=8,
              ngroups=2, chunk_size=8, dt_min=1e-3, dt_max=0.1, dt_init_floor=1e-4, A_init_range=[1.0, 16.0],
              norm_eps=1e-5, dropout=0.0, quantiles=[0.1, 0.25, 0.5, 0.75, 0.9], learning_rate=3e-3, weight_decay=0.0,
              position_threshold=0.0)  # fmt: skip


def _mamba2(seed: int) -> Mamba2Forecaster:
    torch.manual_seed(seed)
    model = Mamba2Forecaster(**MAMBA2).eval()
    with torch.no_grad():  # move the norms and D off their initial ones, so that every weight matters
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "norm_f.weight", ".D")):
                p.mul_(1.0 + 0.3 * torch.randn_like(p))
    return model


def _kernel_bar(arrays_, x: torch.Tensor, slots: np.ndarray, conv: np.ndarray, ssm: np.ndarray, median: int) -> np.ndarray:
    """``mamba2_step`` for one bar of the streams in ``slots`` (their state advanced in place):
    the forecasts (streams, horizon 3, 5 quantiles)."""
    out = np.empty((len(slots), 3, 5), np.float32)
    return mamba2_step(x.numpy(), slots, *arrays_.weights, conv, ssm, *arrays_.dims, 3, 5, median, out)


@pytest.mark.parametrize("seed", [0, 1])
def test_mamba2_step_equals_the_modules_step_for_streams_in_any_slots(seed):
    """Three streams in slots 3, 0 and 1 of a pool of 4, 40 bars each: the kernel's forecasts and
    its state after every bar equal ``Mamba2Forecaster.step`` on the same bars."""
    model = _mamba2(seed)
    arrays_ = mamba2_arrays(model)
    conv, ssm = arrays_.zero_state(4)
    slots = np.array([3, 0, 1], np.int64)
    state = model.init_state(3)
    bars = torch.randn(40, 3, 16, generator=torch.Generator().manual_seed(seed)) * 2.0
    median = model.median_index
    for x in bars:
        with torch.no_grad():
            want, state = model.step(x, state)
        out = _kernel_bar(arrays_, x, slots, conv, ssm, median)
        np.testing.assert_allclose(out, want.numpy(), rtol=1e-4, atol=1e-5)
        assert np.all(np.diff(out, axis=-1) > 0)  # ordered quantiles
    for layer, s in enumerate(state):
        np.testing.assert_allclose(conv[slots, layer], s.conv.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(ssm[slots, layer], s.ssm.numpy(), rtol=1e-4, atol=1e-5)
    assert not conv[2].any() and not ssm[2].any()  # the free slot was never touched


def test_mamba2_step_with_int8_weights_stays_near_fp32():
    model = _mamba2(3)
    fp32, int8 = mamba2_arrays(model), mamba2_arrays(model, int8=True)
    assert int8.weights[0].dtype == np.int8 and int8.weights[5].dtype == np.int8  # input and in projections
    states = {k: a.zero_state(1) for k, a in (("fp32", fp32), ("int8", int8))}
    bars = np.random.default_rng(3).normal(size=(30, 1, 16)).astype(np.float32)
    gaps, sizes = [], []
    for x in bars:
        outs = {}
        for key, a in (("fp32", fp32), ("int8", int8)):
            out = np.empty((1, 3, 5), np.float32)
            outs[key] = mamba2_step(x, np.zeros(1, np.int64), *a.weights, *states[key], *a.dims, 3, 5, 2, out)
        gaps.append(np.abs(outs["fp32"] - outs["int8"]).max())
        sizes.append(np.abs(outs["fp32"]).max())
    assert 0 < max(gaps) <= 0.05 * max(sizes)


def test_mamba2_step_with_int8_weights_is_the_module_with_those_weights():
    """The int8 kernel (codes times their row's scale, in every projection) is the torch step of the same
    model whose Linear weights are those dequantized rows."""
    model = _mamba2(5)
    arrays_ = mamba2_arrays(model, int8=True)
    dequantized = copy.deepcopy(model)
    with torch.no_grad():
        for layer in dequantized.modules():
            if isinstance(layer, nn.Linear):
                codes, scales = quantize_rows(layer.weight.numpy())
                layer.weight.copy_(torch.from_numpy(codes * scales[:, None]))
    conv, ssm = arrays_.zero_state(2)
    state = dequantized.init_state(2)
    bars = torch.randn(20, 2, 16, generator=torch.Generator().manual_seed(5)) * 2.0
    for x in bars:
        with torch.no_grad():
            want, state = dequantized.step(x, state)
        out = _kernel_bar(arrays_, x, np.arange(2), conv, ssm, model.median_index)
        np.testing.assert_allclose(out, want.numpy(), rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        fp32, _ = model.step(bars[-1], model.init_state(2))
        int8_rows, _ = dequantized.step(bars[-1], dequantized.init_state(2))
    assert not torch.equal(fp32, int8_rows)  # the rounding of the codes did reach the forecasts


def test_mamba2_steps_quantiles_past_the_softplus_threshold_are_the_models():
    """Head outputs far past softplus's threshold (the head scaled 40-fold: raw values beyond 60): the kernel's
    ordered quantiles (foxhunt.models.quantiles' numba form) are the module's (its torch form)."""
    model = _mamba2(4)
    with torch.no_grad():
        model.head.linear.weight.mul_(40.0)
    arrays_ = mamba2_arrays(model)
    conv, ssm = arrays_.zero_state(2)
    state = model.init_state(2)
    bars = torch.randn(12, 2, 16, generator=torch.Generator().manual_seed(4)) * 2.0
    peaks = []
    model.head.linear.register_forward_hook(lambda _, __, raw: peaks.append(float(raw.abs().max())))
    for x in bars:
        with torch.no_grad():
            want, state = model.step(x, state)
        out = _kernel_bar(arrays_, x, np.arange(2), conv, ssm, model.median_index)
        np.testing.assert_allclose(out, want.numpy(), rtol=1e-4, atol=1e-4)
        assert np.all(np.diff(out, axis=-1) >= 0)
    assert max(peaks) > 3 * 20.0  # the head's raw values did pass the threshold
