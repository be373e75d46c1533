"""kill -9 at any point of a roll leaves the registry as it was or fully promoted: the process
is killed (SIGKILL, FOXHUNT_ROLL_KILL_AT) after its challenger trained, after it registered the
new version, after the commit record, between the alias moves, after them; what every ensemble
loads (resolved_version, load_ensemble) is then the old champion or the new one, never half, and
the next roll completes a committed promotion first and says so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from roll_helpers import CSV, ROLL, cli, utc_dates, write_days
from test_roll_step import NAME, aliases, roll, store

from foxhunt.ensemble.registry import KILL_ENV, pending_moves, resolved_version

BEFORE, AFTER = {"champion": "1", "previous": None}, {"champion": "2", "previous": "1"}


def _killed_roll(root, point: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "foxhunt.cli", "ensemble", "roll", "--force", "asset=es", "ensemble.models=[dqn]", *CSV,
            f"data.source.path={root / 'data' / 'es'}", *ROLL, "ensemble.runtime=numpy"]  # fmt: skip
    env = {**os.environ, KILL_ENV: point, "FOXHUNT_ROOT": str(root)}
    return subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=600)


def _check(root, point: str) -> None:
    done = _killed_roll(root, point)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    s = store(root)
    loaded = resolved_version(s, NAME, "champion", "roll").version  # what serve, paper and replay load
    committed = point not in ("trained", "registered")
    assert loaded == ("2" if committed else "1")
    raw = aliases(root)
    if point in ("trained", "registered"):
        assert raw == BEFORE and not pending_moves(s, "roll")
        versions = {v for v in ("1", "2") if s.get_version(NAME, v) is not None}
        assert versions == ({"1"} if point == "trained" else {"1", "2"})  # a version without an alias loads nowhere
    elif point == "applied":
        assert raw == AFTER and not pending_moves(s, "roll")
    else:  # committed, not every alias moved: the record is the promotion
        assert len(pending_moves(s, "roll")) == 1
        assert raw == {"committed": BEFORE, "moved-1": {"champion": "1", "previous": "1"}, "moved-2": AFTER}[point]
    again = roll(root)  # applies a committed promotion first; then the new champion has seen the block
    assert again.exit_code == 0, again.output
    if committed:
        assert ("completed the promotion of run" in again.output) == (point != "applied")
        assert aliases(root) == AFTER and "nothing to do" in again.output
    assert not pending_moves(s, "roll")


@pytest.mark.parametrize("point", ["registered", "moved-1"])
def test_a_roll_killed_leaves_the_registry_as_it_was_or_promoted(roll_store, roll_bars, point):
    write_days(roll_bars, roll_store / "data" / "es", utc_dates(roll_bars)[6:7])
    _check(roll_store, point)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["trained", "committed", "moved-2", "applied"])
def test_a_roll_killed_anywhere_else(roll_store, roll_bars, point):
    write_days(roll_bars, roll_store / "data" / "es", utc_dates(roll_bars)[6:7])
    _check(roll_store, point)


def test_a_committed_promotion_is_what_an_ensemble_loads(roll_store, roll_bars, tmp_path):
    """In process: the commit record written, no alias moved yet (a process killed right after
    its commit): load_ensemble loads the new version; register, roll and rollback apply it first."""
    from foxhunt.ensemble.loading import load_ensemble
    from foxhunt.ensemble.registry import COMMITTED, PROMOTION_STATE_TAG, PROMOTION_TAG, apply_moves, promotion_moves
    from foxhunt.runs.tracked_run import TrackedRun
    from foxhunt.training.parts import compose_config

    write_days(roll_bars, roll_store / "data" / "es", utc_dates(roll_bars)[6:7])
    done = _killed_roll(roll_store, "registered")  # version 2 registered, no alias
    assert done.returncode == -signal.SIGKILL
    s = store(roll_store)
    moves = promotion_moves(s, NAME, "champion", "previous", "2")
    with TrackedRun(s.tracking_uri, "roll", None, "roll-es", {}) as run:
        import json

        s.tag(run.run_id, {PROMOTION_TAG: json.dumps([m.__dict__ for m in moves]), PROMOTION_STATE_TAG: COMMITTED})
    cfg = compose_config(["asset=es", "ensemble.models=[dqn]", *CSV, f"data.source.path={roll_store / 'data' / 'es'}",
                          "ensemble.runtime=numpy"], root_dir=roll_store, config_name="ensemble")  # fmt: skip
    assert aliases(roll_store) == BEFORE
    assert [f.version for f in load_ensemble(cfg, tmp_path)] == ["2"]
    back = cli(roll_store, "ensemble", "rollback", "asset=es", "ensemble.models=[dqn]")  # applies it, then rolls back
    assert back.exit_code == 0, back.output
    assert "completed the promotion of run" in back.output and aliases(roll_store) == {"champion": "1", "previous": "2"}
    assert not pending_moves(s, "roll")
    apply_moves(s, run.run_id, moves)
    apply_moves(s, run.run_id, moves)  # applying twice is applying once
    assert aliases(roll_store) == AFTER


def _trials(root) -> list[float]:
    """roll/trials of each dqn child of roll.experiment, oldest first."""
    children = store(root).search("roll", tags={"roll.role": "family", "model": "dqn"})
    return [c.metric("roll/trials") for c in sorted(children, key=lambda c: c.start_ms) if c.metric("roll/trials")]


@pytest.mark.parametrize("point", ["committed", pytest.param("registered", marks=pytest.mark.slow)])
def test_a_killed_roll_counts_its_trial_once_whatever_the_point(roll_store, roll_bars, point):
    """The deflated Sharpe ratio's trials do not depend on where a roll was killed: a roll killed
    after its commit point had logged no scores, so the next block's step counted one trial fewer
    (1 where an uninterrupted pair of steps counts 2); one killed before it and run again must not
    count its block twice either."""
    dates = utc_dates(roll_bars)
    write_days(roll_bars, roll_store / "data" / "es", dates[6:7])
    assert _killed_roll(roll_store, point).returncode == -signal.SIGKILL
    if point == "registered":  # nothing committed: the same block rolled again
        again = roll(roll_store)
        assert again.exit_code == 0, again.output
    write_days(roll_bars, roll_store / "data" / "es", dates[7:8])
    last = roll(roll_store)  # completes a committed promotion first, then rolls the new block
    assert last.exit_code == 0, last.output
    assert _trials(roll_store)[-1] == 2.0  # the first block's challenger and this one
