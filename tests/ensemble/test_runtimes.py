"""foxhunt.ensemble.runtimes: the weights copied out of a torch module run the same math in numpy
(the agents' network for every activation the kernels know); a layer they do not implement is
refused, so the member falls back to torch. (The forecasters' ordered quantiles: tests/models/test_quantiles.)"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kernels import MAMBA2
from torch import nn

from foxhunt.ensemble.kernels import ACTIVATIONS
from foxhunt.ensemble.runtimes import NUMPY_ACTIVATIONS, UnsupportedModule, mamba2_arrays, mlp_layers
from foxhunt.models import mamba2 as torch_mamba2
from foxhunt.models.agent import build_mlp


def numpy_forward(layers, x: np.ndarray) -> np.ndarray:
    """The numpy runtime's loop (:meth:`foxhunt.ensemble.members.AgentMember._numpy_scores`)."""
    for w, b, act in layers:
        x = x @ w.T + b
        if act:
            x = NUMPY_ACTIVATIONS[act](x)
    return x


@settings(max_examples=40, deadline=None)
@given(activation=st.sampled_from(["relu", "tanh", "silu", "elu"]), hidden=st.lists(st.integers(1, 48), max_size=3),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_an_mlp_copied_out_runs_as_torch_runs_it(activation, hidden, seed):
    torch.manual_seed(seed)
    mlp = build_mlp(17, hidden, 3, activation)
    layers = mlp_layers(mlp)
    assert len(layers) == len(hidden) + 1
    assert [act for _, _, act in layers] == [ACTIVATIONS[activation]] * len(hidden) + [ACTIVATIONS["identity"]]
    x = torch.randn(9, 17) * 3.0
    with torch.no_grad():
        want = mlp(x).numpy()
    np.testing.assert_allclose(numpy_forward(layers, x.numpy()), want, rtol=1e-5, atol=1e-5)


def test_a_layer_without_a_bias_gets_a_zero_bias():
    layer = nn.Linear(4, 2, bias=False)
    ((w, b, act),) = mlp_layers(nn.Sequential(layer))
    assert b.shape == (2,) and not b.any() and act == ACTIVATIONS["identity"]
    np.testing.assert_array_equal(w, layer.weight.detach().numpy())


@pytest.mark.parametrize(
    ("sequential", "message"),
    [
        (nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 2)), "no GELU layer"),
        (nn.Sequential(nn.Linear(4, 4), nn.ELU(alpha=0.5), nn.Linear(4, 2)), "ELU with alpha != 1"),
        (nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1), nn.Linear(4, 2)), "no Dropout layer"),
        (nn.Sequential(nn.ReLU(), nn.Linear(4, 2)), "no ReLU layer"),  # an activation with no layer before it
        (nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Tanh()), "no Tanh layer"),  # two in a row
    ],
)
def test_a_layer_the_runtimes_do_not_implement_is_refused(sequential, message):
    with pytest.raises(UnsupportedModule, match=message):
        mlp_layers(sequential)


def test_a_dynamically_quantized_module_is_left_to_torch():
    torch.manual_seed(0)
    mlp = build_mlp(8, [16], 3, "relu")
    quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(mlp), {nn.Linear}, dtype=torch.qint8)
    with pytest.raises(UnsupportedModule):
        mlp_layers(quantized)
    model = torch_mamba2.Mamba2Forecaster(**MAMBA2)
    with pytest.raises(UnsupportedModule, match="quantized"):
        mamba2_arrays(torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8))


def test_mamba2_arrays_hold_the_models_dims_and_state_shapes():
    model = torch_mamba2.Mamba2Forecaster(**MAMBA2)
    arrays_ = mamba2_arrays(model)
    mixer = model.backbone.layers[0].mixer
    assert arrays_.dims == (mixer.d_inner, mixer.conv_dim, mixer.nheads, mixer.headdim, mixer.ngroups, mixer.d_state)
    conv, ssm = arrays_.zero_state(5)
    assert conv.shape == (5, 2, mixer.conv_dim, mixer.d_conv) and ssm.shape == (5, 2, mixer.nheads, mixer.headdim, mixer.d_state)
    state = model.init_state(5)[0]
    assert conv.shape[2:] == tuple(state.conv.shape[1:]) and ssm.shape[2:] == tuple(state.ssm.shape[1:])
    A = arrays_.weights[11]  # A = -exp(A_log), per layer and head
    np.testing.assert_allclose(A[0], -np.exp(mixer.A_log.detach().numpy()), rtol=1e-6)
    assert np.all(A < 0)
