"""Helpers of the sweep tests: run ``foxhunt-train -m`` rooted in a tmp folder, in a subprocess or
in the test's process (where no process boundary is checked: a process start is seconds of
imports); a composed config with another command line."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import read_write

from configs import synthetic_source
from foxhunt.runs.cell import CELL_RESULT_FILE, CellResult
from train_entry import train_here

# Small and fast: one epoch of 8 steps, one torch thread (two jobs share two cores), on a week
# of synthetic bars (WEEK; not for the CSV source).
SMOKE = ["trainer=smoke", "strategy.torch_threads=1"]
WEEK = ["data.source.days=7"]


def foxhunt_train(args: list[str], root: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "FOXHUNT_ROOT": str(root), "HYDRA_FULL_ERROR": "1"}
    command = [str(Path(sys.executable).parent / "foxhunt-train"), "-m", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=root, timeout=timeout)


def foxhunt_train_here(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture, args: list[str], root: Path
) -> subprocess.CompletedProcess:
    """:func:`foxhunt_train` in the test's process (tests/train_entry.py): the same command line,
    its exit status and what it printed, as a finished process; the torch threads it sets
    (``strategy.torch_threads``) put back as they were."""
    return train_here(monkeypatch, capfd, root, ["-m", *args])


def store(root: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")


def runs(root: Path) -> tuple[list, list]:
    """(parent runs, cell runs) of the ``foxhunt`` experiment, most recent first."""
    client = store(root)
    experiment = client.get_experiment_by_name("foxhunt")
    found = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"])
    parents = [r for r in found if r.data.tags.get("foxhunt.run_kind") == "sweep"]
    cells = [r for r in found if "config_hash" in r.data.tags]
    return parents, cells


def sweep_dirs(root: Path) -> list[Path]:
    return sorted((root / "outputs" / "sweeps").iterdir())


def six_e_csv(path: Path) -> Path:
    """A week of synthetic 6E bars as a CSV file: off the ES tick grid, so an ES cell on it fails."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    asset = instantiate(OmegaConf.load(Path(__file__).parents[2] / "conf" / "asset" / "6e.yaml"))
    bars = synthetic_source(days=7, seed=3).load(asset)
    bars.index = bars.index.tz_convert(None)
    bars.rename_axis("timestamp_utc").to_csv(path)
    return path


def with_task_overrides(cfg, overrides: list[str]):
    """A copy of a composed config whose command line (``hydra.overrides.task``) is ``overrides``."""
    variant = copy.deepcopy(cfg)
    with read_write(variant.hydra):
        variant.hydra.overrides.task = overrides
    return variant


def written(cfg) -> CellResult:
    """The cell result a sweep job wrote in its folder (``paths.output_dir``)."""
    return CellResult.read(Path(cfg.paths.output_dir) / CELL_RESULT_FILE)
