"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest
from configs import compose_train_config  # tests/ is on sys.path: a helper module
from jobs_store import Store, build_store

REPO_ROOT = Path(__file__).resolve().parents[1]
REAL_DATA_DIR = REPO_ROOT.parent / "shared" / "data" / "real"


@pytest.fixture(scope="session")
def real_data_dir() -> Path:
    """The real CME test files (../shared/data/real); tests using it skip when it is absent."""
    if not REAL_DATA_DIR.is_dir():
        pytest.skip(f"real data folder {REAL_DATA_DIR} is absent")
    return REAL_DATA_DIR


@pytest.fixture
def compose_cfg(tmp_path: Path):
    """``compose_cfg(overrides)`` -> composed training config rooted in a fresh tmp folder."""

    def _compose(overrides: list[str] | None = None):
        return compose_train_config(list(overrides or []), tmp_path)

    return _compose


@pytest.fixture(scope="session")
def jobs_store(tmp_path_factory) -> Store:
    """A hand-populated MLflow store of jobs in every state (jobs_store.py), built once: read by
    the job views (tests/jobs) and by the store's readers (tests/runs)."""
    return build_store(tmp_path_factory.mktemp("jobs_store"))
