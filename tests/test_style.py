"""The tree is lint-clean, formatted and type-checked: ruff (configured in pyproject.toml,
[tool.ruff]) finds nothing in src/, tests/ and scripts/, and mypy ([tool.mypy]) nothing in
src/foxhunt. A failure prints the tool's own findings; fix them with ``ruff check --fix`` and
``ruff format``, or as mypy says (``.venv/bin/mypy`` runs the same check)."""

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


def test_mypy_finds_nothing():
    """mypy with pyproject's [tool.mypy] (its files, overrides and plugin), its cache under
    .mypy_cache (gitignored): about 40 s cold on two cores, a few seconds once the cache is warm."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
