"""Shared pytest fixtures."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from configs import compose_train_config  # tests/ is on sys.path: a helper module
from jobs_store import Store, build_store

# Tables (rich) are as wide as COLUMNS says when the output is not a terminal: one width for every
# test, whatever the runner (a pytest-xdist worker inherits no terminal and would cut ids at 80).
os.environ["COLUMNS"] = "200"

REPO_ROOT = Path(__file__).resolve().parents[1]
REAL_DATA_DIR = REPO_ROOT.parent / "shared" / "data" / "real"


@pytest.fixture(autouse=True)
def _logging_as_found():
    """Each test ends with the root logger's handlers and level as it found them. A Hydra app run
    in-process (foxhunt-train's main, a sweep) configures logging: a handler on the stream that
    test captured, closed when it ends; a later command logging through it printed "--- Logging
    error ---" into that test's output (seen under pytest-xdist, whose workers run files in
    another order)."""
    root = logging.getLogger()

    def own() -> list[logging.Handler]:  # pytest's capture handlers come and go with each phase: not ours to touch
        return [h for h in root.handlers if not type(h).__module__.startswith("_pytest")]

    handlers, level = own(), root.level
    yield
    for handler in [h for h in own() if h not in handlers]:
        root.removeHandler(handler)
        handler.close()
    for handler in [h for h in handlers if h not in root.handlers]:
        root.addHandler(handler)
    root.setLevel(level)


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
