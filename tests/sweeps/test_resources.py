"""Threads per job and one CUDA device per job (device locks work without a GPU)."""

from __future__ import annotations

from foxhunt.sweeps.resources import DeviceSlot, threads_per_job


def test_threads_split_the_cores_between_concurrent_jobs():
    assert threads_per_job(2, cores=2) == 1
    assert threads_per_job(3, cores=16) == 5
    assert threads_per_job(4, cores=2) == 1  # never zero


def test_each_job_holds_its_own_device_until_it_releases_it(tmp_path):
    first, second = DeviceSlot(tmp_path, devices=2, preferred=0), DeviceSlot(tmp_path, devices=2, preferred=0)
    assert first.acquire() == 0
    assert second.acquire() == 1  # cuda:0 is held: the next free one
    second.release()
    third = DeviceSlot(tmp_path, devices=2, preferred=1)
    assert third.acquire() == 1
    first.release()
    third.release()
    assert (tmp_path / ".devices" / "cuda0.lock").exists()
