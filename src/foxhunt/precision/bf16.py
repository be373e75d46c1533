"""bf16 on the device at hand: what runs in bf16, what must stay fp32, and the line that says so.

Lightning's ``bf16-mixed`` runs the forward pass under ``torch.autocast(dtype=torch.bfloat16)``.
Whether each op can run there depends on the device, not on the model:

- on a CPU, autocast sends ``lstm`` / ``gru`` / ``rnn`` to oneDNN's bf16 RNN primitive, which
  oneDNN only has where it finds AVX-512 (``avx512_core``); on an AVX2-only CPU the call fails
  with "could not create a primitive descriptor for the LSTM forward propagation primitive".
  Matmuls, linears and convolutions have reference bf16 kernels everywhere and run, emulated
  where the CPU has no bf16 arithmetic (``avx512_bf16`` / ``amx_bf16``; ``bf16`` on Arm): there
  bf16 halves the saved activations but does not speed the step up;
- on CUDA bf16 arithmetic is native from compute capability 8.0 (Ampere); older cards emulate
  it, or refuse autocast.

Nothing here is decided from a list of CPU or GPU models. :func:`bf16_support` *runs* each
op family of :data:`PROBED_TYPES` under autocast on the device (forward and backward of a tiny
instance, once per process and device) and records what failed and the error. Then
:func:`keep_fp32` turns every module of a failing type into a subclass whose forward runs in
fp32 with autocast off (same parameters, same state dict, same checkpoints): that one op runs
in fp32 inside the bf16 region and the rest of the model stays in bf16. When the basic family
(``Linear``) fails, bf16 cannot run on the device at all and the whole policy falls back to
``32-true`` (:attr:`Bf16Support.usable`). :func:`describe` is the one line a run prints.

Written here because no library offers it: torch and Lightning provide autocast, not a
per-device check of which kernels exist. It works on any ``nn.Module`` and knows no model.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

#: Module families whose bf16 kernels are probed, in order; ``Linear`` stands for bf16
#: autocast itself (matmul, linear): when it fails no op can run in bf16 on the device.
PROBED_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.LSTM, nn.GRU, nn.RNN)
BASIC_TYPE = "Linear"
#: Tensor shapes of a probe: tiny, but through the same kernels as a real layer.
PROBE_WIDTH = 8
PROBE_STEPS = 4
#: CPU flags that mean bf16 arithmetic in hardware (x86: AVX-512 BF16, AMX; Arm: BF16).
NATIVE_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
CUDA_NATIVE_CAPABILITY = (8, 0)
PRECISION_DTYPES_FILE = "precision_dtypes.txt"


@dataclass(frozen=True)
class Bf16Support:
    """What bf16 autocast can do on one device, as probed (see the module doc).

    ``hardware``: the device and what it has (CPU capability and flags, or the GPU and its
    compute capability); ``native``: bf16 arithmetic in hardware (else bf16 is emulated and
    saves memory only); ``failed``: module type name -> the first line of the error its bf16
    forward or backward raised here.
    """

    device: str
    hardware: str
    native: bool
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        """Whether bf16 autocast runs at all here (the basic matmul family did)."""
        return BASIC_TYPE not in self.failed

    def fp32_types(self) -> tuple[str, ...]:
        return tuple(name for name in self.failed if name != BASIC_TYPE)


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def _hardware(device: torch.device) -> tuple[str, bool]:
    """(a description of the device's bf16 hardware, whether bf16 arithmetic is native)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        name = torch.cuda.get_device_name(index)
        native = (major, minor) >= CUDA_NATIVE_CAPABILITY
        return f"{name} (sm_{major}{minor}{'' if native else ', bf16 emulated before sm_80'})", native
    if device.type != "cpu":
        return device.type, False
    flags = _cpu_flags()
    have = [flag for flag in NATIVE_CPU_FLAGS if flag in flags]
    capability = torch.backends.cpu.get_cpu_capability()
    onednn = bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    native = bool(have) and onednn
    text = f"CPU {capability}, {' '.join(have) if have else 'no bf16 arithmetic flag'}"
    if have and not onednn:
        text += ", oneDNN without bf16"
    return text, native


def _probe_module(kind: type[nn.Module]) -> tuple[nn.Module, torch.Tensor]:
    if kind is nn.Linear:
        return nn.Linear(PROBE_WIDTH, PROBE_WIDTH), torch.randn(2, PROBE_WIDTH)
    if kind is nn.Conv1d:
        return nn.Conv1d(PROBE_WIDTH, PROBE_WIDTH, 3, groups=PROBE_WIDTH), torch.randn(2, PROBE_WIDTH, PROBE_STEPS)
    return kind(PROBE_WIDTH, PROBE_WIDTH, num_layers=2, batch_first=True), torch.randn(2, PROBE_STEPS, PROBE_WIDTH)


def _probe(kind: type[nn.Module], device: torch.device) -> str | None:
    """``None`` when ``kind``'s forward and backward run under bf16 autocast on ``device``,
    else the first line of the error."""
    module, x = _probe_module(kind)
    module, x = module.to(device), x.to(device).requires_grad_(True)
    try:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            out = module(x)
        out = out[0] if isinstance(out, tuple) else out
        out.float().sum().backward()
    except RuntimeError as exc:  # the first sentence: oneDNN appends advice on verbose logging
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return first.split(". ")[0].rstrip(".")
    return None


@functools.cache
def _support(device_type: str, index: int | None) -> Bf16Support:
    device = torch.device(device_type, index) if index is not None else torch.device(device_type)
    hardware, native = _hardware(device)
    failed = {}
    # The probes' modules and inputs draw from torch's random streams, put back afterwards: the
    # first probe of a process (at validation, or after seeding) must not move a run's draws.
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        for kind in PROBED_TYPES:
            error = _probe(kind, device)
            if error is not None:
                failed[kind.__name__] = error
                if kind.__name__ == BASIC_TYPE:
                    break  # no bf16 at all: the other families say nothing more
    return Bf16Support(device=str(device), hardware=hardware, native=native, failed=failed)


def bf16_support(device: torch.device | str) -> Bf16Support:
    """What bf16 autocast runs on ``device`` (probed once per process and device)."""
    device = torch.device(device)
    return _support(device.type, device.index)


# -- fp32 islands ----------------------------------------------------------------------------
def _to_fp32(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(_to_fp32(v) for v in value)
    if isinstance(value, list):
        return [_to_fp32(v) for v in value]
    return value


def _device_type(args: tuple, kwargs: dict) -> str:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device.type
    return "cpu"


class Fp32Island(nn.Module):
    """Mixin: the module's forward runs in fp32 with autocast off (inputs cast up to fp32).
    Put before the module type it computes (``base``), which supplies the forward it wraps."""

    base: ClassVar[type[nn.Module]]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=_device_type(args, kwargs), enabled=False):
            return super().forward(*_to_fp32(args), **_to_fp32(kwargs))


class Fp32Conv1d(Fp32Island, nn.Conv1d):
    """``nn.Conv1d`` computed in fp32 inside a bf16 autocast region."""

    base = nn.Conv1d


class Fp32LSTM(Fp32Island, nn.LSTM):
    """``nn.LSTM`` computed in fp32 inside a bf16 autocast region."""

    base = nn.LSTM


class Fp32GRU(Fp32Island, nn.GRU):
    """``nn.GRU`` computed in fp32 inside a bf16 autocast region."""

    base = nn.GRU


class Fp32RNN(Fp32Island, nn.RNN):
    """``nn.RNN`` computed in fp32 inside a bf16 autocast region."""

    base = nn.RNN


ISLANDS: dict[type[nn.Module], type[nn.Module]] = {c.base: c for c in (Fp32Conv1d, Fp32LSTM, Fp32GRU, Fp32RNN)}


def keep_fp32(model: nn.Module, support: Bf16Support) -> dict[str, str]:
    """Make every module of a type whose bf16 kernel failed on the device an fp32 island
    (idempotent; exact types only, so a subclass with a forward of its own is left alone).
    Returns module name -> its type name, for every island in ``model`` now."""
    failing = set(support.fp32_types())
    islands = {}
    for name, module in model.named_modules():
        if not isinstance(module, Fp32Island) and type(module) in ISLANDS and type(module).__name__ in failing:
            module.__class__ = ISLANDS[type(module)]
        if isinstance(module, Fp32Island):
            islands[name] = module.base.__name__
    return islands


def describe(support: Bf16Support, islands: dict[str, str]) -> str:
    """The one line a bf16 run prints: what runs in which dtype on this device, and why."""
    head = f"precision bf16 on {support.device} ({support.hardware})"
    if not support.usable:
        return f"{head}: bf16 autocast cannot run here ({support.failed[BASIC_TYPE]}); this run trains in fp32 (32-true) instead"
    speed = (
        "native bf16 arithmetic"
        if support.native
        else "bf16 emulated (no bf16 arithmetic here: saves activation memory, not time)"
    )
    if not islands:
        return f"{head}: bf16 autocast for every op, {speed}"
    kinds = sorted(set(islands.values()))
    why = "; ".join(f"{kind}: {support.failed[kind]}" for kind in kinds if kind in support.failed)
    return (
        f"{head}: bf16 autocast, {speed}; {len(islands)} module(s) of type {', '.join(kinds)} run in fp32 "
        f"({', '.join(islands)}), no bf16 kernel for them here ({why})"
    )


# -- the dtypes a step computed in -----------------------------------------------------------
class DtypeRecorder:
    """Forward hooks on every module that owns parameters: the dtype of what each one returned
    during the step the recorder was active (a context manager), i.e. the dtype it computed in."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.seen: dict[str, set[str]] = {}
        self._handles: list[Any] = []

    def _hook(self, name: str):
        def record(module: nn.Module, args: Any, output: Any) -> None:
            dtypes = self.seen.setdefault(name, set())
            for value in output if isinstance(output, (tuple, list)) else (output,):
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    dtypes.add(str(value.dtype).removeprefix("torch."))

        return record

    def __enter__(self) -> DtypeRecorder:
        for name, module in self.model.named_modules():
            if any(True for _ in module.parameters(recurse=False)):
                self._handles.append(module.register_forward_hook(self._hook(name or "<root>")))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def text(self, line: str, islands: dict[str, str]) -> str:
        """``precision_dtypes.txt``: the run's line, then each module's observed output dtype."""
        width = max((len(name) for name in self.seen), default=6)
        rows = [f"# {line}", "# output dtype of each module with parameters, observed by forward hooks during the first training step",
                f"{'module':<{width}}  {'type':<24}  dtype      note"]  # fmt: skip
        for name in sorted(self.seen):
            module = self.model if name == "<root>" else self.model.get_submodule(name)
            note = "fp32 island: no bf16 kernel on this device" if name in islands else ""
            dtypes = ",".join(sorted(self.seen[name])) or "-"
            rows.append(f"{name:<{width}}  {type(module).__name__:<24}  {dtypes:<9}  {note}".rstrip())
        return "\n".join(rows) + "\n"

    def counts(self) -> dict[str, int]:
        """How many modules computed in each dtype."""
        totals: dict[str, int] = {}
        for dtypes in self.seen.values():
            for dtype in dtypes:
                totals[dtype] = totals.get(dtype, 0) + 1
        return totals
