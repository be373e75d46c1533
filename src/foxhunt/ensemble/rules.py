"""How the members' decisions on one bar become the ensemble's position (``ensemble.rule``).

- ``majority``: the position most members hold (a tie between positions: flat);
- ``mean_forecast``: the forecasters only: the sign of the mean of their summed median
  forecasts when its magnitude exceeds ``ensemble.forecast_threshold`` (target-scale units,
  the forecasters' own rule applied to the mean), flat otherwise; forecasters not yet warm
  (fewer than ``seq_len`` bars) do not count;
- ``weighted``: a vote weighted by each member's value of the selection metric (clipped at
  0): the position with the largest total weight (a tie: flat). The metric must be one where
  higher is better.
"""

from __future__ import annotations

from collections.abc import Mapping

from foxhunt.config.families import family_names
from foxhunt.config.schema import ConfigError
from foxhunt.ensemble.members import Decision
from foxhunt.models.forecaster import signal_position

RULES = ("majority", "mean_forecast", "weighted")
POSITIONS = (-1, 0, 1)


def _vote(weights: Mapping[int, float]) -> int:
    best = max(weights.values())
    winners = [p for p in POSITIONS if weights.get(p, 0.0) == best]
    return winners[0] if len(winners) == 1 else 0


def combine(
    rule: str,
    decisions: Mapping[str, Decision],
    weights: Mapping[str, float] | None = None,
    forecast_threshold: float = 0.0,
) -> int:
    """The ensemble's position for one bar from its members' ``decisions`` (name -> Decision)."""
    if rule == "majority":
        votes = {p: 0.0 for p in POSITIONS}
        for decision in decisions.values():
            votes[decision.position] += 1.0
        return _vote(votes)
    if rule == "mean_forecast":
        signals = [d.signal for d in decisions.values() if d.signal is not None]
        if not signals:
            return 0
        return signal_position(sum(signals) / len(signals), forecast_threshold)
    if rule == "weighted":
        if weights is None:
            raise ValueError("ensemble.rule=weighted: no member weights")
        votes = {p: 0.0 for p in POSITIONS}
        for name, decision in decisions.items():
            votes[decision.position] += max(float(weights.get(name, 0.0)), 0.0)
        return _vote(votes)
    raise ValueError(f"ensemble.rule={rule!r}: must be one of {', '.join(RULES)}")


def check_rule(rule: str, families: list[str], weights: Mapping[str, float | None], metric: str,
               higher_is_better: bool) -> None:  # fmt: skip
    """One line (:class:`ConfigError`) naming what makes ``rule`` unusable for this ensemble, before
    any bar is read. ``metric``: what the members were registered on (their weights)."""
    if rule not in RULES:
        raise ConfigError(f"ensemble.rule={rule!r}: must be one of {', '.join(RULES)}")
    forecasters = family_names("forecaster")
    if rule == "mean_forecast" and not any(f in forecasters for f in families):
        raise ConfigError(f"ensemble.rule=mean_forecast: the ensemble has no forecaster ({', '.join(forecasters)})")
    if rule == "weighted":
        if not higher_is_better:
            raise ConfigError(
                f"ensemble.rule=weighted: the members were registered on {metric}, better when lower; weights need a metric where higher is better"
            )
        if not any(w is not None and w > 0 for w in weights.values()):
            raise ConfigError(f"ensemble.rule=weighted: no member has a positive {metric}, so every weight would be 0")
