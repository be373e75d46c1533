"""Peak bytes of the tensors a piece of code allocates, as the allocator sees them, on any device.

:class:`AllocationPeak` is a ``TorchDispatchMode``: every aten op's outputs pass through it, and
each storage not seen before is counted when it appears and uncounted when it is freed (a weak
reference on the storage; an output that shares an input's storage is a view, not an
allocation), so :attr:`AllocationPeak.peak_bytes` is the most the code held at once,
temporaries included (what a sum of live tensors after the fact misses). It counts what the
code allocates, not what existed before it (the caller adds that), on CPU as on CUDA, for plain
tensors and for tensor subclasses (through their inner tensors).

Written here rather than taking torch's ``MemTracker``: MemTracker registers hooks on every
module's outputs and refuses tensors that do not require gradients, so it cannot follow an int8
inference copy (torchao's weight subclass) under ``inference_mode``; this counts storages only.
"""

from __future__ import annotations

import threading
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from foxhunt.memory.accounting import storage_footprint


class AllocationPeak(TorchDispatchMode):
    """``with AllocationPeak() as meter: ...`` then ``meter.peak_bytes`` (see the module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._live: dict[tuple, int] = {}
        self._lock = threading.Lock()

    def _free(self, key: tuple) -> None:
        with self._lock:
            self.live_bytes -= self._live.pop(key, 0)

    def _count(self, tensor: torch.Tensor, inputs: set) -> None:
        for key, nbytes in storage_footprint(tensor):
            if key in self._live or key in inputs:  # counted already, or a view of an input
                continue
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, TypeError):
                storage = None
            with self._lock:
                self._live[key] = nbytes
                self.live_bytes += nbytes
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            if storage is not None:
                weakref.finalize(storage, self._free, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {key for value in tree_flatten((args, kwargs))[0] if isinstance(value, torch.Tensor)
                  for key, _ in storage_footprint(value)}  # fmt: skip
        out = func(*args, **kwargs)
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self._count(value, inputs)
        return out
