"""Every CUDA and NVML path, on a real device (``pytest -m gpu``; ``scripts/gpu_check.sh`` runs
these with the memory and ensemble reports). Without CUDA each test skips, saying so."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

MIB = 1024 * 1024
SMALL_TFT = ["model.module.hidden_size=32", "model.module.lstm_layers=1"]
FAST = ["trainer=smoke", "data.source.days=3", "trainer.limit_train_batches=4", "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1", "evaluation.plot_equity=false", "trainer.accelerator=gpu"]  # fmt: skip


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def test_nvml_sees_an_allocation_and_the_allocator_peaks_agree():
    from foxhunt.memory.probes import DeviceProbes

    probes = DeviceProbes("cuda")
    assert probes.statuses["nvml"].ran, probes.statuses["nvml"].describe()
    start = probes.start()
    block = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
    sample = probes.sample()
    assert sample.cuda_allocated_peak_bytes - start.cuda_allocated_peak_bytes >= 256 * MIB
    assert sample.nvml_run_bytes >= 200 * MIB  # NVML: what nvidia-smi shows, the allocator's block included
    del block
    probes.close()


def test_the_run_footprint_counts_memory_the_allocator_had_cached_before_the_run():
    # an earlier allocation, freed: the caching allocator keeps its block, NVML still counts it
    # as used; a run that reuses it must still read its own footprint (it read 0 before the fix)
    from foxhunt.memory.probes import DeviceProbes

    earlier = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
    del earlier
    probes = DeviceProbes("cuda")
    probes.start()
    block = torch.empty(128 * MIB, dtype=torch.uint8, device="cuda")
    assert probes.sample().nvml_run_bytes >= 100 * MIB
    del block
    probes.close()


def test_the_memory_callback_logs_device_figures_on_cuda(compose_cfg, tmp_path):
    from foxhunt.training.cell import train

    metrics = train(compose_cfg(["model=tft", *FAST, *SMALL_TFT]))
    assert metrics["memory/device_peak_mb"] > 0
    report = (tmp_path / "outputs" / "run" / "memory_report.md").read_text()
    assert "NVML" in report and "torch.cuda.max_memory_allocated" in report


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_bf16_and_int8_train_on_cuda(compose_cfg, precision):
    from foxhunt.training.cell import train

    extra = ["precision.min_quantized_numel=256"] if precision == "int8" else []
    metrics = train(compose_cfg(["model=tft", *FAST, *SMALL_TFT, f"precision={precision}", *extra]))
    assert "test/pnl" in metrics


def test_bf16_is_native_on_this_card_from_ampere():
    from foxhunt.precision.bf16 import bf16_support

    support = bf16_support("cuda")
    assert support.usable and support.native == (torch.cuda.get_device_capability() >= (8, 0))


def test_allocation_peak_counts_cuda_temporaries():
    from foxhunt.memory.allocations import AllocationPeak

    x = torch.randn(1024, 1024, device="cuda")
    with AllocationPeak() as meter:
        y = (x @ x).relu().sum()
    assert meter.peak_bytes >= 2 * 1024 * 1024 * 4  # the product and its relu held at once
    assert y.device.type == "cuda"


def test_an_ensemble_streams_on_cuda_as_on_cpu(compose_cfg):
    """The TFT and Mamba-2 members on CUDA decide as their batch path (parity on the device)."""
    import sys
    from pathlib import Path

    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ensemble"))
    from test_parity import _parts, member_of, replay_split

    for family in ("mamba2", "tft"):
        cfg, parts = _parts(compose_cfg, family)
        parts.model.to("cuda")
        replayed = replay_split(cfg, parts, member_of(family, parts.model, parts.dataset, "torch"), "val")
        np.testing.assert_array_equal(replayed.positions[family], parts.model.trading_positions(parts.datamodule, "val"))


def test_parallel_jobs_hold_one_device_each(tmp_path):
    from foxhunt.sweeps.resources import DeviceSlot

    count = torch.cuda.device_count()
    slots = [DeviceSlot(tmp_path, devices=count, preferred=0) for _ in range(count)]
    held = {slot.acquire() for slot in slots}
    assert len(held) == count
