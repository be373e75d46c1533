"""foxhunt.ensemble.runtimes: the weights copied out of a torch module run the same math in numpy
(the agents' network for every activation the kernels know); a layer they do not implement is
refused, so the member falls back to torch, in the agents' MLP and in any of Mamba-2's blocks; the
Mamba-2 arrays are its blocks' in order. (The forecasters' ordered quantiles: tests/models/test_quantiles.)"""

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
from foxhunt.ensemble.runtimes import (
    NUMPY_ACTIVATIONS,
    UnsupportedModule,
    linear_arrays,
    mamba2_arrays,
    mamba2_block_arrays,
    mlp_layers,  # fmt: skip
    rms_norm_arrays,
)
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


@pytest.mark.parametrize("int8", [False, True])
def test_mamba2_arrays_are_its_layers_in_the_models_order(int8):
    """Input projection, each block's layers stacked in the order of backbone.blocks, final norm, head: each the
    reader of its layer's type (a block's blocks permuted, its arrays permute with them)."""
    torch.manual_seed(1)
    model = torch_mamba2.Mamba2Forecaster(**{**MAMBA2, "n_layers": 3}).eval()
    model.backbone.layers = nn.ModuleList([model.backbone.layers[i] for i in (2, 0, 1)])
    weights = mamba2_arrays(model, int8=int8).weights
    expected = (*linear_arrays(model.input_proj, int8),)
    per_block = [mamba2_block_arrays(block, int8) for block in model.backbone.blocks]
    assert len(per_block[0]) == 16 and len(weights) == 3 + 16 + 2 + 3
    for got, want in zip(weights[:3], expected):
        np.testing.assert_array_equal(got, want)
    for position in range(16):
        values = [block[position] for block in per_block]
        if isinstance(values[0], np.ndarray):
            np.testing.assert_array_equal(weights[3 + position], np.stack(values))
        else:
            assert weights[3 + position] == values[0]
    np.testing.assert_array_equal(weights[3], np.stack([b.norm.weight.detach().numpy() for b in model.backbone.blocks]))
    for got, want in zip(weights[19:], (*rms_norm_arrays(model.backbone.norm_f), *linear_arrays(model.head.linear, int8))):
        np.testing.assert_array_equal(got, want)


class GateOnly(nn.Module):
    """A gate without the norm: a mixer's norm the torch step runs and the kernels do not implement."""

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return y * torch.sigmoid(z)


def _replace(model, path: str, layer: nn.Module) -> None:
    parent, name = model.get_submodule(path.rpartition(".")[0]), path.rpartition(".")[2]
    setattr(parent, name, layer)


@pytest.mark.parametrize(
    ("path", "layer", "message"),
    [
        ("backbone.layers.1.norm", lambda m: nn.LayerNorm(m["d_model"]), "LayerNorm where the kernels take an nn.RMSNorm"),
        ("backbone.norm_f", lambda m: nn.LayerNorm(m["d_model"]), "LayerNorm where the kernels take an nn.RMSNorm"),
        ("backbone.layers.0.mixer.conv1d", lambda m: nn.Conv1d(m["conv_dim"], m["conv_dim"], m["d_conv"], groups=m["conv_dim"],
                                                                padding=2 * (m["d_conv"] - 1), dilation=2),
         "not depthwise and causal"),
        ("backbone.layers.1.mixer.norm", lambda m: GateOnly(), "GateOnly where the kernels take a GatedRMSNorm"),
        ("backbone.layers.1.mixer.out_proj", lambda m: nn.Sequential(nn.Linear(m["d_inner"], m["d_model"])),
         "Sequential where the kernels take an nn.Linear"),
    ],
)  # fmt: skip
def test_a_mamba2_layer_the_kernels_do_not_implement_is_refused(path, layer, message):
    """A block (or the final norm) holding a layer of another type than the kernel's, which the torch step still runs,
    is refused by its reader, not read as the kernel's layer (a LayerNorm's weight and eps as an RMSNorm's)."""
    torch.manual_seed(0)
    model = torch_mamba2.Mamba2Forecaster(**MAMBA2).eval()
    mixer = model.backbone.blocks[0].mixer
    sizes = {"d_model": MAMBA2["d_model"], "d_inner": mixer.d_inner, "conv_dim": mixer.conv_dim, "d_conv": mixer.d_conv}
    _replace(model, path, layer(sizes))
    with torch.no_grad():
        model.step(torch.zeros(1, 16), model.init_state(1))  # the torch runtime runs it
    with pytest.raises(UnsupportedModule, match=message):
        mamba2_arrays(model)


def test_blocks_that_differ_are_refused():
    model = torch_mamba2.Mamba2Forecaster(**MAMBA2).eval()
    model.backbone.blocks[1].mixer.norm.eps = 1e-3
    with pytest.raises(UnsupportedModule, match="differs"):
        mamba2_arrays(model)
