"""foxhunt.config.model_schemas: each hyperparameter rule refuses exactly what it says, at its
boundary, in one line naming the key; the rules between parameters of one model likewise."""

from __future__ import annotations

import math

import pytest

from foxhunt.config.model_schemas import validate_model_hyperparameters
from foxhunt.errors import ConfigError


def check(module: dict, model: dict | None = None) -> None:
    validate_model_hyperparameters(object, module, model or {})


@pytest.mark.parametrize(
    ("key", "good", "bad", "rule"),
    [
        ("lr", [1e-9, 3, 10], [0, -1e-3, 10.5, 1e300, math.nan, math.inf, True, "0.1"], "must be a number > 0 and <= 10"),
        ("policy_lr", [3e-4], [0.0], "must be a number > 0 and <= 10"),
        ("gamma", [1e-6, 1.0], [0.0, 1.0001], "must be in (0, 1]"),
        ("gae_lambda", [0.95], [0], "must be in (0, 1]"),
        ("dropout", [0.0, 0.999], [1.0, -0.1], "must be in [0, 1)"),
        ("epsilon_decay", [1.0], [0.0], "must be in (0, 1]"),
        ("epsilon_end", [0.0], [1.5], "must be in [0, 1]"),
        ("quantiles", [[0.5], [0.1, 0.5, 0.9]], [[], [0.1, 0.9], [0.0, 0.5], [0.5, 1.0]], None),
        (
            "A_init_range",
            [[1, 1], [1.0, 16.0], [1, 1e4]],
            [[2, 1], [0, 1], [1], [1, 2, 3], [1, 1e5]],
            "must be [low, high] with 0 < low <= high <= 10000",
        ),
        ("activation_checkpointing", [True, False], [1, "true"], "must be true or false"),
        (
            "hidden_sizes",
            [[1], [256, 256], [65_536]],
            [[], [0], [32, 1.5], 32, [65_537]],
            "must be a non-empty list of integers >= 1 and <= 65536",
        ),
        ("value_hidden_sizes", [[8]], [[-1]], "must be a non-empty list of integers >= 1 and <= 65536"),
        ("seed", [0, 7, 2**32 - 1], [-1, 1.0, True, 2**32], "must be an integer >= 0 and <= 4294967295"),
        ("min_replay_size", [0, 10**8], [-5, 10**8 + 1], "must be an integer >= 0 and <= 100000000"),
        ("replay_capacity", [1], [0, 10**9], "must be an integer >= 1 and <= 100000000"),
        ("batch_size", [1, 2**20], [0, 2**20 + 1], "must be an integer >= 1 and <= 1048576"),
        ("d_model", [1, 65_536], [0, 32.0, False, 65_537], "must be an integer >= 1 and <= 65536"),
        ("n_layers", [1024], [1025], "must be an integer >= 1 and <= 1024"),
        ("seq_len", [100_000], [100_001], "must be an integer >= 1 and <= 100000"),
        ("target_update_every", [1], [0], "must be an integer >= 1 and <= 10000000"),
        ("target_update_interval", [100], [0, 10**8], "must be an integer >= 1 and <= 10000000"),
        ("adam_eps", [1e-8, 1.0], [0.0, 1.5, math.nan], "must be a number > 0 and <= 1"),
        ("norm_eps", [1e-5], [-1e-5], "must be a number > 0 and <= 1"),
        ("weight_decay", [0.0, 10], [-0.1, 11], "must be a number >= 0 and <= 10"),
        ("max_grad_norm", [0.0, 10, 1e6], [-0.5, 2e6, math.inf], "must be a number >= 0 and <= 1e6"),
        ("clip_coef", [0.2], [-0.1, 101], "must be a number >= 0 and <= 100"),
        ("position_threshold", [0.0, 1e6], [-1.0, 1e300], "must be a number >= 0 and <= 1e6"),
    ],
)
def test_each_rule_refuses_exactly_what_it_says(key, good, bad, rule):
    for value in good:
        check({key: value})
    for value in bad:
        with pytest.raises(ConfigError) as error:
            check({key: value})
        message = str(error.value)
        assert message.startswith(f"model.module.{key}={value!r}: ") and "\n" not in message
        if rule:
            assert message.endswith(rule)


@pytest.mark.parametrize(
    ("quantiles", "why"),
    [
        ([0.1, 0.9], "must include the median 0.5"),
        ([0.5, 0.1, 0.9], "must be strictly increasing"),
        ([0.1, 0.5, 0.5, 0.9], "must be strictly increasing"),
        ([0.0, 0.5], "must be a non-empty list of numbers in (0, 1)"),
    ],
)
def test_the_quantiles_say_what_is_wrong(quantiles, why):
    with pytest.raises(ConfigError) as error:
        check({"quantiles": quantiles})
    assert str(error.value).startswith(f"model.module.quantiles={quantiles!r}: {why}")


def test_private_unset_and_unknown_names_are_left_to_the_constructor():
    check({"_target_": "x.Y", "lr": None, "activation": "relu", "layout": {"kind": "a"}})


@pytest.mark.parametrize("value", [3, 0.5, [1, 2], {"a": 1.0}])
def test_a_number_under_a_name_without_a_rule_is_refused(value):
    with pytest.raises(ConfigError) as error:
        check({"momentum_beta": value})
    assert str(error.value) == (f"model.module.momentum_beta={value!r}: no range is known for a numeric hyperparameter of "
                                "this name (foxhunt.config.model_schemas.NAME_RULES holds one rule per name)")  # fmt: skip


@pytest.mark.parametrize(
    ("module", "model", "message"),
    [
        ({"hidden_size": 30, "num_heads": 4}, {}, "model.module.num_heads=4: must divide model.module.hidden_size (30)"),
        ({"epsilon_start": 0.5, "epsilon_end": 0.6}, {}, "model.module.epsilon_end=0.6: must be <= model.module.epsilon_start (0.5)"),
        ({"replay_capacity": 16, "batch_size": 32}, {}, "model.module.batch_size=32: must be <= model.module.replay_capacity (16)"),
        ({"replay_capacity": 16, "min_replay_size": 17}, {}, "model.module.min_replay_size=17: must be <= model.module.replay_capacity (16)"),
        ({"rollout_steps": 8, "minibatch_size": 24}, {"env": {"num_envs": 8}},
         "model.module.minibatch_size=24: must divide the rollout batch model.env.num_envs x model.module.rollout_steps (64)"),
        ({"rollout_steps": 8, "minibatch_size": 128}, {"env": {"num_envs": 8}}, "model.module.minibatch_size=128: must divide"),
        ({"d_model": 16, "expand": 2, "headdim": 12}, {}, "model.module.headdim=12: must divide d_model x expand (32)"),
        ({"d_model": 32, "expand": 2, "headdim": 16, "ngroups": 3}, {}, "model.module.ngroups=3: must divide the number of SSM heads (4)"),
        ({"input_dim": 15, "static_dim": 4, "known_dim": 8, "observed_dim": 4}, {},
         "model.module.input_dim=15: must equal static_dim + known_dim + observed_dim (16)"),
    ],
)  # fmt: skip
def test_the_rules_between_parameters(module, model, message):
    with pytest.raises(ConfigError) as error:
        check(module, model)
    assert str(error.value).startswith(message)


def test_parameters_that_fit_together_pass():
    check({"hidden_size": 32, "num_heads": 4, "epsilon_start": 1.0, "epsilon_end": 1.0, "replay_capacity": 32,
           "batch_size": 32, "min_replay_size": 32, "rollout_steps": 8, "minibatch_size": 16, "d_model": 32,
           "expand": 2, "headdim": 16, "ngroups": 4, "input_dim": 16, "static_dim": 4, "known_dim": 8,
           "observed_dim": 4}, {"env": {"num_envs": 8}})  # fmt: skip
