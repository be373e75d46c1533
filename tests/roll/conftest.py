"""Fixtures of the roll tests: a small DQN champion of ES trained on a folder of daily CSV files
(the first six UTC dates of ten), registered; each test rolls on its own copy of that store."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from roll_helpers import synthetic_bars, train_and_register, utc_dates, write_days  # noqa: E402


@pytest.fixture(scope="session")
def roll_bars():
    return synthetic_bars(10, autocorrelation=0.3)


@pytest.fixture(scope="session")
def roll_base(tmp_path_factory, roll_bars):
    root = tmp_path_factory.mktemp("roll-base")
    folder = root / "data" / "es"
    write_days(roll_bars, folder, utc_dates(roll_bars)[:6])
    train_and_register(root, folder)
    return root


@pytest.fixture
def roll_store(roll_base, tmp_path):
    """A copy of the base store (the registry, the runs, the data folder) for one test; the
    artifacts the base registered stay where they are (the store names them by path)."""
    root = tmp_path / "root"
    shutil.copytree(roll_base, root, ignore=shutil.ignore_patterns("outputs", ".cache"))
    return root
