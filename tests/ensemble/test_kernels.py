"""foxhunt.ensemble.kernels: the numba kernels equal the torch modules they replace on random
inputs: ``linear`` a ``Linear`` and its activation (fp32 rows, and int8 rows with their scales),
``mamba2_step`` the Mamba-2 forecaster's own ``step`` over many streams in their pool slots;
``quantize_rows`` rounds each row within half a step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from torch import nn

from foxhunt.ensemble.kernels import ACTIVATIONS, linear, mamba2_step, quantize_rows
from foxhunt.ensemble.runtimes import mamba2_arrays
from foxhunt.models.mamba2 import Mamba2Forecaster

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
        out = np.empty((3, 3, 5), np.float32)
        mamba2_step(x.numpy(), slots, *arrays_.weights, conv, ssm, *arrays_.dims, 3, 5, median, out)
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
        out = np.empty((2, 3, 5), np.float32)
        mamba2_step(x.numpy(), np.arange(2), *arrays_.weights, conv, ssm, *arrays_.dims, 3, 5, model.median_index, out)
        np.testing.assert_allclose(out, want.numpy(), rtol=1e-4, atol=1e-4)
        assert np.all(np.diff(out, axis=-1) >= 0)
    assert max(peaks) > 3 * 20.0  # the head's raw values did pass the threshold
