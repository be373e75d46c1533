"""Int8 inference copies: the policy's layers become int8, the rest and the original stay as they
were, outputs stay close to fp32, and a wrong int8 product on the device falls back to weight_only."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from foxhunt.precision import inference
from foxhunt.precision.inference import default_int8_policy, int8_inference_model, int8_matmul_error
from foxhunt.precision.quantize import Int8LSTM


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(64, 128)
        self.lstm = nn.LSTM(128, 64, batch_first=True)
        self.small = nn.Linear(64, 8)  # 512 elements: under the rule's 4096, stays fp32
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        out, _ = self.lstm(torch.relu(self.body(x)))
        return self.head(torch.relu(self.small(out)))


@pytest.mark.parametrize("config", ["weight_only", "dynamic_activation"])
def test_the_copy_quantizes_the_rules_layers_and_leaves_the_original(config):
    torch.manual_seed(0)
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    copied = int8_inference_model(model, default_int8_policy(), config)
    assert type(copied.lstm) is Int8LSTM and type(copied.body.weight) is not torch.nn.Parameter
    assert type(copied.small.weight) is nn.Parameter and type(copied.head.weight) is nn.Parameter
    assert not copied.training and not any(p.requires_grad for p in copied.parameters())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the original is untouched
    x = torch.randn(4, 6, 64)
    with torch.no_grad():
        reference, got = model(x), copied(x)
    assert (got - reference).abs().max() < 0.05 * reference.abs().max() + 1e-3
    assert copied.int8_config in ("weight_only", config)


def test_a_wrong_int8_product_falls_back_to_weight_only_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(inference, "int8_matmul_error", lambda device: "torch._int_mm is off by up to 9")
    with caplog.at_level(logging.WARNING, logger="foxhunt.precision.inference"):
        copied = int8_inference_model(Net(), default_int8_policy(), "dynamic_activation")
    assert copied.int8_config == "weight_only"
    (line,) = [r.getMessage() for r in caplog.records]
    assert "dynamic_activation needs exact int8 products and torch._int_mm is off by up to 9" in line


def test_this_devices_int8_product_is_checked_against_the_exact_one():
    generator = torch.Generator().manual_seed(7)
    a = torch.randint(-128, 128, (32, 64), dtype=torch.int8, generator=generator)
    b = torch.randint(-128, 128, (64, 48), dtype=torch.int8, generator=generator)
    exact_here = torch.equal(torch._int_mm(a, b).long(), a.long() @ b.long())
    error = int8_matmul_error("cpu")
    assert (error is None) == exact_here, error  # the verdict is this CPU's own
    assert int8_matmul_error(torch.device("cpu")) == error  # once per device type


def test_a_bad_config_and_a_policy_without_a_layer_rule_are_refused():
    from foxhunt.precision.policy import PrecisionPolicy

    with pytest.raises(ValueError, match=r"^precision.inference_weights='int4': must be one of weight_only, dynamic_activation$"):
        int8_inference_model(Net(), default_int8_policy(), "int4")
    with pytest.raises(ValueError, match="needs the int8 policy's layer rule"):
        int8_inference_model(Net(), PrecisionPolicy(name="fp32", trainer_precision="32-true"), "weight_only")
