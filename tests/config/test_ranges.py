"""Every numeric key of the config has a range (issue 35).

For every numeric leaf of the composed default training config and ensemble config (and of the
presets that add numeric keys of their own: the other model families, launchers, int8, the file
sources, the optional trainer and evaluation keys), a value outside any sensible range is
refused by the schema with one line that names that key and the value: not a number (nan,
+-inf), absurdly large (>= 1e15 in magnitude), or negative where the key counts or measures
something. The configs are composed once; each example only validates
(:func:`foxhunt.config.schema.validate_resolved`), every leaf once per example.
"""

from __future__ import annotations

import copy
import functools
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from foxhunt.config.schema import resolved_config, validate_resolved
from foxhunt.errors import ConfigError
from foxhunt.training.parts import compose_config

# (config name, overrides): the defaults, then presets that bring numeric keys the defaults lack
PRESETS = [
    ("train", []),
    ("ensemble", ["ensemble.versions.tft=3"]),
    ("train", ["model=ppo"]),
    ("train", ["model=mamba2"]),
    ("train", ["model=tft"]),
    ("train", ["model=dlinear"]),
    ("train", ["strategy=slurm"]),
    ("train", ["strategy=parallel"]),
    ("train", ["precision=int8"]),
    ("train", ["data=csv", "data.source.path=bars.csv"]),
    ("train", ["data=databento", "data.source.path=bars.dbn", "data.source.roll.expiry_sessions=3"]),
    ("train", ["trainer=smoke", "debug=overfit", "trainer.gradient_clip_val=1.0", "+trainer.min_epochs=1",
               "+trainer.accumulate_grad_batches=2", "+trainer.val_check_interval=0.5", "evaluation.holdout=0.1",
               "evaluation.seeds=[1,2]", "evaluation.protocol=walk_forward", "evaluation.fold=1",
               "+callbacks.model_checkpoint.every_n_epochs=1"]),
]  # fmt: skip

#: Keys whose range reaches below 0: the least value allowed (every other key is >= 0).
FLOORS = {
    "trainer.max_epochs": -1,  # -1: no limit
    "trainer.max_steps": -1,
    "trainer.devices": -1,  # -1: every device
    "trainer.num_sanity_val_steps": -1,  # -1: every validation batch
    "callbacks.model_checkpoint.save_top_k": -1,  # -1: keep every checkpoint
    "data.source.autocorrelation": -1.0,  # (-1, 1)
    "data.source.drift_per_day": -0.01,
}
HUGE = 1e15  # above every bound


def _leaves(node, path=""):
    """(dotted key, the key that names it in a message, value) of every numeric leaf; a list's
    elements are named by the list's key."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            for leaf, _, number in _leaves(value, f"{path}.{index}"):
                yield leaf, path, number
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path, path, node


def _set(config: dict, key: str, value) -> dict:
    changed = copy.deepcopy(config)
    *parents, last = key.split(".")
    node = changed
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[int(last) if isinstance(node, list) else last] = value
    return changed


@functools.cache
def numeric_leaves() -> list[tuple[dict, str, str, int | float]]:
    """[(resolved config, key, the key a message names, default value)], each key once (composed
    once: a module-level cache, not a fixture, so that Hypothesis never prints the configs)."""
    root = Path(tempfile.gettempdir()) / "foxhunt-ranges"  # only named in paths.*: nothing is written
    seen, out = set(), []
    for name, overrides in PRESETS:
        resolved = resolved_config(compose_config(overrides, root_dir=root, config_name=name))
        validate_resolved(resolved)  # the preset itself is valid
        for key, named, value in _leaves(resolved):
            if key not in seen:
                seen.add(key)
                out.append((resolved, key, named, value))
    assert {"trainer.limit_train_batches", "data.source.days", "paper.capital_usd", "execution.slippage_ticks",
            "model.module.lr", "ensemble.serve.max_batch", "callbacks.progress.every_n_steps"} <= seen  # fmt: skip
    return out


def _bad_value(key: str, default):
    """Values no range of ``key`` may hold: non-finite, absurdly large, below its floor."""
    floor = FLOORS.get(key, 0)
    if isinstance(default, int):
        huge = st.integers(min_value=int(HUGE), max_value=10**30)
        below = st.integers(min_value=-(10**30), max_value=math.ceil(floor) - 1)
    else:
        huge = st.floats(min_value=HUGE, max_value=1e308)
        below = st.floats(min_value=-1e308, max_value=floor, exclude_max=True).filter(lambda v: v < floor)
    non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
    return st.one_of(non_finite, huge, huge.map(lambda v: -v), below)


# every example checks every key and the failure lists each key that lacks a range: shrinking
# hundreds of draws at once would take minutes and add nothing to that list
@settings(max_examples=25, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(data=st.data())
def test_every_numeric_key_refuses_an_out_of_range_value_naming_the_key(data):
    unranged = []
    for config, key, named, default in numeric_leaves():
        value = data.draw(_bad_value(key, default), label=key)
        changed = _set(config, key, value)
        try:
            validate_resolved(changed)
        except ConfigError as error:
            message = str(error)
            exact = message.startswith(f"{key}={value!r}: ")  # the key, or a list's element, and the value
            in_list = named != key and message.startswith(f"{named}=") and repr(value) in message  # the list, holding it
            if "\n" in message or not (exact or in_list):
                unranged.append(f"{key}={value!r}: refused as {message[:200]!r}")
        else:
            unranged.append(f"{key}={value!r}: accepted")
    assert not unranged, f"{len(unranged)} key(s) without a range:\n" + "\n".join(unranged)
