"""The rolling loop learns (slow: about four minutes on 2 cores): on synthetic ES bars whose
planted pattern changes sign at a known date, five roll steps promote a challenger after the
change and the rolled ensemble's PnL on the newest blocks after the change beats the frozen
ensemble's, the interval of the mean per-bar difference above 0 (:mod:`foxhunt.bench.roll`; the
benchmark's ``roll`` section, the table in docs/how-to/roll.md)."""

from __future__ import annotations

import pytest

from foxhunt.bench.context import BenchContext
from foxhunt.bench.roll import compare, demonstrate, rows
from foxhunt.bench.settings import load_settings


@pytest.mark.slow
def test_five_roll_steps_follow_a_pattern_that_changes_sign(tmp_path):
    settings = load_settings(overrides=[f"work_dir={tmp_path}"])
    result = demonstrate(BenchContext(settings=settings, root=tmp_path, log=print))
    assert len(result["steps"]) == 5 and not any(step.nothing_new for step in result["steps"])
    compared = compare(result)
    found, notes = rows(result, compared)
    print("\n".join(notes))
    missed = [f"{row.name}: {row.figure:.3f} (goal {row.goal_op} {row.goal}; {row.note})" for row in found if row.met is False]
    assert not missed, "\n".join(missed)
    assert compared["diff_ci"][0] > 0 and compared["rolled_pnl"] > compared["frozen_pnl"]
    promoted = [o for step in result["steps"] for o in step.outcomes if o.registered]
    assert promoted and all(step.block[0] >= result["change_ns"] for step in result["steps"] if step.outcomes[0].registered)
