"""``foxhunt-train`` in the test's own process: its entry function with a command line, as a user
types it in a shell (a config composition and a run, no interpreter start of torch, Lightning and
MLflow, about 5 s of CPU each). The real console script is run by a few tests of its own
(tests/training/test_cell.py, tests/test_bad_inputs.py, tests/test_run_records.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch


def run_foxhunt_train(monkeypatch: pytest.MonkeyPatch, root: Path, args: list[str]) -> int | str | None:
    """``foxhunt-train *args`` run from ``root`` (the current folder and ``FOXHUNT_ROOT``) with no
    traceback asked for: its exit status, 0 when ``main`` returns. ``FOXHUNT_DEBUG`` and
    ``HYDRA_FULL_ERROR`` are 0 for the call and restored after the test (``main`` sets
    ``HYDRA_FULL_ERROR=1`` in the process, which would ask the next call for tracebacks). What
    it prints is the caller's to capture (capsys, capfd). The torch threads a run sets
    (``strategy.torch_threads``) are this process's: put back as they were."""
    from foxhunt import train as entry

    monkeypatch.setenv("FOXHUNT_ROOT", str(root))
    for name in ("FOXHUNT_DEBUG", "HYDRA_FULL_ERROR"):
        monkeypatch.setenv(name, "0")
    monkeypatch.chdir(root)
    monkeypatch.setattr(sys, "argv", ["foxhunt-train", *args])
    threads = torch.get_num_threads()
    try:
        entry.main()
    except SystemExit as stopped:
        return stopped.code
    finally:
        torch.set_num_threads(threads)
    return 0


def train_here(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture, root: Path, args: list[str]
) -> subprocess.CompletedProcess:
    """:func:`run_foxhunt_train` as a finished ``foxhunt-train`` process: its exit status
    (``sys.exit("message")``: 1, as a process) and what it printed (not what the test printed
    before)."""
    capfd.readouterr()
    code = run_foxhunt_train(monkeypatch, root, args)
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["foxhunt-train", *args], code if isinstance(code, int) else 1, out, err)
