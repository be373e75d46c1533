"""Fixtures of the sweep tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def check():
    """``check(result)``: assert the return code, showing the output when it differs."""

    def _check(result: subprocess.CompletedProcess, code: int = 0) -> None:
        assert result.returncode == code, f"rc={result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"

    return _check


@pytest.fixture
def sweep_config(tmp_path):
    """A composed config as ``foxhunt-train -m preset=grid model=dqn`` sees it, Hydra kept
    initialized (the sweep expansion composes each cell)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    conf_dir = Path(__file__).resolve().parents[2] / "conf"
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = compose("train", overrides=[f"paths.root_dir={tmp_path}", "preset=grid", "model=dqn"], return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        yield cfg
