"""Precision policies.

A policy names a precision (``fp32``, ``bf16``, ``int8``) and says how a model and its
optimizer are represented while training:

- ``trainer_precision``: the Lightning precision plugin (``32-true``, ``bf16-mixed``) the
  Trainer runs the forward and backward passes under;
- ``weights``: ``fp32``, or ``int8`` to store the weight matrices of the layers the rule below
  selects as int8 (torchao quantized training; :mod:`foxhunt.precision.quantize`);
- ``optimizer_states``: ``32bit``, or 8 bits per element with one fp32 scale per
  ``optimizer_block_size`` elements for Adam's two moments: ``fp8`` (float8 e4m3 codes,
  torchao ``Adam(W)Fp8``) or ``8bit`` (dynamic-map codes, torchao ``Adam(W)8bit``);
  ``compile_optimizer`` false runs the 8-bit update (foxhunt's, :mod:`foxhunt.precision.eight_bit_step`,
  over torchao's states) eagerly instead of compiled; ``fuse_fp32_states`` updates the tensors torchao keeps fp32 states for (small
  ones) with one fused torch Adam(W) call (:mod:`foxhunt.precision.optim`).

The rule that picks the int8 layers, all from ``conf/precision/int8.yaml``:
``quantize_types`` (module types whose weight matrices may be int8: ``Linear``, ``LSTM``),
``min_quantized_numel`` (a smaller matrix stays fp32: its int8 saving is a few KB and its
per-row scale and the per-call cast cost more than they save) and ``keep_fp32`` (shell-style
patterns on module names kept in fp32 whatever their size: the output heads).
Everything that is not such a weight matrix (biases, norms, embeddings, the SSM's ``A_log``,
``D``, ``dt_bias``, convolutions) stays fp32 by construction.

``inference_weights`` is the torchao config an int8 *inference* copy of a model uses
(:func:`foxhunt.precision.inference.int8_inference_model`): ``weight_only`` or
``dynamic_activation`` (int8 weights and per-token int8 activations).

``choice``: set by ``precision=auto`` (:mod:`foxhunt.precision.auto`) to the line that says which
of bf16 and fp32 it picked on the device and why; ``None`` for a precision chosen by name.

A policy applies to any ``nn.Module`` (:func:`foxhunt.precision.quantize.quantize_model`) and
knows nothing of models, jobs or the command line; the Lightning side is
:mod:`foxhunt.precision.plugin` (the Trainer's precision plugin, built once per Trainer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

LIGHTNING_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true")
WEIGHT_FORMATS = ("fp32", "int8")
OPTIMIZER_STATE_FORMATS = ("32bit", "8bit", "fp8")
QUANTIZABLE_TYPES = ("Linear", "LSTM")
INFERENCE_CONFIGS = ("weight_only", "dynamic_activation")


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str
    trainer_precision: str
    weights: str = "fp32"
    optimizer_states: str = "32bit"
    min_quantized_numel: int | None = None
    keep_fp32: Sequence[str] = field(default_factory=tuple)
    quantize_types: Sequence[str] = field(default_factory=tuple)
    optimizer_block_size: int | None = None
    compile_optimizer: bool = True
    fuse_fp32_states: bool = False
    inference_weights: str | None = None
    choice: str | None = None  # precision=auto: what it chose on this device and why (foxhunt.precision.auto)

    def __post_init__(self) -> None:
        # Hydra passes ListConfig for lists: keep plain tuples (hashable, picklable)
        object.__setattr__(self, "keep_fp32", tuple(str(p) for p in self.keep_fp32))
        object.__setattr__(self, "quantize_types", tuple(str(t) for t in self.quantize_types))
        _one_of("trainer_precision", self.trainer_precision, LIGHTNING_PRECISIONS)
        _one_of("weights", self.weights, WEIGHT_FORMATS)
        _one_of("optimizer_states", self.optimizer_states, OPTIMIZER_STATE_FORMATS)
        for kind in self.quantize_types:
            _one_of("quantize_types", kind, QUANTIZABLE_TYPES)
        if self.inference_weights is not None:
            _one_of("inference_weights", self.inference_weights, INFERENCE_CONFIGS)
        if self.quantizes_weights:
            if self.trainer_precision != "32-true":
                raise ValueError(
                    f"precision.trainer_precision={self.trainer_precision!r}: int8 weights train "
                    "under 32-true (the matmuls run in fp32 on the dequantized rows)"
                )
            if self.min_quantized_numel is None or int(self.min_quantized_numel) < 1:
                raise ValueError(
                    f"precision.min_quantized_numel={self.min_quantized_numel!r}: int8 weights need a size threshold >= 1"
                )
            if not self.quantize_types:
                raise ValueError("precision.quantize_types: int8 weights need at least one of Linear, LSTM")
            if not self.eight_bit_optimizer:
                raise ValueError(
                    f"precision.optimizer_states={self.optimizer_states!r}: int8 weights need 8-bit "
                    "optimizer states (8bit or fp8; torch's optimizers cannot update int8 weights)"
                )
        if self.eight_bit_optimizer and (self.optimizer_block_size is None or int(self.optimizer_block_size) < 1):
            raise ValueError(
                f"precision.optimizer_block_size={self.optimizer_block_size!r}: 8-bit optimizer states need a block size >= 1"
            )

    @property
    def quantizes_weights(self) -> bool:
        return self.weights == "int8"

    @property
    def eight_bit_optimizer(self) -> bool:
        return self.optimizer_states in ("8bit", "fp8")

    @property
    def int8_min_numel(self) -> int:
        """``min_quantized_numel`` of a policy that quantizes weights (``__post_init__`` checked it is set)."""
        assert self.min_quantized_numel is not None, f"precision {self.name} quantizes no weights"
        return int(self.min_quantized_numel)

    @property
    def eight_bit_block_size(self) -> int:
        """``optimizer_block_size`` of a policy with 8-bit optimizer states (``__post_init__`` checked it is set)."""
        assert self.optimizer_block_size is not None, f"precision {self.name} has no 8-bit optimizer states"
        return int(self.optimizer_block_size)


def _one_of(key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"precision.{key}={value!r}: must be one of {', '.join(allowed)}")
