"""make_optimizer picks torch's fused Adam/AdamW kernel where it applies, and only there."""

from __future__ import annotations

import torch
from hydra.utils import instantiate

from foxhunt.build import compose_config
from foxhunt.precision.optim import make_optimizer


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
    scaled = make_optimizer(net.parameters(), "adam", lr=1e-3, policy=_policy("fp32", trainer_precision="16-mixed"))
    assert scaled.defaults.get("fused") is not True
    assert make_optimizer(net.parameters(), "adam", lr=1e-3, policy=_policy("bf16")).defaults["fused"] is True
