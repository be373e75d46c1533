"""foxhunt.ensemble.loading: the engine of a loaded ensemble takes the configured rule, the members'
metric values as the weighted rule's weights (a member without one weighs 0), and refuses a rule
the ensemble cannot use in one line before any bar (loading itself: test_registry.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf
from test_members import Agent

from foxhunt.config.families import family_names
from foxhunt.data.features import FeatureConfig
from foxhunt.ensemble.engine import MemberInputs
from foxhunt.ensemble.loading import LoadedMember, ensemble_engine
from foxhunt.ensemble.members import AgentMember
from foxhunt.errors import ConfigError

ES = instantiate(OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "asset" / "es.yaml"))
INPUTS = MemberInputs(FeatureConfig(5, 10, 10), np.zeros(4), np.ones(4),
                      {"static": [0, 1, 2, 3], "known": list(range(4, 12)), "observed": [12, 13, 14, 15]})  # fmt: skip


def loaded(*members: tuple[str, str, float | None]) -> list[LoadedMember]:
    out = []
    for seed, (name, metric, value) in enumerate(members):
        member = AgentMember(name, "dqn", Agent(seed), "fp32", value, "numpy", 1)
        out.append(LoadedMember(member, INPUTS, name, "1", f"run{seed}", metric, value, "fp32"))
    return out


def cfg(rule: str, threshold: float = 0.0):
    return OmegaConf.create({"ensemble": {"rule": rule, "forecast_threshold": threshold}})


def test_the_engine_takes_the_rule_and_the_metric_values_as_weights():
    members = loaded(("foxhunt-dqn-es", "val/sharpe", 1.5), ("foxhunt-ppo-es", "val/sharpe", None))
    engine = ensemble_engine(members, ES, cfg("weighted", 0.25), origin="test")
    assert (engine.rule, engine.forecast_threshold, engine.origin) == ("weighted", 0.25, "test")
    assert engine.weights == {"foxhunt-dqn-es": 1.5, "foxhunt-ppo-es": 0.0}
    assert [m.name for m in engine.members] == ["foxhunt-dqn-es", "foxhunt-ppo-es"]


@pytest.mark.parametrize(
    ("members", "rule", "message"),
    [
        ([("a", "val/sharpe", 1.0), ("b", "val/sortino", 2.0)], "weighted",
         "ensemble.rule=weighted: the members were registered on different metrics (val/sharpe, val/sortino)"),
        ([("a", "val/loss", 0.1)], "weighted", "ensemble.rule=weighted: the members were registered on val/loss, better when lower"),
        ([("a", "val/sharpe", -1.0), ("b", "val/sharpe", None)], "weighted",
         "ensemble.rule=weighted: no member has a positive val/sharpe, so every weight would be 0"),
        ([("a", "val/sharpe", 1.0)], "mean_forecast", f"ensemble.rule=mean_forecast: the ensemble has no forecaster ({', '.join(family_names('forecaster'))})"),
        ([("a", "val/sharpe", 1.0)], "median", "ensemble.rule='median': must be one of majority, mean_forecast, weighted"),
    ],
)  # fmt: skip
def test_a_rule_the_ensemble_cannot_use_is_one_line(members, rule, message):
    with pytest.raises(ConfigError) as error:
        ensemble_engine(loaded(*members), ES, cfg(rule), origin="test")
    assert str(error.value).startswith(message)
