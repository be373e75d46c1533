"""kill -9 of a real paper process at chosen moments: the restart resumes with no fill lost or doubled."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_paper import _ledger

from conftest import ENSEMBLE

PRIMING = 3545  # bars before the test split (data.source.days=4): one transaction
ARGS = [*ENSEMBLE, "logger.enabled=false", "paper.risk.max_daily_loss_usd=null", "paper.risk.max_drawdown_usd=null"]


def _paper(root, ledger, kill: str | None):
    env = {**os.environ, "FOXHUNT_ROOT": str(root)}
    env.pop("FOXHUNT_PAPER_KILL_AT", None)
    if kill:
        env["FOXHUNT_PAPER_KILL_AT"] = kill
    return subprocess.run([sys.executable, "-m", "foxhunt.cli", "ensemble", "paper", *ARGS, f"paper.ledger={ledger}"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip


@pytest.mark.slow
def test_kill_9_at_several_points_loses_and_doubles_no_fill(paper_store, tmp_path):
    reference = tmp_path / "reference.sqlite"
    assert _paper(paper_store, reference, None).returncode == 0
    crashed = tmp_path / "crashed.sqlite"
    for point in (f"{PRIMING + 7}:before_commit", f"{PRIMING + 60}:after_commit", f"{PRIMING + 300}:before_commit"):
        done = _paper(paper_store, crashed, point)
        assert done.returncode == -9, done.stderr[-2000:]
    final = _paper(paper_store, crashed, None)
    assert final.returncode == 0, final.stderr[-2000:]
    assert "resumed" in final.stdout
    want, got = _ledger(reference), _ledger(crashed)
    assert got["fills"] == want["fills"] and len(want["fills"]) > 0
    assert got["account"] == want["account"]
    assert got["bars"] == want["bars"]
