"""Int8 training weights: the layer rule, the int8 modules' numerics, the state-dict layout."""

from __future__ import annotations

import io

import torch
import torch.nn.functional as F
from precision_helpers import load_policy
from torch import nn

from foxhunt.precision.quantize import (
    SCALE_SUFFIX,
    Int8Linear,
    Int8LSTM,
    dequantize_model,
    dequantize_state_dict,
    int8_share,
    is_int8_weight,
    plan_text,
    quantize_model,
)


def _decisions(plan):
    return {d.name: d for d in plan}


def test_mamba2_layer_list_keeps_norms_head_ssm_parameters_and_small_layers_in_fp32(build, int8_policy):
    model, _ = build("mamba2", "model.module.d_model=64", "model.module.n_layers=2")
    plan = quantize_model(model, int8_policy)
    by_name = _decisions(plan)
    for layer in (0, 1):
        mixer = f"backbone.layers.{layer}.mixer"
        assert by_name[f"{mixer}.in_proj.weight"].int8  # 386 x 64 = 24,704 elements
        assert by_name[f"{mixer}.out_proj.weight"].int8  # 64 x 128
        for name in ("A_log", "D", "dt_bias", "conv1d.weight", "norm.weight", "in_proj.bias"):
            assert not by_name[f"{mixer}.{name}"].int8, name
        assert not by_name[f"backbone.layers.{layer}.norm.weight"].int8
        assert is_int8_weight(model.get_submodule(f"{mixer}.in_proj").weight)
        assert not is_int8_weight(model.get_submodule(mixer).A_log)
    assert "keep_fp32 pattern '*head*'" in by_name["head.linear.weight"].reason  # 90 x 64: big enough, kept
    assert "1024 elements < min_quantized_numel 4096" in by_name["input_proj.weight"].reason
    assert [d.name for d in plan if d.int8] == [
        f"backbone.layers.{i}.mixer.{p}.weight" for i in (0, 1) for p in ("in_proj", "out_proj")
    ]


def test_tft_layer_list_quantizes_lstms_and_grns_not_embeddings_norms_or_the_quantile_head(build, int8_policy):
    model, _ = build("tft", "model.module.hidden_size=64", "model.module.lstm_layers=1")
    plan = quantize_model(model, int8_policy)
    by_name = _decisions(plan)
    assert isinstance(model.encoder_lstm, Int8LSTM) and isinstance(model.decoder_lstm, Int8LSTM)
    for name in ("encoder_lstm.weight_ih_l0", "encoder_lstm.weight_hh_l0", "decoder_lstm.weight_hh_l0",
                 "positionwise_grn.fc_hidden.weight", "attention.query.weight"):  # fmt: skip
        assert by_name[name].int8, name
    for name in ("encoder_lstm.bias_ih_l0", "static_embedding.weight", "post_lstm_gate.norm.weight",
                 "quantile_head.linear.weight"):  # fmt: skip
        assert not by_name[name].int8, name
    text = plan_text(plan, int8_policy)
    count, share = int8_share(plan)
    assert f"# int8 ({count})" in text and f"({share:.1f}%)" in text
    assert "quantile_head.linear.weight\tLinear\t[9, 64]\tkept: module name matches keep_fp32 pattern '*head*'" in text


def test_quantize_is_idempotent_and_keeps_names_and_requires_grad(build, int8_policy):
    model, _ = build("dqn")
    names = [n for n, _ in model.named_parameters()]
    quantize_model(model, int8_policy)
    first = {n: p for n, p in model.named_parameters()}
    quantize_model(model, int8_policy)
    assert [n for n, _ in model.named_parameters()] == names
    assert all(p is first[n] for n, p in model.named_parameters())  # nothing re-quantized
    assert is_int8_weight(model.target_net[2].weight) and not model.target_net[2].weight.requires_grad
    assert model.q_net[2].weight.requires_grad


def test_fp32_policy_changes_nothing(build):
    model, _ = build("dqn")
    plan = quantize_model(model, load_policy("fp32"))
    assert not any(d.int8 for d in plan)
    assert not any(is_int8_weight(p) for p in model.parameters())


def test_int8_linear_matches_linear_on_dequantized_weight_with_non_contiguous_input():
    torch.manual_seed(0)
    linear = nn.Linear(32, 48)
    int8 = Int8Linear.from_float(linear)
    reference = nn.Linear(32, 48)
    reference.weight.data.copy_(int8.weight.dequantize())
    reference.bias.data.copy_(linear.bias.data)
    x = torch.randn(4, 7, 2, 32)[:, :, 1]  # non-contiguous, as the TFT's variable slices
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, expected = int8(x1), reference(x2)
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(int8.weight.grad, reference.weight.grad)
    torch.testing.assert_close(int8.bias.grad, reference.bias.grad)
    assert type(int8.weight.grad) is torch.Tensor  # a plain fp32 gradient


def test_int8_lstm_matches_lstm_on_dequantized_weights():
    torch.manual_seed(0)
    lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
    int8 = Int8LSTM.from_float(lstm, min_numel=1)
    reference = int8.to_float()
    assert all(is_int8_weight(getattr(int8, n)) for n in int8._flat_weights_names if n.startswith("weight_"))
    x = torch.randn(3, 5, 16)
    h0 = (torch.randn(2, 3, 32), torch.randn(2, 3, 32))
    (out, (h, c)), (ref_out, (ref_h, ref_c)) = int8(x, h0), reference(x, h0)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(h, ref_h)
    torch.testing.assert_close(c, ref_c)
    out.sum().backward()
    ref_out.sum().backward()
    torch.testing.assert_close(int8.weight_hh_l1.grad, reference.weight_hh_l1.grad)
    torch.testing.assert_close(int8.bias_ih_l0.grad, reference.bias_ih_l0.grad)


def test_int8_state_dict_is_plain_tensors_that_load_weights_only_and_round_trip(build):
    int8_policy = load_policy("int8", min_quantized_numel=256)
    model, _ = build("tft", "model.module.hidden_size=16", "model.module.lstm_layers=1")
    quantize_model(model, int8_policy)
    state = model.state_dict()
    assert "encoder_lstm.weight_ih_l0" + SCALE_SUFFIX in state
    assert state["encoder_lstm.weight_ih_l0"].dtype == torch.int8
    assert all(type(t) is torch.Tensor for t in state.values())
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)

    fresh, _ = build("tft", "model.module.hidden_size=16", "model.module.lstm_layers=1")
    quantize_model(fresh, int8_policy)
    fresh.load_state_dict(loaded)
    for name, param in model.named_parameters():
        other = fresh.get_parameter(name)
        if is_int8_weight(param):
            assert torch.equal(param.int_data, other.int_data) and torch.equal(param.scale, other.scale)
        else:
            assert torch.equal(param, other)

    plain, _ = build("tft", "model.module.hidden_size=16", "model.module.lstm_layers=1")
    plain.load_state_dict(dequantize_state_dict(state))
    torch.testing.assert_close(plain.encoder_lstm.weight_ih_l0, model.encoder_lstm.weight_ih_l0.dequantize())
    dequantize_model(model)
    assert not any(is_int8_weight(p) for p in model.parameters())
    assert type(model.encoder_lstm) is nn.LSTM


def test_linear_gradient_of_int8_layer_equals_fp32_layer_gradient_through_f_linear():
    """The straight-through contract: d loss / d int8 weight = d loss / d dequantized weight."""
    torch.manual_seed(1)
    int8 = Int8Linear.from_float(nn.Linear(8, 64, bias=False))
    weight = int8.weight.dequantize().requires_grad_()
    x = torch.randn(5, 8)
    int8(x).tanh().sum().backward()
    F.linear(x, weight).tanh().sum().backward()
    torch.testing.assert_close(int8.weight.grad, weight.grad)
