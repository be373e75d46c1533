"""Precision policies.

A policy names a precision (``fp32``, ``bf16``) and tells the Lightning Trainer which of its
precision plugins to use (``32-true``, ``bf16-mixed``). It converts any ``nn.Module`` and
knows nothing of models, jobs or the command line.
"""

from __future__ import annotations

from dataclasses import dataclass

LIGHTNING_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true")


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str
    trainer_precision: str

    def __post_init__(self) -> None:
        if self.trainer_precision not in LIGHTNING_PRECISIONS:
            raise ValueError(
                f"precision.trainer_precision={self.trainer_precision!r}: "
                f"must be one of {', '.join(LIGHTNING_PRECISIONS)}"
            )
