"""Device probes: what runs where, NVML absent or failing, the baseline arithmetic."""

from __future__ import annotations

import sys
import types

import psutil
import pytest
import torch

from foxhunt.memory.probes import DeviceProbes, DeviceSample, ProbeStatus

MIB = 1024 * 1024


class NVMLError(Exception):
    pass


def fake_nvml(used_mib: dict[int, list[int]], init_error: Exception | None = None) -> types.ModuleType:
    """A stand-in for ``pynvml`` on a machine without CUDA: ``used_mib[i]`` are device ``i``'s
    successive used-memory readings. As NVML, it answers only between init and shutdown, and
    has no device it was not given."""
    module = types.ModuleType("pynvml")
    readings = {index: iter(values) for index, values in used_mib.items()}
    initialized = []

    def nvmlInit():
        if init_error is not None:
            raise init_error
        initialized.append(True)

    def nvmlDeviceGetHandleByUUID(uuid):
        raise NVMLError("no such uuid")

    def nvmlDeviceGetHandleByIndex(index):
        if not initialized:
            raise NVMLError("Uninitialized")
        if index not in readings:
            raise NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetMemoryInfo(handle):
        if not initialized:
            raise NVMLError("Uninitialized")
        return types.SimpleNamespace(used=next(readings[handle]) * MIB, total=4096 * MIB)

    def nvmlShutdown():
        initialized.clear()

    module.nvmlInit = nvmlInit
    module.nvmlDeviceGetHandleByUUID = nvmlDeviceGetHandleByUUID
    module.nvmlDeviceGetHandleByIndex = nvmlDeviceGetHandleByIndex
    module.nvmlDeviceGetMemoryInfo = nvmlDeviceGetMemoryInfo
    module.nvmlShutdown = nvmlShutdown
    return module


def test_cpu_device_runs_rss_only_and_says_why_not_the_others():
    probes = DeviceProbes("cpu")
    assert {name: s.ran for name, s in probes.statuses.items()} == {"cuda": False, "nvml": False, "rss": True}
    assert probes.statuses["cuda"].detail == "device is cpu"
    before = psutil.Process().memory_info().rss
    start = probes.start()
    sample = probes.sample()
    after = psutil.Process().memory_info().rss
    assert start.rss_baseline_bytes == start.rss_bytes
    assert sample.rss_baseline_bytes == start.rss_baseline_bytes
    assert abs(sample.rss_bytes - (before + after) / 2) < 64 * MIB
    assert sample.cuda_allocated_peak_bytes is None and sample.nvml_used_bytes is None


def test_nvml_absent_is_reported_and_nothing_else_breaks(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    probes = DeviceProbes("cuda:0")
    status = probes.statuses["nvml"]
    assert not status.ran
    assert "import pynvml failed" in status.detail
    assert probes.statuses["rss"].ran
    sample = probes.start()
    assert sample.nvml_used_bytes is None and sample.nvml_run_bytes is None
    assert sample.rss_bytes > 0
    probes.close()


def test_nvml_init_failure_is_tolerated(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml({0: []}, init_error=RuntimeError("driver not loaded")))
    probes = DeviceProbes("cuda:0")
    assert not probes.statuses["nvml"].ran
    assert probes.statuses["nvml"].detail == "nvmlInit failed: driver not loaded"
    assert probes.sample().nvml_used_bytes is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fake NVML stands in for a machine without CUDA")
def test_nvml_used_minus_baseline_is_the_run_footprint_of_the_training_device(monkeypatch):
    # device 1's readings: the handle check at set-up, the baseline, two samples; device 0 is
    # another card, busy with someone else's 5 GB: never what cuda:1's run measures
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml({0: [5000] * 8, 1: [900, 1000, 1300, 1250]}))
    probes = DeviceProbes("cuda:1")
    assert probes.statuses["nvml"] == ProbeStatus("nvml", True, "used memory of cuda:1")
    start = probes.start()
    assert start.nvml_baseline_bytes == 1000 * MIB and start.nvml_run_bytes == 300 * MIB
    second = probes.sample()
    assert (second.nvml_used_bytes, second.nvml_run_bytes) == (1250 * MIB, 250 * MIB)
    assert start.merge_peak(second).nvml_run_bytes == 300 * MIB
    probes.close()  # NVML released: it would refuse a read now, and none is taken
    after = probes.sample()
    assert (after.nvml_used_bytes, after.nvml_run_bytes) == (None, None) and after.rss_bytes > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fake NVML stands in for a machine without CUDA")
def test_a_device_nvml_does_not_know_is_reported_and_not_measured(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml({0: [100] * 4}))
    probes = DeviceProbes("cuda:3")
    assert probes.statuses["nvml"] == ProbeStatus("nvml", False, "NVML has no handle for cuda:3: Invalid Argument")
    assert probes.start().nvml_used_bytes is None and probes.sample().nvml_run_bytes is None


def test_merge_peak_is_the_fieldwise_maximum():
    a = DeviceSample(cuda_allocated_peak_bytes=5, nvml_used_bytes=10, nvml_baseline_bytes=2, rss_bytes=7, rss_baseline_bytes=1)
    b = DeviceSample(cuda_allocated_peak_bytes=3, nvml_used_bytes=12, nvml_baseline_bytes=9, rss_bytes=None)
    merged = a.merge_peak(b)
    assert merged == DeviceSample(
        cuda_allocated_peak_bytes=5,
        cuda_reserved_peak_bytes=None,
        nvml_used_bytes=12,
        nvml_baseline_bytes=2,
        rss_bytes=7,
        rss_baseline_bytes=1,
    )
    assert merged.nvml_run_bytes == 10


@pytest.mark.gpu
def test_cuda_peaks_are_reset_per_run():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    probes = DeviceProbes("cuda")
    assert probes.statuses["cuda"].ran
    block = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
    del block
    start = probes.start()  # resets the peaks: the 64 MiB block is gone
    assert start.cuda_allocated_peak_bytes < 64 * MIB
    block = torch.empty(32 * MIB, dtype=torch.uint8, device="cuda")
    sample = probes.sample()
    assert sample.cuda_allocated_peak_bytes >= 32 * MIB
    assert sample.cuda_reserved_peak_bytes >= sample.cuda_allocated_peak_bytes
    del block
    probes.close()
