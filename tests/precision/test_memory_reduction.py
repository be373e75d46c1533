"""Per-component memory of int8 vs fp32 on a model big enough for quantization to apply (the
DQN at its default size: 256-wide layers), measured by foxhunt.memory after one real update and
checked against the bytes computed by hand from the quantization plan."""

from __future__ import annotations

import pytest
import torch

from foxhunt.memory import measure_static
from foxhunt.precision.optim import convert_optimizer, make_optimizer
from foxhunt.precision.quantize import quantize_model

ADAM_STATES = 2  # exp_avg, exp_avg_sq
FP32 = 4
STEP_TENSOR = 4  # Adam's per-parameter "step" (an fp32 scalar tensor in torch and torchao)


def _one_update(model, optimizer) -> None:
    obs = torch.randn(32, model.obs_dim)
    model.q_net(obs).square().mean().backward()
    optimizer.step()


def _expected_int8_bytes(plan, params, block: int) -> tuple[int, int]:
    """(parameter bytes, optimizer bytes) of the int8 policy, from the plan, by hand."""
    param_bytes = sum(d.numel + d.shape[0] * FP32 if d.int8 else d.numel * FP32 for d in plan)
    optimizer_bytes = FP32  # torchao keeps the learning rate as a tensor
    for p in params:
        eight_bit = p.numel() >= 4096 and p.numel() % block == 0  # torchao's rule
        per_state = p.numel() + p.numel() // block * FP32 if eight_bit else p.numel() * FP32
        optimizer_bytes += STEP_TENSOR + ADAM_STATES * per_state
    return param_bytes, optimizer_bytes


def test_int8_reduces_parameters_and_optimizer_state_by_the_bytes_of_the_plan(build, int8_policy):
    fp32_model, _ = build("dqn")
    int8_model, _ = build("dqn")
    plan = quantize_model(int8_model, int8_policy)
    fp32_opt = make_optimizer(fp32_model.q_net.parameters(), "adam", lr=1e-3)
    int8_opt = convert_optimizer(make_optimizer(int8_model.q_net.parameters(), "adam", lr=1e-3), int8_policy)
    _one_update(fp32_model, fp32_opt)
    _one_update(int8_model, int8_opt)
    fp32, int8 = measure_static(fp32_model, fp32_opt), measure_static(int8_model, int8_opt)

    numel = sum(p.numel() for p in fp32_model.parameters())
    trained = sum(p.numel() for p in fp32_model.q_net.parameters())
    assert fp32.params_bytes == numel * FP32
    assert fp32.optimizer_bytes == trained * ADAM_STATES * FP32 + STEP_TENSOR * len(list(fp32_model.q_net.parameters()))
    expected_params, expected_optimizer = _expected_int8_bytes(
        plan, list(int8_model.q_net.parameters()), int8_policy.optimizer_block_size
    )
    assert int8.params_bytes == expected_params
    assert int8.optimizer_bytes == expected_optimizer
    assert int8.grads_bytes == fp32.grads_bytes == trained * FP32  # gradients stay fp32

    # 1 byte + a row scale per int8 weight, 2 bytes + 2 block scales per 8-bit state, vs 4 + 8
    share = (int8.params_bytes + int8.optimizer_bytes) / (fp32.params_bytes + fp32.optimizer_bytes)
    assert share == pytest.approx(0.2691, abs=0.0005)  # by hand: DQN q_net + target_net layer sizes
    assert int8.params_bytes / fp32.params_bytes == pytest.approx(0.2707, abs=0.0005)
