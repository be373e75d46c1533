"""Int8 inference copies of a trained model (fp32- or int8-trained), for latency.

:func:`int8_inference_model` returns a copy in eval mode whose linear layers use torchao's
inference configs (``quantize_`` with ``Int8WeightOnlyConfig`` for ``weight_only``, or
``Int8DynamicActivationInt8WeightConfig`` for ``dynamic_activation``: int8 weights and
per-token int8 activations) and whose LSTMs keep int8 weights
(:class:`foxhunt.precision.quantize.Int8LSTM`; torchao's inference configs convert linear
layers only). The layers converted are those the policy's rule selects for training
(:func:`foxhunt.precision.quantize.quantization_plan`), so heads, norms and small layers stay
fp32 here as well. An int8-trained model is first dequantized (its int8 rows are exact in
fp32) and then re-quantized by the inference config; the original model is not modified.
"""

from __future__ import annotations

import copy

from torch import nn

from foxhunt.precision.policy import PrecisionPolicy


def int8_inference_model(model: nn.Module, policy: PrecisionPolicy, config: str | None = None) -> nn.Module:
    """An eval-mode int8 copy of ``model`` for inference (see the module doc).

    ``config``: ``weight_only`` | ``dynamic_activation``; default ``policy.inference_weights``.
    """
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

    from foxhunt.precision.policy import INFERENCE_CONFIGS
    from foxhunt.precision.quantize import Int8LSTM, dequantize_model, quantization_plan

    config = config or policy.inference_weights
    if config not in INFERENCE_CONFIGS:
        raise ValueError(f"precision.inference_weights={config!r}: must be one of {', '.join(INFERENCE_CONFIGS)}")
    if not policy.quantizes_weights:
        raise ValueError(f"precision {policy.name}: an int8 inference copy needs the int8 policy's layer rule")
    copied = dequantize_model(copy.deepcopy(model)).eval()
    selected = {d.name.rpartition(".")[0] for d in quantization_plan(copied, policy) if d.int8}
    linears = {name for name, module in copied.named_modules() if name in selected and isinstance(module, nn.Linear)}
    for name, module in list(copied.named_modules()):
        if name in selected and isinstance(module, nn.LSTM):
            parent, _, child = name.rpartition(".")
            setattr(copied.get_submodule(parent) if parent else copied, child,
                    Int8LSTM.from_float(module, int(policy.min_quantized_numel)).eval())  # fmt: skip
    torchao_config = (
        Int8WeightOnlyConfig(set_inductor_config=False)
        if config == "weight_only"
        else Int8DynamicActivationInt8WeightConfig(set_inductor_config=False)
    )
    if linears:
        quantize_(copied, torchao_config, filter_fn=lambda module, fqn: fqn in linears)
    for param in copied.parameters():
        param.requires_grad_(False)
    return copied
