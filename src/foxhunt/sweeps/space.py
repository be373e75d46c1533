"""A search's space: Hydra's sweep overrides as Optuna distributions, and a trial's values as overrides.

The searched keys are ``hydra.sweeper.params`` and the command line's sweeps, the command
line's plain values fixing a key (:func:`foxhunt.sweeps.search.search_arguments`). Each searched
key's override becomes one distribution:

- ``choice(a, b, ...)`` -> categorical over the values as Hydra writes them
  (``[64,64]`` stays the text ``[64,64]``, which the trial's override parses back to a list);
- ``interval(lo, hi)`` -> a float (an int when both bounds are ints) uniform on ``[lo, hi]``,
  ``tag(log, interval(...))`` on a log scale;
- ``range(start, stop[, step])`` -> the ints (or floats) ``start, start + step, ...`` below
  ``stop``, as Hydra's ``range`` lists them (stop excluded); ``shuffle(range(...))`` -> categorical.

A trial's values come back as overrides ``key=value`` (:func:`trial_overrides`), after the
fixed ones, in the order of the space.
"""

from __future__ import annotations

import math
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, RangeSweep, Transformer
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from foxhunt.errors import ConfigError


def _categorical(override) -> Any:
    choices = []
    for value in override.sweep_iterator(transformer=Transformer.encode):
        if not isinstance(value, (str, int, float, bool, type(None))):
            raise ConfigError(f"{override.input_line}: a choice of {type(value).__name__} cannot be searched")
        choices.append(value)
    return CategoricalDistribution(choices)


def distribution(override) -> Any:
    """The Optuna distribution of one searched key's sweep override (module doc)."""
    value = override.value()
    if override.is_choice_sweep():
        return _categorical(override)
    if override.is_range_sweep():
        assert isinstance(value, RangeSweep)
        if value.shuffle:
            return _categorical(override)
        start, stop, step = value.start, value.stop, value.step
        assert start is not None and stop is not None and step is not None  # Hydra's parser sets all three
        count = math.ceil((stop - start) / step)
        if count < 1 or step <= 0:
            raise ConfigError(f"{override.input_line}: an empty range cannot be searched")
        last = start + step * (count - 1)
        if all(isinstance(v, int) for v in (start, stop, step)):
            return IntDistribution(int(start), int(last), step=int(step))
        return FloatDistribution(float(start), float(last), step=float(step))
    if override.is_interval_sweep():
        assert isinstance(value, IntervalSweep)
        log = "log" in value.tags
        if value.start is None or value.end is None or not value.start < value.end:
            raise ConfigError(f"{override.input_line}: an interval needs two bounds, the first below the second")
        if log and value.start <= 0:
            raise ConfigError(f"{override.input_line}: a log-scale interval needs bounds > 0")
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log)
        return FloatDistribution(float(value.start), float(value.end), log=log)
    raise ConfigError(f"{override.input_line}: not a search (choice, interval or range)")


def distributions(space: dict[str, str]) -> dict[str, Any]:
    """``{key: override text}`` (the searched keys) -> ``{key: distribution}``."""
    parser = OverridesParser.create()
    return {key: distribution(parser.parse_override(f"{key}={text}")) for key, text in space.items()}


def value_text(value: Any) -> str:
    """A trial's value as an override's value: the choice's text, a number as Python writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value) if not isinstance(value, float) else repr(value)


def trial_overrides(fixed: list[str], params: dict[str, Any], keys: list[str]) -> list[str]:
    """The overrides of one trial: the fixed ones, then each searched key at the trial's value."""
    return [*fixed, *(f"{key}={value_text(params[key])}" for key in keys)]
