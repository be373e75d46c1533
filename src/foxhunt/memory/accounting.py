"""Byte accounting of the tensors a training run holds, measured on the live tensors.

Components: parameters, gradients, optimizer state, buffers, model-owned state (tensors a
module keeps outside its parameters and buffers, such as a replay or rollout buffer) and
activations (the bytes autograd saves for backward during a real training step, peak over the
step). Works on any ``nn.Module`` and ``torch.optim.Optimizer``; knows no model.

Counting rules, the same for every component:

- **Storages, counted once.** A tensor costs the bytes of the storage behind it, and a storage
  is counted once however many tensors point into it (tied weights, views, an attribute that
  aliases a parameter). The key of a storage is ``(device type, device index, data_ptr)``. A
  view that keeps a larger storage alive costs the whole storage: that is the memory held.
  A :class:`ByteCounter` is one such scope; :func:`measure_static` uses one counter for all
  components in the order parameters, gradients, optimizer state, buffers, model state, so
  no byte appears under two components.
- **Tensor subclasses through their inner tensors.** A wrapper subclass (torchao's quantized
  weights, its 8-bit optimizer states, anything implementing ``__tensor_flatten__``) owns no
  data of its own; it is counted through the tensors ``__tensor_flatten__`` names,
  recursively.
- **Meta tensors hold no memory** and count 0. A tensor without a plain storage (sparse
  layouts) counts ``numel x element_size`` of its own (sparse COO: its indices and values).

Model-owned state (:func:`model_state_bytes`): for every submodule, every instance attribute
except the module's own ``_parameters`` / ``_buffers`` / ``_modules`` tables is inspected:

- a tensor is counted;
- an object with a callable ``memory_tensors()`` is counted through what it returns (a tensor
  or a list / tuple / dict of them, nested);
- a ``list`` / ``tuple`` / ``dict`` / ``set`` is walked, with these same rules for its items;
- anything else (the Trainer, an environment, a dataset) is not walked: an object that holds
  device tensors the budget must see exposes them through ``memory_tensors()``.
Storages of the module's parameters and buffers are excluded (they are counted under their
own components).

Activations (:class:`ActivationMeter`, :func:`measure_activations`): while the meter is
active, ``torch.autograd.graph.saved_tensors_hooks`` sees every tensor autograd saves for
backward. The pack hook adds the tensor's storages to a live set (each storage once, however
many graph nodes save it) and returns a small handle holding a detached alias of the tensor;
autograd keeps that handle until the node's backward has run (or the graph is dropped), and
the handle's ``__del__`` then removes its storages from the live set. The peak of the live
bytes over the measured window is the activation figure, so memory freed by one backward is
not summed with the next forward's. Storages of the module's parameters and buffers are
excluded (autograd saves weights by reference; they are parameters, not activations). Inputs
saved for backward (a batch that a first layer's weight gradient needs) are counted: they are
held for backward. Regions that install their own hooks (non-reentrant activation
checkpointing) are not seen by the meter.

Written by hand because torch offers no public function that sums unique storages through
wrapper subclasses, and its allocator statistics exist on CUDA only and cannot split a step's
memory into these components.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

BYTES_PER_MB = 1024 * 1024  # "MB" in foxhunt is the MiB that nvidia-smi reports

StorageKey = tuple

_MODULE_TABLES = frozenset({"_parameters", "_buffers", "_modules"})


def to_mb(nbytes: int | float) -> float:
    """Bytes -> MB (MiB, 1 MB = 1,048,576 bytes)."""
    return float(nbytes) / BYTES_PER_MB


# -- storages ------------------------------------------------------------------------------
def plain_tensors(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """The plain tensors holding ``tensor``'s data: itself, or a subclass's inner tensors."""
    if is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()
        for name in names:
            inner = getattr(tensor, name)
            if inner is not None:
                yield from plain_tensors(inner)
    elif tensor.layout == torch.sparse_coo:
        yield from plain_tensors(tensor._indices())
        yield from plain_tensors(tensor._values())
    else:
        yield tensor


def storage_footprint(tensor: torch.Tensor) -> Iterator[tuple[StorageKey, int]]:
    """``(storage key, bytes)`` of every storage behind ``tensor`` (see the module rules)."""
    for plain in plain_tensors(tensor):
        device = plain.device
        if device.type == "meta":
            continue
        index = -1 if device.index is None else device.index
        try:
            storage = plain.untyped_storage()
        except (RuntimeError, TypeError):  # NotImplemented errors are RuntimeErrors
            nbytes = plain.numel() * plain.element_size()
            if nbytes:
                yield ("tensor", device.type, index, id(plain)), nbytes
            continue
        nbytes = storage.nbytes()
        if nbytes:
            yield (device.type, index, storage.data_ptr()), nbytes


def iter_tensors(obj: Any, _seen: set[int] | None = None) -> Iterator[torch.Tensor]:
    """Tensors in ``obj``: a tensor, or list / tuple / dict / set of them, nested."""
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if isinstance(obj, (list, tuple, set, frozenset, dict)):
        seen = set() if _seen is None else _seen
        if id(obj) in seen:
            return
        seen.add(id(obj))
        items = obj.values() if isinstance(obj, dict) else obj
        for item in items:
            yield from iter_tensors(item, seen)


class ByteCounter:
    """Bytes of unique storages, accumulated over calls: one counter is one dedup scope."""

    def __init__(self) -> None:
        self._seen: set[StorageKey] = set()

    def add(self, tensor: torch.Tensor) -> int:
        """Count ``tensor``'s storages not seen yet; return the bytes newly counted."""
        added = 0
        for key, nbytes in storage_footprint(tensor):
            if key not in self._seen:
                self._seen.add(key)
                added += nbytes
        return added

    def add_all(self, tensors: Iterable[torch.Tensor]) -> int:
        return sum(self.add(t) for t in tensors)

    def exclude(self, tensors: Iterable[torch.Tensor]) -> None:
        """Mark storages as seen without counting them."""
        for tensor in tensors:
            for key, _ in storage_footprint(tensor):
                self._seen.add(key)

    def __contains__(self, key: StorageKey) -> bool:
        return key in self._seen


def tensor_bytes(tensors: torch.Tensor | Iterable[Any]) -> int:
    """Bytes of the unique storages behind ``tensors`` (a tensor or a nested container)."""
    if not isinstance(tensors, (torch.Tensor, list, tuple, set, frozenset, dict)):
        tensors = list(tensors)
    return ByteCounter().add_all(iter_tensors(tensors))


# -- static components ---------------------------------------------------------------------
def _optimizers(optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None) -> list:
    if optimizers is None:
        return []
    if isinstance(optimizers, torch.optim.Optimizer):
        return [optimizers]
    return list(optimizers)


def parameter_bytes(module: nn.Module, counter: ByteCounter | None = None) -> int:
    return (counter or ByteCounter()).add_all(module.parameters())


def gradient_bytes(module: nn.Module, counter: ByteCounter | None = None) -> int:
    grads = (p.grad for p in module.parameters() if p.grad is not None)
    return (counter or ByteCounter()).add_all(grads)


def buffer_bytes(module: nn.Module, counter: ByteCounter | None = None) -> int:
    return (counter or ByteCounter()).add_all(module.buffers())


def optimizer_state_bytes(
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None,
    counter: ByteCounter | None = None,
) -> int:
    """Bytes of the optimizers' per-parameter state (Adam's moments and ``step``, ...) and of
    tensors in their param groups other than the parameters themselves (a tensor ``lr``)."""
    counter = counter or ByteCounter()
    total = 0
    for optimizer in _optimizers(optimizers):
        for state in optimizer.state.values():
            total += counter.add_all(iter_tensors(state))
        for group in optimizer.param_groups:
            total += counter.add_all(iter_tensors({k: v for k, v in group.items() if k != "params"}))
    return total


def _owned_tensors(obj: Any, seen: set[int]) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if isinstance(obj, nn.Module):  # submodules are visited on their own
        return
    memory_tensors = getattr(obj, "memory_tensors", None)
    if callable(memory_tensors) and not isinstance(obj, type):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        yield from iter_tensors(memory_tensors())
        return
    if isinstance(obj, (list, tuple, set, frozenset, dict)):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        items = obj.values() if isinstance(obj, dict) else obj
        for item in items:
            yield from _owned_tensors(item, seen)


def model_state_tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    """Tensors ``module`` owns outside its parameters and buffers (rule in the module doc)."""
    seen: set[int] = set()
    for submodule in module.modules():
        for name, value in vars(submodule).items():
            if name not in _MODULE_TABLES:
                yield from _owned_tensors(value, seen)


def model_state_bytes(module: nn.Module, counter: ByteCounter | None = None) -> int:
    """Bytes of the tensors ``module`` owns outside its parameters and buffers."""
    if counter is None:
        counter = ByteCounter()
        counter.exclude(module.parameters())
        counter.exclude(module.buffers())
    return counter.add_all(model_state_tensors(module))


@dataclass(frozen=True)
class MemoryBreakdown:
    """Measured bytes per component of a training run; ``*_mb`` properties in MB (MiB)."""

    params_bytes: int = 0
    grads_bytes: int = 0
    optimizer_bytes: int = 0
    buffers_bytes: int = 0
    model_state_bytes: int = 0
    activations_bytes: int = 0
    temporaries_bytes: int = 0  # what the allocator held beyond the others at its peak (0: not measured)

    @property
    def params_mb(self) -> float:
        return to_mb(self.params_bytes)

    @property
    def grads_mb(self) -> float:
        return to_mb(self.grads_bytes)

    @property
    def optimizer_mb(self) -> float:
        return to_mb(self.optimizer_bytes)

    @property
    def buffers_mb(self) -> float:
        return to_mb(self.buffers_bytes)

    @property
    def model_state_mb(self) -> float:
        return to_mb(self.model_state_bytes)

    @property
    def activations_mb(self) -> float:
        return to_mb(self.activations_bytes)

    @property
    def temporaries_mb(self) -> float:
        return to_mb(self.temporaries_bytes)

    @property
    def total_training_bytes(self) -> int:
        """Sum of the components. With ``temporaries`` measured, the allocator's peak (or the
        sum of the others, each at its own peak, when that is higher); without, that sum alone."""
        return sum(self.components().values())

    @property
    def total_training_mb(self) -> float:
        return to_mb(self.total_training_bytes)

    def components(self) -> dict[str, int]:
        """``{component: bytes}`` in display order (``params``, ``grads``, ...)."""
        return {f.name.removesuffix("_bytes"): getattr(self, f.name) for f in fields(self)}


COMPONENT_METHODS = {
    "params": "bytes of the live parameter tensors (unique storages, subclasses via inner tensors)",
    "grads": "bytes of the live .grad tensors (unique storages)",
    "optimizer": "bytes of the live optimizer state tensors (unique storages, subclasses via inner tensors)",
    "buffers": "bytes of the live registered buffers (unique storages)",
    "model_state": "bytes of tensors the module owns outside params/buffers (attributes, memory_tensors())",
    "activations": "peak bytes saved for backward during a real training step (saved_tensors_hooks, unique storages)",
    "temporaries": "allocator peak of that step (bytes live when it began + the peak of what it allocated, "
    "foxhunt.memory.allocations.AllocationPeak, equal to torch's MemTracker) minus the components above: "
    "the backward pass's temporaries",
}


def measure_static(
    module: nn.Module,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
    activations_bytes: int = 0,
) -> MemoryBreakdown:
    """Parameters, gradients, optimizer state, buffers and model state of ``module`` now.

    One counter across components (parameters first): a storage shared between two of them
    is counted under the first. ``activations_bytes`` is carried into the result as given.
    """
    counter = ByteCounter()
    params = parameter_bytes(module, counter)
    grads = gradient_bytes(module, counter)
    optimizer = optimizer_state_bytes(optimizers, counter)
    buffers = buffer_bytes(module, counter)
    state = model_state_bytes(module, counter)
    return MemoryBreakdown(params, grads, optimizer, buffers, state, activations_bytes)


# -- activations ---------------------------------------------------------------------------
class _SavedTensor:
    """What the pack hook hands autograd: a detached alias plus the storages it keeps live."""

    __slots__ = ("tensor", "keys", "meter")

    def __init__(self, tensor: torch.Tensor, keys: list[StorageKey], meter: ActivationMeter) -> None:
        self.tensor = tensor
        self.keys = keys
        self.meter = meter

    def __del__(self) -> None:
        if self.keys:
            self.meter._release(self.keys)


class ActivationMeter:
    """Peak bytes autograd saves for backward while the meter is active (a context manager).

    ``exclude``: a module or tensors whose storages are not activations (the module's
    parameters and buffers); taken when the meter is entered. ``peak_bytes`` is the running
    peak of the live saved bytes, ``live_bytes`` what is still held, ``saved_tensors`` how
    many tensors autograd saved; ``peak_by_dtype`` splits the peak by the dtype of the saved
    tensors (``{"bfloat16": ..., "float32": ...}`` under bf16 autocast).
    """

    def __init__(self, exclude: nn.Module | Iterable[torch.Tensor] | None = None) -> None:
        self._exclude_source = exclude
        self._excluded: set[StorageKey] = set()
        self._refs: dict[StorageKey, int] = {}
        self._sizes: dict[StorageKey, int] = {}
        self._dtypes: dict[StorageKey, str] = {}
        self._lock = threading.RLock()  # a release can run inside a pack (a GC pass there)
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self.live_bytes = 0
        self.peak_bytes = 0
        self.saved_tensors = 0
        self.live_by_dtype: dict[str, int] = {}
        self.peak_by_dtype: dict[str, int] = {}

    def _excluded_keys(self) -> set[StorageKey]:
        source = self._exclude_source
        if source is None:
            return set()
        if isinstance(source, nn.Module):
            tensors: Iterable[torch.Tensor] = [*source.parameters(), *source.buffers()]
        else:
            tensors = list(iter_tensors(list(source)))
        return {key for tensor in tensors for key, _ in storage_footprint(tensor)}

    def _pack(self, tensor: torch.Tensor) -> _SavedTensor:
        keys: list[StorageKey] = []
        with self._lock:
            self.saved_tensors += 1
            for key, nbytes in storage_footprint(tensor):
                if key in self._excluded:
                    continue
                count = self._refs.get(key, 0)
                if count == 0:
                    dtype = str(tensor.dtype).removeprefix("torch.")
                    self._sizes[key] = nbytes
                    self._dtypes[key] = dtype
                    self.live_bytes += nbytes
                    self.live_by_dtype[dtype] = self.live_by_dtype.get(dtype, 0) + nbytes
                self._refs[key] = count + 1
                keys.append(key)
            if self.live_bytes > self.peak_bytes:
                self.peak_bytes = self.live_bytes
                self.peak_by_dtype = dict(self.live_by_dtype)
        return _SavedTensor(tensor.detach(), keys, self)

    @staticmethod
    def _unpack(saved: _SavedTensor) -> torch.Tensor:
        return saved.tensor

    def _release(self, keys: list[StorageKey]) -> None:
        with self._lock:
            for key in keys:
                count = self._refs[key] - 1
                if count == 0:
                    del self._refs[key]
                    nbytes = self._sizes.pop(key)
                    dtype = self._dtypes.pop(key)
                    self.live_bytes -= nbytes
                    self.live_by_dtype[dtype] -= nbytes
                else:
                    self._refs[key] = count

    def __enter__(self) -> ActivationMeter:
        if self._hooks is not None:
            raise RuntimeError("ActivationMeter is already active")
        self._excluded = self._excluded_keys()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.__exit__(*exc)

    @property
    def active(self) -> bool:
        return self._hooks is not None


def measure_activations(step_fn: Callable[[], Any], exclude: nn.Module | Iterable[torch.Tensor] | None = None) -> int:
    """Run ``step_fn`` (one real training step: forward, backward, optimizer step) and return
    the peak bytes saved for backward during it (see :class:`ActivationMeter`)."""
    with ActivationMeter(exclude) as meter:
        step_fn()
    return meter.peak_bytes


class GradientMeter:
    """Bytes of the gradients as they are accumulated during a step.

    Registers ``register_post_accumulate_grad_hook`` on every parameter that requires grad and
    keeps, per parameter, the storages of its latest ``.grad``; :attr:`grads_bytes` is their
    unique total. Unlike reading ``.grad`` after the step, it does not depend on whether the
    training loop zeroes gradients with ``set_to_none`` before or after the optimizer step.
    """

    def __init__(self, module: nn.Module) -> None:
        self._module = module
        self._latest: dict[int, list[tuple[StorageKey, int]]] = {}
        self._handles: list[Any] = []

    def _record(self, param: torch.Tensor) -> None:
        if param.grad is not None:
            self._latest[id(param)] = list(storage_footprint(param.grad))

    def __enter__(self) -> GradientMeter:
        self._handles = [p.register_post_accumulate_grad_hook(self._record) for p in self._module.parameters() if p.requires_grad]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def grads_bytes(self) -> int:
        unique = {key: nbytes for footprint in self._latest.values() for key, nbytes in footprint}
        return sum(unique.values())
