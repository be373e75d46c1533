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

``dynamic_activation`` multiplies int8 by int8 (``torch._int_mm``). On a CPU without VNNI
oneDNN computes that product through 16-bit intermediate sums that saturate, so the result is
wrong, silently (far beyond rounding where oneDNN is capped at AVX2; the figures:
docs/benchmarks.md). :func:`int8_matmul_error` checks the product against the exact one once per device; where
it is wrong the copy uses ``weight_only`` instead and says so in one line. The config the copy
uses is its attribute ``int8_config``.
"""

from __future__ import annotations

import copy
import functools
import logging
from importlib import resources

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from foxhunt.precision.policy import INFERENCE_CONFIGS, PrecisionPolicy

# Lazy imports: (c) torchao and foxhunt.precision.quantize (which imports torchao, seconds), in int8_inference_model: the ensemble and memory commands import this module for every member, an int8 copy needs them

log = logging.getLogger(__name__)
#: Shape of the probe product (int8 @ int8 -> int32), big enough for the gemm kernels.
PROBE_SHAPE = (32, 64, 48)
INT8_RANGE = (-128, 128)


@functools.cache
def _int8_matmul_error(device_type: str) -> str | None:
    rows, inner, cols = PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(*INT8_RANGE, (rows, inner), dtype=torch.int8, generator=generator)
    b = torch.randint(*INT8_RANGE, (inner, cols), dtype=torch.int8, generator=generator)
    exact = a.long() @ b.long()
    try:
        got = torch._int_mm(a.to(device_type), b.to(device_type)).long().cpu()
    except RuntimeError as exc:
        return f"torch._int_mm fails: {str(exc).splitlines()[0]}"
    worst = int((got - exact).abs().max())
    return None if worst == 0 else f"torch._int_mm is off by up to {worst} against the exact int8 product"


def int8_matmul_error(device: torch.device | str) -> str | None:
    """``None`` when int8 x int8 matrix products are exact on ``device`` (checked once), else why not."""
    return _int8_matmul_error(torch.device(device).type)


def int8_inference_model(model: nn.Module, policy: PrecisionPolicy, config: str | None = None) -> nn.Module:
    """An eval-mode int8 copy of ``model`` for inference (see the module doc).

    ``config``: ``weight_only`` | ``dynamic_activation``; default ``policy.inference_weights``.
    """
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

    from foxhunt.precision.quantize import Int8LSTM, dequantize_model, quantization_plan

    config = config or policy.inference_weights
    if config not in INFERENCE_CONFIGS:
        raise ValueError(f"precision.inference_weights={config!r}: must be one of {', '.join(INFERENCE_CONFIGS)}")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    if config == "dynamic_activation" and (error := int8_matmul_error(device)) is not None:
        log.warning("int8 inference on %s: dynamic_activation needs exact int8 products and %s; "
                    "using weight_only (int8 weights, fp32 activations)", device.type, error)  # fmt: skip
        config = "weight_only"
    if not policy.quantizes_weights:
        raise ValueError(f"precision {policy.name}: an int8 inference copy needs the int8 policy's layer rule")
    copied = dequantize_model(copy.deepcopy(model)).eval()
    selected = {d.name.rpartition(".")[0] for d in quantization_plan(copied, policy) if d.int8}
    linears = {name for name, module in copied.named_modules() if name in selected and isinstance(module, nn.Linear)}
    for name, module in list(copied.named_modules()):
        if name in selected and isinstance(module, nn.LSTM):
            parent, _, child = name.rpartition(".")
            setattr(copied.get_submodule(parent) if parent else copied, child,
                    Int8LSTM.from_float(module, policy.int8_min_numel).eval())  # fmt: skip
    torchao_config = (
        Int8WeightOnlyConfig(set_inductor_config=False)
        if config == "weight_only"
        else Int8DynamicActivationInt8WeightConfig(set_inductor_config=False)
    )
    if linears:
        quantize_(copied, torchao_config, filter_fn=lambda module, fqn: fqn in linears)
    for param in copied.parameters():
        param.requires_grad_(False)
    copied.int8_config = config  # type: ignore[assignment]  # torch types Module.__setattr__'s value Tensor | Module; any is kept
    return copied


def default_int8_policy() -> PrecisionPolicy:
    """The int8 policy of ``conf/precision/int8.yaml``: its layer rule picks the layers an int8
    inference copy quantizes (for a model whose run was not trained in int8)."""
    text = resources.files("foxhunt.conf").joinpath("precision", "int8.yaml").read_text()
    return instantiate(OmegaConf.create(text))
