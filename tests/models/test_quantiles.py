"""foxhunt.models.quantiles: the one ordered-quantile head. Its torch form and the numba row form the
streaming kernel calls agree on any raw values (beyond the softplus threshold too) and are ordered
along Q; QuantileHead's shapes; state dicts of the layout before the shared head (Mamba-2's
``head.weight``) load and forecast as the model they came from."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from test_mamba2 import SMALL_MODEL, model_batch
from test_tft import random_batch, small_tft
from torch import nn

from foxhunt.models.mamba2 import Mamba2Forecaster
from foxhunt.models.quantiles import (
    SOFTPLUS_THRESHOLD,
    QuantileHead,
    ordered_quantiles,
    ordered_quantiles_row,
    softplus,
    upgrade_state_dict,
)

#: Raw values around the softplus threshold, and far past it where exp overflows (float32 past 88.7).
VALUES = st.one_of(st.floats(-60.0, 60.0, width=32), st.floats(-1000.0, 1000.0, width=32))


@st.composite
def raw_and_median(draw):
    """float32 raw values (rows, Q) reaching well past the softplus threshold on both sides, and a median index."""
    q = draw(st.integers(1, 9))
    raw = draw(arrays(np.float32, st.tuples(st.integers(1, 4), st.just(q)), elements=VALUES))
    return raw, draw(st.integers(0, q - 1))


@settings(max_examples=150, deadline=None)
@given(raw_and_median())
def test_torch_and_numba_forms_agree_and_are_ordered(case):
    raw, median = case
    want = ordered_quantiles(torch.from_numpy(raw), median).numpy()
    got = np.stack([ordered_quantiles_row(row, median, np.empty_like(row)) for row in raw])
    # torch subtracts the cumulated gaps from the median, the row form each gap in turn: the same sums
    # rounded in another order, within a few float32 steps of the largest partial sum
    largest = np.abs(raw).sum(axis=-1, keepdims=True) + raw.shape[-1]  # >= |median| + every gap (softplus(x) <= |x| + ln 2)
    assert np.all(np.abs(got - want) <= 1e-5 + raw.shape[-1] * np.finfo(np.float32).eps * largest)
    for out in (got, want):
        np.testing.assert_array_equal(out[:, median], raw[:, median])  # the median is the raw value itself
        assert np.all(np.diff(out.astype(np.float64), axis=-1) >= 0)


@settings(max_examples=100, deadline=None)
@given(VALUES)
def test_numba_softplus_is_torchs_in_float32(v):
    want = F.softplus(torch.tensor([v], dtype=torch.float32)).item()
    got = softplus(np.float32(v))
    assert got == pytest.approx(want, rel=1e-6, abs=1e-7)
    if v > SOFTPLUS_THRESHOLD:
        assert got == np.float32(v)  # x itself above the threshold, as torch's


def test_hand_computed_values_on_both_sides_of_the_median():
    ln2 = float(np.log(2.0))  # softplus(0)
    raw = torch.tensor([0.0, 0.0, 1.0, 0.0, 30.0])
    want = torch.tensor([1.0 - 2 * ln2, 1.0 - ln2, 1.0, 1.0 + ln2, 31.0 + ln2])
    torch.testing.assert_close(ordered_quantiles(raw, 2), want)
    row = raw.numpy()
    np.testing.assert_allclose(ordered_quantiles_row(row, 2, np.empty_like(row)), want.numpy(), rtol=1e-6)


@pytest.mark.parametrize(("horizon", "shape"), [(None, (2, 7, 5)), (3, (2, 7, 3, 5))])
def test_head_shapes_and_the_formula_on_its_linear_layer(horizon, shape):
    torch.manual_seed(0)
    head = QuantileHead(6, n_quantiles=5, median_index=2, horizon=horizon)
    assert (head.linear.in_features, head.linear.out_features) == (6, (horizon or 1) * 5)
    x = torch.randn(2, 7, 6)
    out = head(x)
    assert out.shape == shape
    torch.testing.assert_close(out, ordered_quantiles(head.linear(x).reshape(shape), 2))


@pytest.mark.parametrize("median_index", [-1, 5])
def test_a_median_index_outside_the_quantiles_is_refused(median_index):
    with pytest.raises(ValueError, match=r"median_index must be in \[0, 5\)"):
        QuantileHead(6, n_quantiles=5, median_index=median_index)


# ------------------------------------------------------------------------------ the legacy layout
def _legacy_mamba2_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict as Mamba-2 wrote it before the shared head: the head a bare Linear."""
    state = model.state_dict()
    return {key.replace("head.linear.", "head."): value.clone() for key, value in state.items()}


def test_a_mamba2_state_dict_of_the_old_layout_loads_and_forecasts_the_same():
    torch.manual_seed(1)
    trained = Mamba2Forecaster(**SMALL_MODEL).eval()
    legacy = _legacy_mamba2_state(trained)
    assert {"head.weight", "head.bias"} <= legacy.keys() and not any(".linear." in k for k in legacy)
    torch.manual_seed(2)  # other weights everywhere, the head's included
    rebuilt = Mamba2Forecaster(**SMALL_MODEL).eval()
    rebuilt.load_state_dict(legacy)  # strict: no key missing, none left over
    batch = model_batch(4, SMALL_MODEL["seq_len"], SMALL_MODEL["horizon"], seed=3)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(batch), trained(batch), rtol=0, atol=0)
        features = rebuilt.bar_features(batch)
        torch.testing.assert_close(rebuilt.forecast_stream(features)[0], trained.forecast_stream(features)[0], rtol=0, atol=0)
    assert rebuilt.state_dict().keys() == trained.state_dict().keys()  # saved again in the current layout


def test_the_tft_layout_is_unchanged():
    torch.manual_seed(4)
    trained = small_tft().eval()
    assert {"quantile_head.linear.weight", "quantile_head.linear.bias"} <= trained.state_dict().keys()
    torch.manual_seed(5)
    rebuilt = small_tft().eval()
    rebuilt.load_state_dict(trained.state_dict())
    batch = random_batch(3, 12, 4, seed=6)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(batch), trained(batch), rtol=0, atol=0)


def test_a_bare_linear_layers_state_loads_into_the_head():
    """Every key directly under the head (an int8 weight's scale too) is the old layer's."""
    layer = nn.Linear(6, 10)
    head = QuantileHead(6, n_quantiles=5, median_index=2, horizon=2)
    head.load_state_dict(layer.state_dict())
    torch.testing.assert_close(head.linear.weight, layer.weight, rtol=0, atol=0)
    torch.testing.assert_close(head.linear.bias, layer.bias, rtol=0, atol=0)
    renamed = upgrade_state_dict(head, {"weight": layer.weight, "weight_int8_scale": torch.ones(10)})
    assert renamed.keys() == {"linear.weight", "linear.weight_int8_scale"}


def test_both_layouts_at_once_are_not_merged():
    torch.manual_seed(1)
    model = Mamba2Forecaster(**SMALL_MODEL)
    mixed = {**model.state_dict(), "head.weight": model.head.linear.weight.detach().clone()}
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "head.weight"'):
        model.load_state_dict(mixed)


def test_upgrade_state_dict_gives_the_keys_and_shapes_load_state_dict_reads():
    torch.manual_seed(1)
    model = Mamba2Forecaster(**SMALL_MODEL)
    current = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    legacy = _legacy_mamba2_state(model)
    assert {key: tuple(value.shape) for key, value in upgrade_state_dict(model, legacy).items()} == current
    assert "head.weight" in legacy  # the argument is left as it was
    assert upgrade_state_dict(model, model.state_dict()).keys() == current.keys()
