"""make_optimizer picks torch's fused Adam/AdamW kernel where it applies, and only there;
convert_optimizer gives the optimizer a policy trains with."""

from __future__ import annotations

import torch
from hydra.utils import instantiate

from foxhunt.precision.optim import convert_optimizer, make_optimizer
from foxhunt.training.parts import compose_config


def _policy(name: str, **overrides):
    cfg = compose_config([f"precision={name}", *(f"precision.{k}={v}" for k, v in overrides.items())])
    return instantiate(cfg.precision)


def test_fused_on_real_parameters_and_param_groups():
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Linear(8, 2))
    assert make_optimizer(net.parameters(), "adam", lr=1e-3).defaults["fused"] is True
    groups = (p for p in [{"params": (q for q in net[0].parameters()), "lr": 1e-2}, {"params": net[1].parameters()}])
    optimizer = make_optimizer(groups, "adamw", lr=1e-3, weight_decay=0.1)
    assert optimizer.defaults["fused"] is True
    assert [len(g["params"]) for g in optimizer.param_groups] == [2, 2]  # generators were read once


def test_fused_step_equals_the_plain_step():
    torch.manual_seed(0)
    nets = [torch.nn.Linear(5, 4) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    fused = make_optimizer(nets[0].parameters(), "adamw", lr=1e-2, weight_decay=0.1)
    plain = torch.optim.AdamW(nets[1].parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(3):
        x = torch.randn(6, 5, generator=torch.Generator().manual_seed(step))
        for net, optimizer in zip(nets, (fused, plain)):
            optimizer.zero_grad()
            net(x).square().sum().backward()
            optimizer.step()
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_not_fused_on_meta_device_nor_under_a_grad_scaler():
    meta = torch.nn.Linear(3, 4, device="meta")
    assert make_optimizer(meta.parameters(), "adam", lr=1e-3).defaults.get("fused") is not True
    net = torch.nn.Linear(3, 4)
    fused = make_optimizer(net.parameters(), "adam", lr=1e-3, eps=1e-6)
    scaled = convert_optimizer(fused, _policy("fp32", trainer_precision="16-mixed"))
    assert scaled is not fused and scaled.defaults["fused"] is False and scaled.defaults["eps"] == 1e-6
    assert [g["params"] for g in scaled.param_groups] == [g["params"] for g in fused.param_groups]
    assert convert_optimizer(fused, _policy("bf16")) is fused  # bf16 autocast: no grad scaler


def test_eight_bit_states_keep_the_groups_and_hyperparameters_of_the_models_optimizer():
    from torchao.optim import AdamW8bit

    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 3))
    groups = [
        {"params": net[0].parameters(), "weight_decay": 0.1, "lr": 2e-3},
        {"params": net[1].parameters(), "weight_decay": 0.0},
    ]
    built = make_optimizer(groups, "adamw", lr=1e-3, eps=1e-7)
    from foxhunt.precision.policy import PrecisionPolicy

    policy = PrecisionPolicy(name="8bit-states", trainer_precision="32-true", optimizer_states="8bit", optimizer_block_size=128)
    converted = convert_optimizer(built, policy)
    assert isinstance(converted, AdamW8bit) and converted.block_size == 128
    for old, new in zip(built.param_groups, converted.param_groups):
        assert new["params"] == old["params"]
        assert (new["lr"], new["weight_decay"], new["eps"], new["betas"]) == (old["lr"], old["weight_decay"], 1e-7, old["betas"])
        assert "fused" not in new and "foreach" not in new
    adam = convert_optimizer(make_optimizer(net.parameters(), "adam", lr=1e-3), policy)
    assert not adam.is_adamw


def test_convert_refuses_an_optimizer_it_cannot_replace():
    net = torch.nn.Linear(3, 4)
    policy = _policy("int8")
    try:
        convert_optimizer(torch.optim.SGD(net.parameters(), lr=0.1), policy)
    except ValueError as exc:
        assert str(exc) == "precision int8: 8-bit optimizer states replace torch's Adam or AdamW, not SGD"
    else:
        raise AssertionError("SGD was converted")
    stepped = make_optimizer(net.parameters(), "adam", lr=1e-3)
    net(torch.randn(2, 3)).sum().backward()
    stepped.step()
    try:
        convert_optimizer(stepped, policy)
    except RuntimeError as exc:
        assert "has stepped already" in str(exc)
    else:
        raise AssertionError("a stepped optimizer was converted")


def _int8_model_and_grads(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128), torch.nn.Linear(128, 3))
    grads = [[torch.randn_like(p) for p in model.parameters()] for _ in range(3)]
    return model, grads


def test_fused_fp32_states_leave_the_8bit_updates_unchanged_and_update_small_tensors_as_adamw():
    """fuse_fp32_states: the tensors with 8-bit states get the same 8-bit update bit for bit; the small
    ones (fp32 states) the update of torch's AdamW; the states are the same tensors either way."""
    import copy

    from precision_helpers import load_policy

    updated = {}
    for fused in (False, True):
        model, grads = _int8_model_and_grads()
        policy = load_policy("int8", compile_optimizer=False, fuse_fp32_states=fused)
        optimizer = convert_optimizer(make_optimizer(model.parameters(), "adamw", lr=1e-2, weight_decay=1e-2), policy)
        for step in grads:
            for p, g in zip(model.parameters(), step):
                p.grad = g.clone()
            optimizer.step()
            assert all(p.grad is not None for p in model.parameters())  # the gradients held back are restored
        assert ("FusedFp32" in type(optimizer).__name__) == fused
        updated[fused] = (copy.deepcopy(model), optimizer.state_dict())
    (plain, plain_state), (fused, fused_state) = updated[False], updated[True]
    reference, grads = _int8_model_and_grads()
    adamw = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=1e-2)
    for step in grads:
        for p, g in zip(reference.parameters(), step):
            p.grad = g.clone()
        adamw.step()
    for (name, a), b, ref in zip(plain.named_parameters(), fused.parameters(), reference.parameters()):
        if a.numel() >= 4096:  # 8-bit states: the same update in both
            assert torch.equal(a, b), name
        else:
            assert torch.allclose(b, ref, rtol=1e-5, atol=1e-6), name
    for index, state in plain_state["state"].items():
        other = fused_state["state"][index]
        assert set(state) == set(other) and float(state["step"]) == float(other["step"]) == 3.0
        for key in ("exp_avg", "exp_avg_sq"):
            assert type(state[key]) is type(other[key]), (index, key)
