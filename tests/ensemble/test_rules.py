"""The ensemble rules on hand-made decisions, and what makes a rule unusable for an ensemble."""

from __future__ import annotations

import numpy as np
import pytest

from foxhunt.config.schema import ConfigError
from foxhunt.ensemble.members import Decision
from foxhunt.ensemble.rules import check_rule, combine


def decisions(*positions, signals=None):
    signals = signals or [None] * len(positions)
    return {f"m{i}": Decision(p, None if s is None else np.zeros((2, 3)), s) for i, (p, s) in enumerate(zip(positions, signals))}


@pytest.mark.parametrize(
    ("positions", "expected"),
    [((1, 1, -1), 1), ((-1, -1, 0, 1), -1), ((1, -1), 0), ((1, -1, 0), 0), ((0, 0, 1), 0), ((1,), 1), ((1, 1, -1, -1, 0), 0)],
)
def test_majority_takes_the_most_held_position_and_a_tie_is_flat(positions, expected):
    assert combine("majority", decisions(*positions)) == expected


def test_mean_forecast_thresholds_the_mean_signal_of_the_warm_forecasters():
    d = decisions(1, -1, 0, signals=[3.0, -0.5, None])  # the third is an agent, or a cold forecaster
    assert combine("mean_forecast", d, forecast_threshold=1.0) == 1  # mean 1.25 > 1
    assert combine("mean_forecast", d, forecast_threshold=1.3) == 0
    assert combine("mean_forecast", decisions(1, 1, signals=[-2.0, -1.0]), forecast_threshold=1.0) == -1
    assert combine("mean_forecast", decisions(1, 0), forecast_threshold=0.0) == 0  # no signal at all: flat


def test_weighted_votes_by_the_metric_clipped_at_zero():
    d = decisions(1, -1, -1)
    assert combine("weighted", d, {"m0": 3.0, "m1": 1.0, "m2": 1.0}) == 1  # 3 against 2
    assert combine("weighted", d, {"m0": 1.5, "m1": 1.0, "m2": 1.0}) == -1
    assert combine("weighted", d, {"m0": 2.0, "m1": 1.0, "m2": 1.0}) == 0  # a tie
    assert combine("weighted", d, {"m0": -9.0, "m1": 1.0, "m2": 0.0}) == -1  # a negative weight counts 0


@pytest.mark.parametrize(
    ("rule", "families", "weights", "metric", "higher", "message"),
    [
        ("vote", ["dqn"], {}, "val/sharpe", True, "ensemble.rule='vote': must be one of"),
        ("mean_forecast", ["dqn", "ppo"], {}, "val/sharpe", True, "the ensemble has no forecaster"),
        ("weighted", ["tft"], {"a": 1.0}, "val/loss", False, "registered on val/loss, better when lower"),
        ("weighted", ["dqn", "tft"], {"a": -1.0, "b": 0.0}, "val/sharpe", True, "no member has a positive val/sharpe"),
    ],
)
def test_an_unusable_rule_is_one_line(rule, families, weights, metric, higher, message):
    with pytest.raises(ConfigError, match=message):
        check_rule(rule, families, weights, metric, higher)
    check_rule("majority", families, weights, metric, higher)  # majority works for any ensemble
