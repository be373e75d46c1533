"""Fixtures of the sweep tests."""

from __future__ import annotations

import subprocess

import pytest


@pytest.fixture
def check():
    """``check(result)``: assert the return code, showing the output when it differs."""

    def _check(result: subprocess.CompletedProcess, code: int = 0) -> None:
        assert result.returncode == code, f"rc={result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"

    return _check
