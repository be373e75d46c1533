"""Each model family's hyperparameters are defined once (issue 39): a typed definition next to the
model (foxhunt.config.model_schemas), which the config schema, the constructor and the reference
docs all read. Its defaults are conf/model/<family>.yaml's alone; its keys are that file's and
the constructor's; a value out of a field's range is one line naming ``model.module.<key>``."""

from __future__ import annotations

import copy
import functools
import inspect
import math
import tempfile
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import Field

from foxhunt.config.families import MODEL_DIR, family_names, model_class
from foxhunt.config.model_schemas import HyperparameterError, Hyperparameters, defined_by, field_rule
from foxhunt.config.schema import resolved_config, validate_resolved
from foxhunt.errors import ConfigError
from foxhunt.models.agent import AgentHyperparameters
from foxhunt.models.forecaster import ForecasterHyperparameters

FAMILIES = family_names()


def definition(family: str) -> type[Hyperparameters]:
    return model_class(family).hyperparameters


@functools.cache
def default_config(family: str) -> dict[str, Any]:
    """The default training config with ``model=<family>``, resolved (composed once per family)."""
    from foxhunt.training.parts import compose_config

    root = Path(tempfile.gettempdir()) / "foxhunt-model-schemas"  # only named in paths.*: nothing is written
    return resolved_config(compose_config([f"model={family}"], root_dir=root, config_name="train"))


def defaults(family: str) -> dict[str, Any]:
    """The family's ``model.module`` values of conf/model/<family>.yaml (interpolations resolved)."""
    return {key: value for key, value in default_config(family)["model"]["module"].items() if not key.startswith("_")}


# ------------------------------------------------------------------------------ one place each
@pytest.mark.parametrize("family", FAMILIES)
def test_the_definition_accepts_the_defaults_of_conf(family):
    assert definition(family).check(defaults(family)) == defaults(family)
    validate_resolved(default_config(family))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_keys_of_conf_the_definition_and_the_constructor_are_the_same(family):
    """A key added in one of the three places only is found here (a key of conf/ the definition
    lacks, a field no config sets, a constructor argument nothing checks)."""
    module = yaml.safe_load((MODEL_DIR / f"{family}.yaml").read_text())["module"]
    conf_keys = {key for key in module if key != "_target_"}
    parameters = set(inspect.signature(model_class(family)).parameters)
    assert conf_keys == set(definition(family).model_fields) == parameters


@pytest.mark.parametrize("base", [AgentHyperparameters, ForecasterHyperparameters])
def test_the_shared_keys_are_defined_once_in_the_base(base):
    kind = "agent" if base is AgentHyperparameters else "forecaster"
    for family in family_names(kind):
        assert issubclass(definition(family), base)
        below = definition(family).__mro__[: definition(family).__mro__.index(base)]
        redefined = [name for cls in below for name in cls.__dict__.get("__annotations__", {}) if name in base.model_fields]
        assert redefined == [], family  # inherited, not written again


@pytest.mark.parametrize("family", FAMILIES)
def test_no_definition_carries_a_default(family):
    """The defaults live in conf/model/<family>.yaml only."""
    for cls in definition(family).__mro__:
        if isinstance(cls, type) and issubclass(cls, Hyperparameters) and cls is not Hyperparameters:
            with_default = [name for name, field in cls.model_fields.items() if not field.is_required()]
            assert with_default == [], f"{cls.__name__}: {with_default}"


@pytest.mark.parametrize("family", FAMILIES)
def test_every_field_has_a_range_and_a_line_of_doc(family):
    for name, field in definition(family).model_fields.items():
        rule = field_rule(definition(family), name)
        assert field.description and "\n" not in field.description, name
        assert rule.interval or rule.kind.startswith(("one of", "bool")), name  # every number has both ends


# ------------------------------------------------------------------------------ out of range
def _bounds(metadata: list[Any]) -> tuple[Any, Any]:
    low = next((m for m in metadata if hasattr(m, "ge") or hasattr(m, "gt")), None)
    high = next((m for m in metadata if hasattr(m, "le") or hasattr(m, "lt")), None)
    return low, high


def _refused(annotation: Any, metadata: list[Any]) -> st.SearchStrategy[Any]:
    """Values a field of this type and these constraints refuses (its annotation walked)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _refused(args[0], [*metadata, *(m for info in args[1:] for m in getattr(info, "metadata", [info]))])
    if type(None) in args:  # optional: what its type refuses, None aside
        (inner,) = [a for a in args if a is not type(None)]
        return _refused(inner, metadata).filter(lambda v: v is not None)
    wrong_type = st.sampled_from(["x", "0.5", [1], {"a": 1}])
    if origin in (Union, types.UnionType) and all(a is bool or typing.get_origin(a) is Literal for a in args):
        choices = {v for a in args if a is not bool for v in typing.get_args(a)}  # a switch with a third value
        return st.one_of(_refused(bool, []), st.text(max_size=8).filter(lambda v: v not in choices))
    if origin is Literal:
        return st.one_of(st.text(max_size=8).filter(lambda v: v not in args), st.integers(), st.none())
    if origin is list:
        fewest = next((m.min_length for m in metadata if hasattr(m, "min_length")), 0)
        most = next((m.max_length for m in metadata if hasattr(m, "max_length")), None)
        bad_items = st.lists(_refused(args[0], []), min_size=max(fewest, 1), max_size=max(fewest, 1) + 1)
        options = [bad_items, st.sampled_from([1, 0.5, "x", None])]
        if fewest:
            options.append(st.just([]))
        if most is not None:  # one item too many
            options.append(st.just([1.0] * (most + 1)))
        return st.one_of(options)
    if annotation is bool:
        return st.sampled_from([0, 1, "true", "yes", None, 1.0])
    low, high = _bounds(metadata)
    if annotation is int:
        lowest = low.ge if hasattr(low, "ge") else low.gt + 1
        highest = high.le if hasattr(high, "le") else high.lt - 1
        return st.one_of(st.integers(max_value=lowest - 1), st.integers(min_value=highest + 1), st.booleans(), st.none(),
                         st.floats(allow_nan=True), wrong_type)  # fmt: skip
    assert annotation is float, annotation
    below = (st.floats(max_value=low.ge).filter(lambda v: v < low.ge) if hasattr(low, "ge")
             else st.floats(max_value=low.gt).filter(lambda v: v <= low.gt))  # fmt: skip
    above = (st.floats(min_value=high.le).filter(lambda v: v > high.le) if hasattr(high, "le")
             else st.floats(min_value=high.lt).filter(lambda v: v >= high.lt))  # fmt: skip
    return st.one_of(below, above, st.sampled_from([math.nan, math.inf, -math.inf, True, False, None]), wrong_type)


def refused_values(family: str, key: str) -> st.SearchStrategy[Any]:
    field = definition(family).model_fields[key]
    return _refused(field.annotation, list(field.metadata))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_value_out_of_a_fields_range_is_one_line_naming_the_key(data):
    family = data.draw(st.sampled_from(FAMILIES), label="family")
    cls = definition(family)
    key = data.draw(st.sampled_from(sorted(cls.model_fields)), label="key")
    value = data.draw(refused_values(family, key), label="value")
    with pytest.raises(HyperparameterError) as error:
        cls.check({**defaults(family), key: value})
    assert str(error.value) == f"model.module.{key}={value!r}: must be {field_rule(cls, key).phrase}"

    config = copy.deepcopy(default_config(family))
    config["model"]["module"][key] = value
    with pytest.raises(ConfigError) as error:  # the config schema: the same key named first
        validate_resolved(config)
    message = str(error.value)
    shown = message.startswith(f"model.module.{key}={value!r}: ")
    unset = value is None and message.startswith(f"model.module.{key}: ")  # the schema's own rules show no =None
    assert (shown or unset) and "\n" not in message


# ------------------------------------------------------------------------------ the messages
@pytest.mark.parametrize(
    ("family", "changes", "message"),
    [
        ("dqn", {"lr": 0}, "model.module.lr=0: must be a number > 0 and <= 10"),
        ("dqn", {"lr": "0.1"}, "model.module.lr='0.1': must be a number > 0 and <= 10"),
        ("dqn", {"gamma": 1.0}, "model.module.gamma=1.0: must be a number >= 0 and < 1"),
        ("dqn", {"hidden_sizes": [32, 1.5]}, "model.module.hidden_sizes=[32, 1.5]: must be a non-empty list of integers >= 1 and <= 65536"),
        ("dqn", {"activation": "swish"}, "model.module.activation='swish': must be one of relu, tanh, gelu, silu, elu"),
        ("dqn", {"seed": 2**32}, "model.module.seed=4294967296: must be an integer >= 0 and <= 4294967295"),
        ("dqn", {"steps_per_call": 1.0}, "model.module.steps_per_call=1.0: must be an integer >= 1 and <= 10000000"),
        ("ppo", {"max_grad_norm": -1}, "model.module.max_grad_norm=-1: must be a number > 0 and <= 1e6 or null"),
        ("ppo", {"gae_lambda": 1.5}, "model.module.gae_lambda=1.5: must be a number >= 0 and <= 1"),
        ("mamba2", {"A_init_range": [1.0, 2e4]}, "model.module.A_init_range=[1.0, 20000.0]: must be a list of 2 numbers > 0 and <= 10000"),
        ("mamba2", {"A_init_range": [1.0]}, "model.module.A_init_range=[1.0]: must be a list of 2 numbers > 0 and <= 10000"),
        ("tft", {"dropout": 1.0}, "model.module.dropout=1.0: must be a number >= 0 and < 1"),
        ("tft", {"activation_checkpointing": 1}, "model.module.activation_checkpointing=1: must be one of true, false, auto"),
        ("tft", {"activation_checkpointing": "on"}, "model.module.activation_checkpointing='on': must be one of true, false, auto"),
        ("dlinear", {"quantiles": [0.0, 0.5]}, "model.module.quantiles=[0.0, 0.5]: must be a non-empty list of numbers > 0 and < 1"),
    ],
)  # fmt: skip
def test_a_refusal_names_the_key_the_value_and_what_is_allowed(family, changes, message):
    with pytest.raises(HyperparameterError) as error:
        definition(family).check({**defaults(family), **changes})
    assert str(error.value) == message


@pytest.mark.parametrize(
    ("quantiles", "why"),
    [
        ([0.1, 0.9], "must include the median 0.5 (positions follow the median forecast)"),
        ([0.5, 0.1, 0.9], "must be strictly increasing"),
        ([0.1, 0.5, 0.5, 0.9], "must be strictly increasing"),
        ([], "must be a non-empty list of numbers > 0 and < 1"),
    ],
)
@pytest.mark.parametrize("family", family_names("forecaster"))
def test_the_quantiles_say_what_is_wrong(family, quantiles, why):
    with pytest.raises(HyperparameterError) as error:
        definition(family).check({**defaults(family), "quantiles": quantiles})
    assert str(error.value) == f"model.module.quantiles={quantiles!r}: {why}"


@pytest.mark.parametrize(
    ("family", "changes", "message"),
    [
        ("tft", {"hidden_size": 30}, "model.module.num_heads=4: must divide model.module.hidden_size (30)"),
        ("tft", {"input_dim": 15}, "model.module.input_dim=15: must equal static_dim + known_dim + observed_dim (16)"),
        ("dqn", {"epsilon_start": 0.5, "epsilon_end": 0.6}, "model.module.epsilon_end=0.6: must be <= model.module.epsilon_start (0.5)"),
        ("dqn", {"replay_capacity": 16, "batch_size": 32}, "model.module.batch_size=32: must be <= model.module.replay_capacity (16)"),
        ("dqn", {"replay_capacity": 16, "batch_size": 16, "min_replay_size": 17}, "model.module.min_replay_size=17: must be <= model.module.replay_capacity (16)"),
        ("dqn", {"replay_capacity": 3, "batch_size": 3, "min_replay_size": 3}, "model.module.replay_capacity=3: must be >= model.module.num_envs (4)"),
        ("ppo", {"minibatch_size": 24},
         "model.module.minibatch_size=24: must divide the rollout batch model.env.num_envs x model.module.rollout_steps (64)"),
        ("ppo", {"minibatch_size": 128}, "model.module.minibatch_size=128: must divide the rollout batch"),
        ("mamba2", {"d_model": 16, "headdim": 12}, "model.module.headdim=12: must divide d_model x expand (32)"),
        ("mamba2", {"d_model": 32, "headdim": 16, "ngroups": 3}, "model.module.ngroups=3: must divide the number of SSM heads (4)"),
        ("mamba2", {"dt_min": 0.2, "dt_max": 0.1}, "model.module.dt_max=0.1: must be >= model.module.dt_min (0.2)"),
        ("mamba2", {"A_init_range": [2.0, 1.0]}, "model.module.A_init_range=[2.0, 1.0]: must be [low, high] with low <= high"),
        ("dlinear", {"moving_average": 24}, "model.module.moving_average=24: must be odd and <= model.module.seq_len (50)"),
        ("dlinear", {"moving_average": 51}, "model.module.moving_average=51: must be odd and <= model.module.seq_len (50)"),
    ],
)  # fmt: skip
def test_the_rules_between_keys(family, changes, message):
    with pytest.raises(HyperparameterError) as error:
        definition(family).check({**defaults(family), **changes})
    assert str(error.value).startswith(message)


def test_values_that_fit_together_pass():
    definition("tft").check({**defaults("tft"), "hidden_size": 32, "num_heads": 4})
    definition("dqn").check({**defaults("dqn"), "epsilon_start": 1.0, "epsilon_end": 1.0, "replay_capacity": 32,
                             "batch_size": 32, "min_replay_size": 32})  # fmt: skip
    definition("ppo").check({**defaults("ppo"), "rollout_steps": 8, "minibatch_size": 16})
    definition("mamba2").check(
        {**defaults("mamba2"), "d_model": 32, "expand": 2, "headdim": 16, "ngroups": 4, "A_init_range": [3, 3]}
    )


# ------------------------------------------------------------------------------ the constructor
@pytest.mark.parametrize("family", FAMILIES)
def test_a_model_built_directly_is_checked_by_the_same_definition(family):
    values = {**defaults(family), "seed" if family in family_names("agent") else "dropout": -1}
    key = "seed" if family in family_names("agent") else "dropout"
    with pytest.raises(HyperparameterError) as built:
        model_class(family)(**values)
    with pytest.raises(HyperparameterError) as checked:
        definition(family).check(values)
    assert str(built.value) == str(checked.value) and str(built.value).startswith(f"model.module.{key}=-1: ")


def test_the_constructor_gets_plain_validated_values():
    from omegaconf import OmegaConf

    model = model_class("dqn")(**{**defaults("dqn"), "hidden_sizes": OmegaConf.create([8, 8])})
    assert type(model.hparams["hidden_sizes"]) is list and model.hparams["hidden_sizes"] == [8, 8]


def test_a_constructor_and_its_definition_must_name_the_same_keys():
    class Tiny(Hyperparameters):
        width: Annotated[int, Field(ge=1, le=8, description="a width")]

    with pytest.raises(TypeError, match=r"Model.__init__ takes \['depth', 'width'\], Tiny defines \['width'\]"):

        @defined_by(Tiny)
        class Model:
            def __init__(self, width: int, depth: int) -> None:
                self.width, self.depth = width, depth


def test_a_target_that_is_not_a_foxhunt_model_is_one_line():
    """A class that takes any keyword (its signature cannot refuse a key) but defines no
    hyperparameters is not a model family: the schema says so instead of building it."""
    config = copy.deepcopy(default_config("dqn"))
    config["model"]["module"]["_target_"] = "argparse.Namespace"
    with pytest.raises(ConfigError) as error:
        validate_resolved(config)
    assert str(error.value) == ("model.module._target_='argparse.Namespace': not a foxhunt model (its class defines no "
                                "hyperparameters: foxhunt.config.model_schemas.defined_by)")  # fmt: skip
