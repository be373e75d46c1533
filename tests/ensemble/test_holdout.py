"""foxhunt.ensemble.holdout, its report line (opening the lockbox once: test_gate.py): figures
measured now, figures recorded earlier said to be so, the best baseline by its Sharpe ratio, and
a champion without a lockbox said so."""

from __future__ import annotations

from foxhunt.ensemble.holdout import HoldoutReport

METRICS = {"holdout/sharpe": 1.23456, "holdout/pnl": -250.0, "holdout/steps": 812.0, "holdout/exposure": 0.5,
           "holdout/baseline/buy_and_hold/sharpe": 0.8, "holdout/baseline/momentum/sharpe": 1.1,
           "holdout/baseline/momentum/pnl": 99.0}  # fmt: skip


def test_figures_measured_now_and_the_best_baseline():
    line = HoldoutReport("foxhunt-dqn-es", "3", "r", METRICS, "2026-12-01T10:00:00+00:00", fresh=True).line()
    assert line == ("foxhunt-dqn-es version 3 on the lockbox, opened now (2026-12-01T10:00:00+00:00): sharpe 1.235, "
                    "pnl -250, exposure 0.5, steps 812; best baseline momentum 1.1")  # fmt: skip


def test_figures_recorded_earlier_say_they_are_not_scored_again():
    line = HoldoutReport("foxhunt-dqn-es", "2", "r", {"holdout/sharpe": 0.5}, "2026-11-30T09:00:00+00:00").line()
    assert line == ("foxhunt-dqn-es version 2 on the lockbox, opened 2026-11-30T09:00:00+00:00: its recorded figures, "
                    "not scored again: sharpe 0.5")  # fmt: skip


def test_a_champion_without_a_lockbox_says_so():
    note = "trained without a lockbox (evaluation.holdout=null): nothing to open"
    assert HoldoutReport("foxhunt-tft-es", "1", "r", note=note).line() == f"foxhunt-tft-es version 1: {note}"
