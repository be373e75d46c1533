"""Fixtures of the job tests: a hand-populated MLflow store (jobs_store.py)."""

from __future__ import annotations

import pytest
from jobs_store import Store, build_store


@pytest.fixture(scope="session")
def jobs_store(tmp_path_factory) -> Store:
    return build_store(tmp_path_factory.mktemp("jobs_store"))
