"""The 8-bit Adam(W) step (foxhunt.precision.eight_bit_step): the update is Adam's formula within
the error of its 8-bit formats, its stochastic rounding of int8 weights is unbiased, and an
optimizer restored from a saved state takes the next steps bit for bit as the one that saved it."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from precision_helpers import load_policy
from torch import nn

from foxhunt.precision.eight_bit_step import (
    ROUNDING_SEED,
    adam_update,
    rounding_key,
    stochastic_round,
    uniform,
)
from foxhunt.precision.optim import convert_optimizer, make_optimizer
from foxhunt.precision.quantize import is_int8_weight, quantize_model

FP8_HALF_ULP = 2.0**-4  # e4m3: 3 mantissa bits, round to nearest: relative error <= 2^-4 of a normal value
FP8_SUBNORMAL_HALF_ULP = 2.0**-10  # and <= 2^-10 of the block scale below the normal range (2^-6)
FP8_MAX = 448.0
BLOCK = 256


def _fp8_state(value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from torchao.optim.subclass_fp8 import quantize_fp8

    return quantize_fp8(value, BLOCK)


def _dequantized_fp8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (codes.float().view(-1, BLOCK) * scale.view(-1, 1)).view(codes.shape).double()


def _row_quantized(value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = value.abs().amax(1) / 127
    return (value / scale.view(-1, 1)).round().to(torch.int8), scale


@settings(max_examples=25, deadline=None)
@given(
    rows=st.sampled_from([2, 4, 8]),
    columns=st.sampled_from([256, 512]),
    step=st.integers(1, 50),
    adamw=st.booleans(),
    grad_scale=st.sampled_from([1e-6, 1e-3, 1.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_int8_update_is_adams_formula_within_its_formats_errors(rows, columns, step, adamw, grad_scale, seed):
    """Against Adam(W) in float64 from the same (dequantized) weights and moments: each new moment
    within fp8's rounding (2^-4 relative; 2^-10 of its block's scale below fp8's normal range), the
    new row scales within 1e-5, and the new int8 weights those of the float64 weights rounded with
    the same draws."""
    generator = torch.Generator().manual_seed(seed)
    shape = (rows, columns)
    values, row_scale = _row_quantized(torch.randn(shape, generator=generator))
    grad = torch.randn(shape, generator=generator) * grad_scale
    m_codes, m_scale = _fp8_state(torch.randn(shape, generator=generator) * grad_scale * 0.1)
    v_codes, v_scale = _fp8_state(torch.rand(shape, generator=generator) * grad_scale**2 * 0.1)
    lr, beta1, beta2, weight_decay, eps = 1e-2, 0.9, 0.999, 1e-2, 1e-8

    p = values.double() * row_scale.double().view(-1, 1)
    g = grad.double()
    m, v = _dequantized_fp8(m_codes, m_scale), _dequantized_fp8(v_codes, v_scale)
    if adamw:
        p = p - lr * weight_decay * p
    else:
        g = g + weight_decay * p
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    expected = p - lr * (m / (1 - beta1**step)) / (v.sqrt() / (1 - beta2**step) ** 0.5 + eps)

    weight = (values.clone(), row_scale.clone())
    exp_avg, exp_avg_sq = (m_codes.clone(), m_scale.clone()), (v_codes.clone(), v_scale.clone())
    key = torch.tensor(rounding_key(seed, 0, step), dtype=torch.int32)
    adam_update(weight, grad, exp_avg, exp_avg_sq, None, torch.tensor(float(step)), torch.tensor(lr), key,
                beta1, beta2, weight_decay, eps, adamw)  # fmt: skip

    for (codes, scale), reference in ((exp_avg, m), (exp_avg_sq, v)):
        block_scale = scale.double().repeat_interleave(BLOCK).view(shape)
        bound = FP8_HALF_ULP * reference.abs() + FP8_SUBNORMAL_HALF_ULP * block_scale + 1e-6 * reference.abs().amax()
        assert ((_dequantized_fp8(codes, scale) - reference).abs() <= bound).all()
    new_values, new_scale = weight
    torch.testing.assert_close(new_scale.double(), expected.abs().amax(1) / 127, rtol=1e-5, atol=0)
    # the reference weight rounded with the same draws: the same int8 values but where float32 and
    # float64 put the value on either side of its draw (at most 1 in 100 here), and there one apart
    scaled = expected / new_scale.double().view(-1, 1)
    reference = (scaled.floor() + (uniform(key, scaled.shape).double() < scaled - scaled.floor())).clip(-128, 127)
    apart = (new_values.double() - reference).abs()
    assert apart.max() <= 1 and (apart > 0).double().mean() <= 0.01


@pytest.mark.parametrize("states", ["fp8", "8bit"])
def test_with_fp32_weights_the_update_is_torchaos_bit_for_bit(states):
    """Tensors with 8-bit states and fp32 weights: the same operations as torchao's update (eager)."""
    from torchao.optim import AdamW8bit, AdamWFp8

    torch.manual_seed(0)
    net = nn.Linear(256, 64)
    reference = copy.deepcopy(net)
    ours = convert_optimizer(make_optimizer([net.weight], "adamw", lr=1e-2, weight_decay=1e-2),
                             load_policy("int8", optimizer_states=states, compile_optimizer=False))  # fmt: skip
    theirs = (AdamWFp8 if states == "fp8" else AdamW8bit)([reference.weight], lr=1e-2, weight_decay=1e-2)
    for step in range(3):
        grad = torch.randn(64, 256, generator=torch.Generator().manual_seed(step))
        net.weight.grad, reference.weight.grad = grad.clone(), grad.clone()
        ours.step()
        with torch.compiler.set_stance("force_eager"):
            theirs.step()
    assert torch.equal(net.weight, reference.weight)
    for key in ("exp_avg", "exp_avg_sq"):
        a, b = ours.state[net.weight][key], theirs.state[reference.weight][key]
        assert torch.equal(a.codes, b.codes) and torch.equal(a.scale, b.scale)


@settings(max_examples=30, deadline=None)
@given(x=st.floats(-127.0, 127.0, allow_nan=False), seed=st.integers(0, 2**64 - 1), step=st.integers(0, 10**6))
def test_stochastic_rounding_is_unbiased(x, seed, step):
    """65,536 values ``x`` rounded with one key's draws: each is floor(x) or floor(x) + 1, and their
    mean is x (the draws are a permutation sample of a 2^-24 grid: the error is the sample's, its
    standard deviation at most 0.5 / 256; bound: 5 of them)."""
    n = 1 << 16
    values = torch.full((n,), x, dtype=torch.float32)
    key = torch.tensor(rounding_key(seed, 3, step), dtype=torch.int32)
    rounded = stochastic_round(values, uniform(key, values.shape))
    down = float(torch.tensor(x, dtype=torch.float32).floor())
    assert set(rounded.unique().tolist()) <= {down, down + 1}
    assert abs(float(rounded.double().mean()) - float(values[0])) <= 5 * 0.5 / 256


def test_the_draws_are_uniform_and_differ_between_steps_tensors_and_seeds():
    n = 1 << 16
    draws = {}
    for name, (seed, tensor, step) in {"base": (0, 0, 1), "step": (0, 0, 2), "tensor": (0, 1, 1), "seed": (1, 0, 1)}.items():
        draws[name] = uniform(torch.tensor(rounding_key(seed, tensor, step), dtype=torch.int32), torch.Size([n]))
    base = draws["base"]
    counts = torch.histc(base, bins=16, min=0.0, max=1.0)
    expected = n / 16
    assert float(((counts - expected) ** 2 / expected).sum()) < 60  # chi-square, 15 degrees of freedom: p < 1e-6
    assert 0.0 <= float(base.min()) and float(base.max()) < 1.0
    for name in ("step", "tensor", "seed"):
        assert abs(float(torch.corrcoef(torch.stack([base, draws[name]]))[0, 1])) < 0.02, name


def test_the_compiled_hash_is_the_eager_hash():
    """The draws are integer arithmetic (wrapping 32-bit products): compiled they are the same numbers."""
    key = torch.tensor(rounding_key(12345, 7, 99), dtype=torch.int32)
    shape = torch.Size([64, 512])
    compiled = torch.compile(uniform, fullgraph=True, dynamic=False)
    assert torch.equal(compiled(key, shape), uniform(key, shape))


# -- exact resume ---------------------------------------------------------------------------------
def _int8_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 128), nn.LayerNorm(128), nn.Linear(128, 64))
    quantize_model(model, load_policy("int8", keep_fp32=[]))
    assert is_int8_weight(model[0].weight) and is_int8_weight(model[2].weight)
    return model


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        x = torch.randn(16, 64, generator=torch.Generator().manual_seed(step))
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()


def _saved(obj) -> dict:
    """``obj`` through torch.save and torch.load(weights_only=True), as in a checkpoint."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _optimizer(model: nn.Module, compiled: bool = False):
    policy = load_policy("int8", compile_optimizer=compiled)
    return convert_optimizer(make_optimizer(model.parameters(), "adamw", lr=1e-2, weight_decay=1e-2), policy)


@pytest.mark.parametrize("compiled", [False, True])
def test_an_optimizer_restored_from_its_saved_state_continues_bit_for_bit(compiled):
    """Kill -9 after step 3: the saved model and optimizer state, loaded into a fresh model and
    optimizer in a process whose random generator is elsewhere, take steps 4-6 exactly as the
    uninterrupted run (int8 values and scales, 8-bit states, every weight)."""
    model = _int8_model()
    optimizer = _optimizer(model, compiled)
    _train(model, optimizer, range(3))
    saved_model, saved_optimizer = _saved(model.state_dict()), _saved(optimizer.state_dict())
    _train(model, optimizer, range(3, 6))

    torch.manual_seed(987)  # another seed, another generator state: nothing may depend on them
    torch.rand(1000)
    restored = _int8_model(seed=5)
    restored.load_state_dict(saved_model)
    restored_optimizer = _optimizer(restored, compiled)
    restored_optimizer.load_state_dict(saved_optimizer)
    _train(restored, restored_optimizer, range(3, 6))

    for (name, a), b in zip(model.state_dict().items(), restored.state_dict().values()):
        assert torch.equal(a, b), name
    for p, q in zip(model.parameters(), restored.parameters()):
        for key in ("exp_avg", "exp_avg_sq"):
            a, b = optimizer.state[p][key], restored_optimizer.state[q][key]
            assert type(a) is type(b) and torch.equal(a.dequantize() if hasattr(a, "codes") else a,
                                                      b.dequantize() if hasattr(b, "codes") else b), key  # fmt: skip


def test_a_saved_state_without_a_rounding_seed_loads_and_a_malformed_one_is_refused():
    model = _int8_model()
    optimizer = _optimizer(model)
    _train(model, optimizer, range(2))
    saved = _saved(optimizer.state_dict())
    assert saved["param_groups"][0][ROUNDING_SEED] == torch.initial_seed()

    older = copy.deepcopy(saved)  # written before the seed was kept
    del older["param_groups"][0][ROUNDING_SEED]
    fresh = _optimizer(model)
    fresh.param_groups[0][ROUNDING_SEED] = 42
    fresh.load_state_dict(older)
    assert fresh.param_groups[0][ROUNDING_SEED] == 42
    _train(model, fresh, range(2, 3))

    broken = copy.deepcopy(saved)
    broken["param_groups"][0][ROUNDING_SEED] = "seven"
    with pytest.raises(
        ValueError, match=r"optimizer state: param group 0 rounding_seed='seven': not an integer in \[0, 2\*\*64\)"
    ):
        _optimizer(model).load_state_dict(broken)
