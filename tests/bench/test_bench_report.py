"""The benchmark's verdicts: a goal met past the run-to-run noise, at it, or missed.

A median of paired ratios that meets a goal while its confidence interval crosses the goal is a
lead the noise can hide (issue 41); the report must say which it is. The interval is the
median's distribution-free one, so its coverage is checked by simulation here, on noise that is
far from normal.
"""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from foxhunt.bench import report
from foxhunt.bench.measure import PairedRatio, paired_ratio, paired_ratios
from foxhunt.bench.report import Row
from foxhunt.bench.settings import BenchSettingsError, load_settings

ratios = st.lists(st.floats(min_value=0.01, max_value=100.0), min_size=1, max_size=25)


@given(ratios)
def test_the_interval_brackets_the_median_from_the_ratios_themselves(values):
    result = paired_ratios(values, [1.0] * len(values), 0.9)
    assert result.median == paired_ratio(values, [1.0] * len(values))
    assert result.pairs == len(values) and result.confidence == 0.9
    if len(values) < 5:  # fewer pairs than a distribution-free 90% interval needs
        assert math.isnan(result.low) and math.isnan(result.high)
    else:
        assert result.low in values and result.high in values
        assert result.low <= result.median <= result.high


def test_the_interval_covers_the_true_median_at_least_as_often_as_it_says():
    """Skewed noise (log-normal ratios around a true median of 2.0): the 90% interval of 5 and of
    9 pairs holds 2.0 in at least 90% of 1,500 simulated runs (in theory 93.75% and 96.1%: about six
    and twelve standard errors above 90%)."""
    rng = random.Random(41)
    for pairs in (5, 9):
        held = 0
        for _ in range(1500):
            values = [2.0 * math.exp(rng.gauss(0.0, 0.15)) for _ in range(pairs)]
            result = paired_ratios(values, [1.0] * pairs, 0.9)
            held += result.low <= 2.0 <= result.high
        assert held / 1500 >= 0.9


def ratio_row(low: float, median: float, high: float, goal_op: str = ">=", goal: float = 2.0, pairs: int = 5) -> Row:
    return Row.paired(
        PairedRatio(median, low, high, 0.9, pairs),
        section="rl", name="DQN vs Stable-Baselines3", threads=1, unit="env-steps/s",
        foxhunt=median, reference=1.0, goal_op=goal_op, goal=goal,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("low", "median", "high", "goal_op", "goal", "met", "past", "text"),
    [
        (2.05, 2.2, 2.4, ">=", 2.0, True, True, "yes"),
        (1.86, 2.02, 2.11, ">=", 2.0, True, False, "within noise"),  # at the goal, not past the noise
        (1.5, 1.8, 2.1, ">=", 2.0, False, False, "**no**"),
        (0.5, 0.55, 0.58, "<=", 0.6, True, True, "yes"),
        (0.5, 0.58, 0.62, "<=", 0.6, True, False, "within noise"),
        (0.85, 0.87, 0.89, "<=", 0.6, False, False, "**no**"),
    ],
)
def test_a_goal_is_met_past_the_noise_only_when_the_whole_interval_meets_it(low, median, high, goal_op, goal, met, past, text):
    row = ratio_row(low, median, high, goal_op, goal)
    assert row.met is met and row.met_past_noise is past
    line = next(line for line in report.markdown(_report([row])).splitlines() if line.startswith("| DQN"))
    assert line.endswith(f"| {text} |")
    assert f"{report._fmt(low)}-{report._fmt(high)}x (90%, 5 pairs)" in line


def test_too_few_pairs_meet_a_goal_without_a_claim_about_the_noise():
    row = ratio_row(float("nan"), 2.2, float("nan"), pairs=2)
    assert row.met is True and row.met_past_noise is None
    line = next(line for line in report.markdown(_report([row])).splitlines() if line.startswith("| DQN"))
    assert "| - (2 pairs) |" in line and line.endswith("| yes (2 pairs: noise not bounded) |")


def test_rows_round_trip_through_the_json_file(tmp_path):
    rows = [ratio_row(1.86, 2.02, 2.11), ratio_row(float("nan"), 2.2, float("nan"), pairs=2)]
    json_path, md_path = report.write(_report(rows), tmp_path)
    loaded = json.loads(json_path.read_text())  # strict JSON: NaN ends written as null
    assert [(r["met"], r["met_past_noise"], r["figure_low"]) for r in loaded["rows"]] == [(True, False, 1.86), (True, None, None)]
    assert report.markdown(loaded) == md_path.read_text()  # a report read back renders the same


@pytest.mark.parametrize("value", ["0", "1", "1.5", "-0.1", "true", "high"])
def test_a_bad_confidence_is_one_line_naming_the_key(value):
    with pytest.raises(BenchSettingsError, match=r"^confidence=.*: must be a number between 0 and 1, e.g. 0.9 \("):
        load_settings(overrides=[f"confidence={value}"])


def test_the_default_repeats_bound_the_default_confidence():
    """The shipped settings can say 'past the noise' about the RL rows: enough repeats for an interval."""
    settings = load_settings()
    result = paired_ratios([1.0] * int(settings.repeats), [1.0] * int(settings.repeats), float(settings.confidence))
    assert not math.isnan(result.low)


def _report(rows: list[Row]) -> dict:
    meta = {
        "machine": {"cpu": "test", "logical_cpus": 2, "torch": "x", "lightning": "x", "python": "x"},
        "command": "pytest", "load_before": [0.0, 0.0, 0.0], "load_after": [0.0, 0.0, 0.0],
        "started": "now", "seconds": 1.0, "settings_file": "default.yaml",
    }  # fmt: skip
    return {"meta": meta, "rows": [row.to_dict() for row in rows], "notes": {}, "skipped": {}}
