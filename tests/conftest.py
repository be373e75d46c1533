"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
REAL_DATA_DIR = REPO_ROOT.parent / "shared" / "data" / "real"


@pytest.fixture(scope="session")
def real_data_dir() -> Path:
    """The real CME test files (../shared/data/real); tests using it skip when it is absent."""
    if not REAL_DATA_DIR.is_dir():
        pytest.skip(f"real data folder {REAL_DATA_DIR} is absent")
    return REAL_DATA_DIR


CONF_DIR = REPO_ROOT / "conf"


def compose_train_config(overrides: list[str], root_dir: Path):
    """Compose conf/train.yaml as foxhunt-train would, with every path under ``root_dir``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                f"paths.root_dir={root_dir}",
                f"paths.output_dir={root_dir / 'outputs' / 'run'}",
                *overrides,
            ],
            return_hydra_config=True,
        )
    HydraConfig.instance().set_config(cfg)
    return cfg


@pytest.fixture
def compose_cfg(tmp_path: Path):
    """``compose_cfg(overrides)`` -> composed training config rooted in a fresh tmp folder."""

    def _compose(overrides: list[str] | None = None):
        return compose_train_config(list(overrides or []), tmp_path)

    return _compose
