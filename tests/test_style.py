"""The tree is lint-clean and formatted: ruff (configured in pyproject.toml, [tool.ruff]) finds
nothing in src/, tests/ and scripts/. A failure prints ruff's own findings; fix them with
``ruff check --fix`` and ``ruff format``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ["src", "tests", "scripts"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args, *TREES], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_is_installed_with_the_test_extras():
    version = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True, text=True)
    assert version.returncode == 0, "ruff is missing: pip install -e '.[test]'"


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_finds_nothing(command):
    done = _ruff(*command)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
