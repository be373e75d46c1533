"""Measured memory of a training run: accounting of the live tensors, device probes, budgets,
the Lightning budget callback and the report. Measures any ``nn.Module`` / optimizer; knows
no model, no job and no command line.
"""

from foxhunt.memory.accounting import (
    BYTES_PER_MB,
    ActivationMeter,
    ByteCounter,
    GradientMeter,
    MemoryBreakdown,
    buffer_bytes,
    gradient_bytes,
    measure_activations,
    measure_static,
    model_state_bytes,
    optimizer_state_bytes,
    parameter_bytes,
    tensor_bytes,
    to_mb,
)
from foxhunt.memory.budget import Breach, MemoryBudget, find_breaches
from foxhunt.memory.probes import DeviceProbes, DeviceSample, ProbeStatus

__all__ = [
    "BYTES_PER_MB",
    "ActivationMeter",
    "Breach",
    "ByteCounter",
    "DeviceProbes",
    "DeviceSample",
    "GradientMeter",
    "MemoryBreakdown",
    "MemoryBudget",
    "ProbeStatus",
    "buffer_bytes",
    "find_breaches",
    "gradient_bytes",
    "measure_activations",
    "measure_static",
    "model_state_bytes",
    "optimizer_state_bytes",
    "parameter_bytes",
    "tensor_bytes",
    "to_mb",
]
