"""Device memory probes: what the device and the process actually hold.

Three probes, each optional, each reporting whether it ran and, if not, why:

- ``cuda``: the caching allocator of the training device, ``torch.cuda.max_memory_allocated``
  (peak bytes of live tensors) and ``torch.cuda.max_memory_reserved`` (peak bytes the
  allocator held from the driver), with the peaks reset by :meth:`DeviceProbes.start`, so they
  cover one run. Runs when the device is a CUDA device and CUDA is available.
- ``nvml``: NVML's used memory of the physical device (what ``nvidia-smi`` shows: every
  process, CUDA contexts included), through ``pynvml`` (the ``nvidia-ml-py`` package), with a
  baseline taken by :meth:`DeviceProbes.start` before the model is on the device; ``used -
  baseline`` is this run's footprint on the card. Runs when the device is a CUDA device and
  ``pynvml`` imports and initializes; a missing package or driver is reported, never raised.
- ``rss``: the resident set size of this process (``psutil``), with its value at
  :meth:`DeviceProbes.start` kept as baseline. Runs wherever psutil imports.

Sampling is cheap (tens of microseconds): a few driver or ``/proc`` reads, no synchronization.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger(__name__)

PROBE_METHODS = {
    "cuda": "torch.cuda.max_memory_allocated / max_memory_reserved, peaks reset at run start",
    "nvml": "NVML used memory of the device (nvidia-smi's figure, CUDA context included) minus its value before the model was on the device",
    "rss": "process resident set size (psutil)",
}


@dataclass(frozen=True)
class ProbeStatus:
    """Whether a probe ran, and what it measured or why it did not run."""

    name: str
    ran: bool
    detail: str

    def describe(self) -> str:
        return f"{self.name}: {'ran' if self.ran else 'not run'} ({self.detail})"


@dataclass(frozen=True)
class DeviceSample:
    """One reading of the probes; a field is ``None`` when its probe did not run."""

    cuda_allocated_peak_bytes: int | None = None
    cuda_reserved_peak_bytes: int | None = None
    nvml_used_bytes: int | None = None
    nvml_baseline_bytes: int | None = None
    rss_bytes: int | None = None
    rss_baseline_bytes: int | None = None

    @property
    def nvml_run_bytes(self) -> int | None:
        """NVML used memory minus the baseline: this run's footprint on the device."""
        if self.nvml_used_bytes is None or self.nvml_baseline_bytes is None:
            return None
        return self.nvml_used_bytes - self.nvml_baseline_bytes

    def merge_peak(self, other: DeviceSample) -> DeviceSample:
        """Field-wise maximum of two samples (the running peak); baselines kept from ``self``
        unless it has none."""

        def peak(a: int | None, b: int | None) -> int | None:
            if a is None:
                return b
            if b is None:
                return a
            return max(a, b)

        return DeviceSample(
            cuda_allocated_peak_bytes=peak(self.cuda_allocated_peak_bytes, other.cuda_allocated_peak_bytes),
            cuda_reserved_peak_bytes=peak(self.cuda_reserved_peak_bytes, other.cuda_reserved_peak_bytes),
            nvml_used_bytes=peak(self.nvml_used_bytes, other.nvml_used_bytes),
            nvml_baseline_bytes=(self.nvml_baseline_bytes if self.nvml_baseline_bytes is not None else other.nvml_baseline_bytes),
            rss_bytes=peak(self.rss_bytes, other.rss_bytes),
            rss_baseline_bytes=(self.rss_baseline_bytes if self.rss_baseline_bytes is not None else other.rss_baseline_bytes),
        )


@dataclass
class DeviceProbes:
    """The probes of one device for one run: :meth:`start` once, then :meth:`sample`.

    ``device``: the training device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device``).
    :attr:`statuses` says, per probe, whether it ran.
    """

    device: torch.device | str = "cpu"
    statuses: dict[str, ProbeStatus] = field(default_factory=dict, init=False)
    _nvml: Any = field(default=None, init=False, repr=False)
    _nvml_handle: Any = field(default=None, init=False, repr=False)
    _process: Any = field(default=None, init=False, repr=False)
    _nvml_baseline: int | None = field(default=None, init=False, repr=False)
    _rss_baseline: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.device = torch.device(self.device)
        if self.device.type == "cuda" and self.device.index is None and torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.statuses = {
            "cuda": self._init_cuda(),
            "nvml": self._init_nvml(),
            "rss": self._init_rss(),
        }

    # -- set-up: each returns the probe's status -----------------------------------------
    def _init_cuda(self) -> ProbeStatus:
        device = torch.device(self.device)  # one since __post_init__
        if device.type != "cuda":
            return ProbeStatus("cuda", False, f"device is {device.type}")
        if not torch.cuda.is_available():
            return ProbeStatus("cuda", False, "CUDA is not available in this torch build or machine")
        return ProbeStatus("cuda", True, f"allocator peaks of {self.device}")

    def _init_nvml(self) -> ProbeStatus:
        device = torch.device(self.device)
        if device.type != "cuda":
            return ProbeStatus("nvml", False, f"device is {device.type}")
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError as exc:
            return ProbeStatus("nvml", False, f"import pynvml failed (nvidia-ml-py): {exc}")
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            return ProbeStatus("nvml", False, f"nvmlInit failed: {exc}")
        try:
            handle = self._nvml_device_handle(nvml)
            nvml.nvmlDeviceGetMemoryInfo(handle)
        except Exception as exc:
            _shutdown(nvml)
            return ProbeStatus("nvml", False, f"NVML has no handle for {self.device}: {exc}")
        self._nvml, self._nvml_handle = nvml, handle
        return ProbeStatus("nvml", True, f"used memory of {self.device}")

    def _nvml_device_handle(self, nvml: Any) -> Any:
        """NVML's handle of the torch device: by UUID (respects CUDA_VISIBLE_DEVICES), else by
        the index."""
        index = torch.device(self.device).index or 0
        if torch.cuda.is_available():
            uuid = str(torch.cuda.get_device_properties(index).uuid)
            for candidate in (uuid, f"GPU-{uuid}"):
                try:
                    return nvml.nvmlDeviceGetHandleByUUID(candidate)
                except Exception:
                    continue
        return nvml.nvmlDeviceGetHandleByIndex(index)

    def _init_rss(self) -> ProbeStatus:
        try:
            psutil = importlib.import_module("psutil")
            self._process = psutil.Process()
            self._process.memory_info()
        except Exception as exc:
            return ProbeStatus("rss", False, f"psutil unavailable: {exc}")
        return ProbeStatus("rss", True, "resident set size of this process")

    # -- use -------------------------------------------------------------------------------
    def ran(self, name: str) -> bool:
        return self.statuses[name].ran

    def start(self) -> DeviceSample:
        """Reset the CUDA peaks and take the NVML and RSS baselines; return that reading. Blocks the
        caching allocator holds free from earlier work in this process (a test, an earlier trial) go
        back to the driver first: else the run reuses them, NVML's used memory does not grow, and the
        run's footprint would read 0."""
        if self.ran("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        if self._nvml is not None:
            self._nvml_baseline = self._nvml_used()
        if self.ran("rss"):
            self._rss_baseline = self._rss()
        return self.sample()

    def sample(self) -> DeviceSample:
        """Read every probe that runs (baselines as taken by :meth:`start`)."""
        cuda = self.ran("cuda")
        return DeviceSample(
            cuda_allocated_peak_bytes=torch.cuda.max_memory_allocated(self.device) if cuda else None,
            cuda_reserved_peak_bytes=torch.cuda.max_memory_reserved(self.device) if cuda else None,
            nvml_used_bytes=self._nvml_used() if self._nvml is not None else None,
            nvml_baseline_bytes=self._nvml_baseline,
            rss_bytes=self._rss() if self.ran("rss") else None,
            rss_baseline_bytes=self._rss_baseline,
        )

    def close(self) -> None:
        """Release NVML (the other probes hold nothing)."""
        if self._nvml is not None:
            _shutdown(self._nvml)
            self._nvml = self._nvml_handle = None

    def _nvml_used(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._nvml_handle).used)

    def _rss(self) -> int:
        return int(self._process.memory_info().rss)


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception as exc:
        log.debug("nvmlShutdown failed: %s", exc)
