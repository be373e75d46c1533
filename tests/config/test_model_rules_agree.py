"""The config schema and the model constructors hold one set of hyperparameter rules (issue 39):
a config the schema accepts builds, and a value the model would refuse is refused by the
schema, in one line naming the key, before anything is built. Each case below is one where the
two disagreed before (the schema's name rules against the constructors' own checks)."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate

from foxhunt.config.schema import ConfigError, validate


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        # the schema let these through; the constructor refused them when the model was built
        (["model=dqn", "model.module.min_replay_size=0"],
         "model.module.min_replay_size=0: must be an integer >= 1 and <= 100000000"),
        (["model=dqn", "model.module.replay_capacity=2", "model.module.batch_size=2", "model.module.min_replay_size=2"],
         "model.module.replay_capacity=2: must be >= model.module.num_envs (4)"),
        (["model=dqn", "model.module.max_grad_norm=0.0"], "model.module.max_grad_norm=0.0: must be a number > 0 and <= 1e6 or null"),
        (["model=ppo", "model.module.clip_coef=0.0"], "model.module.clip_coef=0.0: must be a number > 0 and <= 100"),
        (["model=ppo", "model.module.max_grad_norm=0.0"], "model.module.max_grad_norm=0.0: must be a number > 0 and <= 1e6 or null"),
        (["model=mamba2", "model.module.dt_min=0.2"], "model.module.dt_max=0.1: must be >= model.module.dt_min (0.2)"),
        # gamma = 1 has no return to estimate: the episodes are truncated, never terminated, and both agents bootstrap
        (["model=dqn", "model.module.gamma=1.0"], "model.module.gamma=1.0: must be a number >= 0 and < 1"),
        (["model=ppo", "model.module.gamma=1.0"], "model.module.gamma=1.0: must be a number >= 0 and < 1"),
    ],
)  # fmt: skip
def test_a_value_the_model_refuses_is_refused_by_the_schema_in_one_line(compose_cfg, overrides, line):
    with pytest.raises(ConfigError) as error:
        validate(compose_cfg(overrides))
    assert str(error.value) == line


@pytest.mark.parametrize(
    "overrides",
    [
        ["model=dqn", "model.module.gamma=0.0"],  # a one-step target r: refused by the schema's (0, 1] before
        ["model=ppo", "model.module.gamma=0.0"],  # the advantage r - V(s)
        ["model=ppo", "model.module.gae_lambda=0.0"],  # GAE(0): the one-step TD advantage
        ["model=ppo", "model.module.max_grad_norm=null"],  # no clipping, as DQN's null: a TypeError in the constructor before
    ],
)
def test_a_value_the_schema_accepts_builds(compose_cfg, overrides):
    cfg = compose_cfg(overrides)
    validate(cfg)
    instantiate(cfg.model.module)
