"""Exact byte counts of foxhunt.memory.accounting on hand-built modules and steps."""

from __future__ import annotations

import gc

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from foxhunt.memory.accounting import (
    BYTES_PER_MB,
    ActivationMeter,
    GradientMeter,
    MemoryBreakdown,
    buffer_bytes,
    gradient_bytes,
    measure_activations,
    measure_static,
    model_state_bytes,
    optimizer_state_bytes,
    parameter_bytes,
    tensor_bytes,
)

F32 = 4


# -- parameters, gradients, buffers --------------------------------------------------------
def test_linear_parameter_bytes_are_weight_plus_bias():
    layer = nn.Linear(10, 5)
    assert parameter_bytes(layer) == (50 + 5) * F32 == 220
    assert buffer_bytes(layer) == 0
    assert parameter_bytes(layer.to(torch.float64)) == 55 * 8
    assert parameter_bytes(nn.Linear(10, 5, dtype=torch.bfloat16)) == 55 * 2


@settings(max_examples=25, deadline=None)
@given(
    n_in=st.integers(1, 64),
    n_out=st.integers(1, 64),
    bias=st.booleans(),
    dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]),
)
def test_linear_parameter_bytes_for_any_shape_and_dtype(n_in, n_out, bias, dtype):
    layer = nn.Linear(n_in, n_out, bias=bias, dtype=dtype)
    size = torch.tensor([], dtype=dtype).element_size()
    assert parameter_bytes(layer) == (n_in * n_out + (n_out if bias else 0)) * size


def test_tied_weight_is_counted_once():
    tied = nn.Sequential(nn.Embedding(7, 3), nn.Linear(3, 7, bias=False))
    tied[1].weight = tied[0].weight
    assert parameter_bytes(tied) == 7 * 3 * F32
    untied = nn.Sequential(nn.Embedding(7, 3), nn.Linear(3, 7, bias=False))
    assert parameter_bytes(untied) == 2 * 7 * 3 * F32


def test_views_share_their_storage_and_a_view_costs_its_whole_storage():
    base = torch.zeros(10, 4)
    assert tensor_bytes([base, base[:2], base.t()]) == 40 * F32
    assert tensor_bytes(base[:2]) == 40 * F32  # the slice keeps all 40 floats alive
    assert tensor_bytes([base, torch.zeros(3)]) == 43 * F32


def test_meta_tensors_hold_no_memory():
    assert parameter_bytes(nn.Linear(100, 100, device="meta")) == 0


def test_gradient_bytes_appear_after_backward():
    layer = nn.Linear(10, 5)
    assert gradient_bytes(layer) == 0
    layer(torch.randn(3, 10)).sum().backward()
    assert gradient_bytes(layer) == 220


def test_batchnorm_buffers_include_the_int64_counter():
    norm = nn.BatchNorm1d(4)
    assert parameter_bytes(norm) == 2 * 4 * F32
    assert buffer_bytes(norm) == 2 * 4 * F32 + 8  # running mean, var; num_batches_tracked int64


# -- optimizer state -----------------------------------------------------------------------
def test_adam_state_is_two_moments_plus_a_step_tensor_per_parameter():
    layer = nn.Linear(10, 5)
    optimizer = torch.optim.Adam(layer.parameters())
    assert optimizer_state_bytes(optimizer) == 0  # lazily created at the first step
    layer(torch.randn(3, 10)).sum().backward()
    optimizer.step()
    steps = [state["step"] for state in optimizer.state.values()]
    # torch keeps ``step`` as a float32 scalar tensor per parameter (4 bytes), measured here:
    assert [(s.dtype, s.numel(), s.untyped_storage().nbytes()) for s in steps] == [(torch.float32, 1, 4)] * 2
    assert optimizer_state_bytes(optimizer) == 2 * 220 + 2 * 4 == 448


def test_measure_static_counts_each_component_once():
    layer = nn.Linear(10, 5)
    optimizer = torch.optim.Adam(layer.parameters())
    layer(torch.randn(3, 10)).sum().backward()
    optimizer.step()
    breakdown = measure_static(layer, optimizer, activations_bytes=123)
    assert breakdown == MemoryBreakdown(220, 220, 448, 0, 0, 123)
    assert breakdown.total_training_bytes == 220 + 220 + 448 + 123


def test_breakdown_mb_properties():
    breakdown = MemoryBreakdown(params_bytes=BYTES_PER_MB, optimizer_bytes=3 * BYTES_PER_MB // 2)
    assert breakdown.params_mb == 1.0
    assert breakdown.optimizer_mb == 1.5
    assert breakdown.total_training_mb == 2.5
    assert list(breakdown.components()) == [
        "params",
        "grads",
        "optimizer",
        "buffers",
        "model_state",
        "activations",
        "temporaries",
    ]


# -- model-owned state ---------------------------------------------------------------------
class RingBuffer:
    def __init__(self) -> None:
        self.obs = torch.zeros(10, 3)
        self.actions = torch.zeros(10, dtype=torch.int64)

    def memory_tensors(self):
        return {"obs": self.obs, "actions": self.actions}


class Opaque:
    def __init__(self) -> None:
        self.hidden = torch.zeros(1000)


class Agent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)
        self.register_buffer("scale", torch.ones(4))
        self.cache = torch.zeros(100)  # plain tensor attribute: 400 bytes
        self.replay = RingBuffer()  # memory_tensors(): 120 + 80 bytes
        self.replay_again = self.replay  # the same object: counted once
        self.history = [torch.zeros(5), {"last": torch.zeros(5)}]  # containers: 40 bytes
        self.weight_alias = self.net.weight.detach()  # a parameter's storage: excluded
        self.scale_alias = self.scale[:2]  # a buffer's storage: excluded
        self.opaque = Opaque()  # an object without memory_tensors(): not walked
        self.net.side = torch.zeros(2, dtype=torch.float64)  # on a submodule: 16 bytes


def test_model_state_follows_the_documented_rule():
    agent = Agent()
    assert model_state_bytes(agent) == 400 + (120 + 80) + 40 + 16
    breakdown = measure_static(agent)
    assert breakdown.params_bytes == (8 + 2) * F32
    assert breakdown.buffers_bytes == 4 * F32
    assert breakdown.model_state_bytes == 656


# -- torchao tensor subclasses -------------------------------------------------------------
def test_int8_weight_only_linear_is_counted_through_its_inner_tensors():
    quantization = pytest.importorskip("torchao.quantization")
    model = nn.Sequential(nn.Linear(256, 256))
    quantization.quantize_(model, quantization.Int8WeightOnlyConfig())
    weight = model[0].weight
    names, _ = weight.__tensor_flatten__()
    inner = {name: getattr(weight, name) for name in names if getattr(weight, name) is not None}
    layout = {name: (t.dtype, tuple(t.shape)) for name, t in inner.items()}
    assert layout == {
        "qdata": (torch.int8, (256, 256)),
        "scale": (torch.float32, (256, 1)),
        "zero_point": (torch.int8, (256, 1)),
    }
    # int8 codes + a float32 scale and an int8 zero point per row + the float32 bias
    assert parameter_bytes(model) == 256 * 256 * 1 + 256 * 4 + 256 * 1 + 256 * 4 == 67840
    assert parameter_bytes(model) < parameter_bytes(nn.Linear(256, 256)) / 3


def test_adamw8bit_state_is_counted_through_its_inner_tensors():
    optim = pytest.importorskip("torchao.optim")
    layer = nn.Linear(256, 256)
    optimizer = optim.AdamW8bit(layer.parameters())  # block size 256
    layer(torch.randn(2, 256)).sum().backward()
    with torch.compiler.set_stance("force_eager"):  # the same states as compiled, without ~25 s of compiling
        optimizer.step()
    per_8bit_state = 256 * 256 * 1 + (256 * 256 // 256) * 4 + 256 * 4  # uint8 codes, block scales, qmap
    per_fp32_state = 256 * 4  # the bias: under 4096 values, kept in float32
    steps = 2 * 4
    lr_tensor = 4  # torchao keeps each param group's lr as a float32 tensor
    expected = 2 * per_8bit_state + 2 * per_fp32_state + steps + lr_tensor
    assert optimizer_state_bytes(optimizer) == expected == 137228


# -- activations ---------------------------------------------------------------------------
def test_activation_bytes_of_matmul_relu_sum():
    x = torch.randn(8, 16)  # input, no grad
    w = nn.Parameter(torch.randn(16, 4))
    # mm saves x (needed for dW; W itself is not needed: x has no grad); relu saves its output;
    # sum saves only sizes.
    peak = measure_activations(lambda: (x @ w).relu().sum().backward())
    assert peak == 8 * 16 * F32 + 8 * 4 * F32 == 640


def test_activation_meter_excludes_parameters_saved_by_reference():
    x = torch.randn(8, 16, requires_grad=True)
    w = nn.Parameter(torch.randn(16, 4))
    step = lambda: (x @ w).relu().sum().backward()  # noqa: E731
    assert measure_activations(step) == 640 + 16 * 4 * F32  # now mm also saves W (for dx)
    assert measure_activations(step, exclude=[w]) == 640


def test_a_tensor_saved_twice_is_counted_once():
    x = torch.randn(8, 16, requires_grad=True)
    with ActivationMeter() as meter:
        loss = (x * x).sum()  # mul saves both operands: the same storage
    assert meter.saved_tensors == 2
    assert meter.peak_bytes == 8 * 16 * F32
    loss.backward()


def test_peak_is_not_the_sum_of_two_micro_batches():
    x = torch.randn(8, 16)
    w = nn.Parameter(torch.randn(16, 4))

    def two_micro_batches():
        for _ in range(2):
            (x @ w).relu().sum().backward()

    with ActivationMeter() as meter:
        two_micro_batches()
    assert meter.saved_tensors == 4
    assert meter.peak_bytes == 640
    assert meter.live_bytes == 0


def test_live_bytes_drop_when_the_graph_is_freed():
    x = torch.randn(8, 16)
    w = nn.Parameter(torch.randn(16, 4))
    with ActivationMeter() as meter:
        loss = (x @ w).relu().sum()
    assert meter.live_bytes == meter.peak_bytes == 640
    del loss
    gc.collect()
    assert meter.live_bytes == 0
    assert meter.peak_bytes == 640


def test_gradient_meter_sees_grads_that_are_zeroed_afterwards():
    layer = nn.Linear(10, 5)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    with GradientMeter(layer) as meter:
        layer(torch.randn(3, 10)).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert gradient_bytes(layer) == 0
    assert meter.grads_bytes == 220
