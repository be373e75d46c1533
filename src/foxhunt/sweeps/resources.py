"""CPU cores, torch threads and CUDA devices of the jobs of a sweep.

Jobs must never oversubscribe the machine: ``n_jobs`` jobs at once each get
``cores // n_jobs`` torch threads (at least one), and on several GPUs each job holds one
device of its own for its whole life. Cores are the ones this process may run on
(``os.sched_getaffinity``: a SLURM allocation or a ``taskset`` counts, not the whole node).

A device is held through an exclusive ``fcntl`` lock on ``<sweep dir>/.devices/cuda<i>.lock``:
the lock goes away with the process, so a crashed job never leaves a device taken, and jobs
of any launcher (joblib workers, submitit processes) agree without a coordinator.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import TextIO

import torch

log = logging.getLogger(__name__)

AUTO = "auto"
DEVICE_LOCK_DIR = ".devices"


def available_cores() -> int:
    """CPU cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def configured_threads(cfg) -> int:
    """``strategy.torch_threads``: a number, or ``auto`` = every core this process may use."""
    value = cfg.strategy.get("torch_threads", AUTO)
    return available_cores() if str(value) == AUTO else int(value)


def threads_per_job(n_jobs: int, cores: int | None = None) -> int:
    """Torch threads of each of ``n_jobs`` concurrent jobs so that together they use the cores."""
    cores = available_cores() if cores is None else cores
    return max(1, cores // max(1, n_jobs))


def cuda_devices(accelerator: str) -> int:
    """CUDA devices a job with ``trainer.accelerator=accelerator`` trains on (0: CPU)."""
    if str(accelerator) not in ("auto", "gpu", "cuda"):
        return 0

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class DeviceSlot:
    """One CUDA device held by this job until :meth:`release` (or the process ends)."""

    def __init__(self, sweep_dir: Path, devices: int, preferred: int = 0) -> None:
        self.folder = Path(sweep_dir) / DEVICE_LOCK_DIR
        self.devices = devices
        self.preferred = preferred % devices
        self.index: int | None = None
        self._handle: TextIO | None = None

    def acquire(self) -> int:
        """Take a free device, trying ``preferred`` first; wait on it when all are taken."""
        self.folder.mkdir(parents=True, exist_ok=True)
        order = [(self.preferred + i) % self.devices for i in range(self.devices)]
        for index in order:
            handle = open(self.folder / f"cuda{index}.lock", "w")  # noqa: SIM115 - held open
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            self._handle, self.index = handle, index
            return index
        handle = open(self.folder / f"cuda{self.preferred}.lock", "w")  # noqa: SIM115
        log.info("all %d devices taken: waiting for cuda:%d", self.devices, self.preferred)
        fcntl.flock(handle, fcntl.LOCK_EX)
        self._handle, self.index = handle, self.preferred
        return self.preferred

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file drops the lock
            self._handle = None
