"""What the TFT keeps for its backward pass: the default config trains within its memory target
without activation checkpointing, and the layers that keep less compute what they did."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from torch import nn

from foxhunt.memory.accounting import ActivationMeter
from foxhunt.models.forecaster import quantile_loss
from foxhunt.models.tft import GatedResidualNetwork, _dropout

REPO_ROOT = Path(__file__).resolve().parents[2]
MB = 2**20
# AdamW keeps two states per parameter, and a fit keeps one gradient: 4 copies of the parameters
PARAMETER_COPIES = 4


pytestmark = pytest.mark.usefixtures("single_intra_op_thread")  # tests/models/conftest.py


def saved_dtypes(fn) -> list[torch.dtype]:
    """The dtypes of the tensors autograd keeps for the backward pass of ``fn()``."""
    kept: list[torch.dtype] = []

    def pack(tensor):
        kept.append(tensor.dtype)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    return kept


@settings(max_examples=30, deadline=None)
@given(p=st.sampled_from([0.0, 0.1, 0.5, 0.9]), rows=st.integers(1, 40), width=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
def test_dropout_keeps_a_boolean_mask_and_draws_what_torch_draws(p, rows, width, seed):
    module = nn.Dropout(p)
    x = torch.randn(rows, width, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(seed)
    expected = module(x)
    (expected_grad,) = torch.autograd.grad(expected.square().sum(), x)
    torch.manual_seed(seed)
    got = _dropout(module, x)
    (got_grad,) = torch.autograd.grad(got.square().sum(), x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(got_grad, expected_grad, rtol=0, atol=0)
    assert all(dtype == torch.bool for dtype in saved_dtypes(lambda: _dropout(module, x)))
    module.eval()
    assert _dropout(module, x) is x


def reference_grn(grn: GatedResidualNetwork, a: torch.Tensor, context: torch.Tensor | None) -> torch.Tensor:
    """LayerNorm(skip(a) + GLU(W1 ELU(W2 a + W3 c + b2) + b1)), GLU(h) = (W5 h + b5) * sigmoid(W4 h + b4)
    [eq. 2-5], written out (no dropout)."""
    hidden = grn.fc_input(a)
    if context is not None:
        hidden = hidden + grn.fc_context(context).unsqueeze(-2)
    hidden = grn.fc_hidden(torch.nn.functional.elu(hidden))
    value, gate = grn.gate_norm.glu.linear(hidden).chunk(2, dim=-1)
    return grn.gate_norm.norm(grn.skip(a) + value * torch.sigmoid(gate))


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 6)),
    context_size=st.sampled_from([None, 3]),
    rows=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_grn_computes_the_papers_equations(sizes, context_size, rows, seed):
    """The GRN with its fused GLU and in-place ELU: the paper's function and its gradients."""
    input_size, hidden_size, output_size = sizes
    torch.manual_seed(seed)
    grn = GatedResidualNetwork(input_size, hidden_size, output_size, dropout=0.0, context_size=context_size).double()
    a = torch.randn(2, rows, input_size, dtype=torch.float64, requires_grad=True)
    context = None if context_size is None else torch.randn(2, context_size, dtype=torch.float64)
    got, expected = grn(a, context), reference_grn(grn, a, context)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    weights = [a, *grn.parameters()]
    for got_grad, expected_grad in zip(torch.autograd.grad(got.sum(), weights), torch.autograd.grad(expected.sum(), weights)):
        torch.testing.assert_close(got_grad, expected_grad, rtol=1e-10, atol=1e-12)


def test_the_default_config_trains_within_its_memory_target_without_checkpointing():
    """conf/model/tft.yaml as it is (activation checkpointing off), fp32, one batch of the configured
    size: parameters, gradient, AdamW's two states and the activations kept for the backward pass
    fit model.memory_target_mb (before the GRNs kept less: 563.75 MB against 500)."""
    cfg = OmegaConf.create({"model": OmegaConf.load(REPO_ROOT / "conf" / "model" / "tft.yaml")})
    assert cfg.model.module.activation_checkpointing is False
    torch.manual_seed(0)
    model = instantiate(cfg.model.module).train()
    window, module = cfg.model.window, cfg.model.module
    batch_size, seq_len, horizon = int(window.batch_size), int(window.seq_len), int(window.horizon)
    batch = {
        "static": torch.randn(batch_size, int(module.static_dim)),
        "known": torch.randn(batch_size, seq_len + horizon, int(module.known_dim)),
        "observed": torch.randn(batch_size, seq_len, int(module.observed_dim)),
        "target": torch.randn(batch_size, horizon),
    }
    with ActivationMeter(exclude=model) as meter:
        quantile_loss(model(batch), batch["target"], model.quantile_levels).backward()
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    footprint_mb = (PARAMETER_COPIES * parameters + meter.peak_bytes) / MB
    assert footprint_mb <= float(cfg.model.memory_target_mb), (footprint_mb, meter.peak_bytes / MB)
