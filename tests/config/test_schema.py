"""The config schema's cross-field rules: each bad combination is one line naming the key."""

from __future__ import annotations

import pytest

from foxhunt.config.schema import ConfigError, label_reach, validate


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=tft", "model.module.horizon=500"],
         "model.module.horizon=500: the model's horizon is model.window.horizon (10); set that key"),
        (["model=mamba2", "model.module.seq_len=20"],
         "model.module.seq_len=20: the model's seq_len is model.window.seq_len (50); set that key"),
        (["model=tft", "model.window.horizon=30", "data.split.gap_bars=20"],
         "data.split.gap_bars=20: must be >= the tft labels' reach, 30 bars (model.window.horizon)"),
        (["model=ppo", "evaluation.protocol=walk_forward", "evaluation.walk_forward.purge_bars=4"],
         "evaluation.walk_forward.purge_bars=4: must be >= the ppo labels' reach, 8 bars (model.module.rollout_steps)"),
        (["model=dqn", "data.split.gap_bars=0"], "data.split.gap_bars=0: must be >= the dqn labels' reach, 1 bars (a one-step target)"),
        (["evaluation.holdout=1.2"], "evaluation.holdout=1.2: Input should be less than 1"),
        (["evaluation.walk_forward.folds=5"], "evaluation.walk_forward.folds=5: train + folds x (val + test) = 1.1 of the bars: must be <= 1"),
    ],
)  # fmt: skip
def test_a_bad_combination_is_one_line_naming_the_key(compose_cfg, overrides, message):
    with pytest.raises(ConfigError) as error:
        validate(compose_cfg(overrides))
    assert str(error.value) == message


def test_the_defaults_purge_every_familys_labels(compose_cfg):
    for model in ("dqn", "ppo", "mamba2", "tft"):
        cfg = compose_cfg([f"model={model}", "evaluation.protocol=walk_forward"])
        reach, _ = label_reach(validate(cfg).model)
        assert cfg.evaluation.walk_forward.purge_bars >= reach and cfg.data.split.gap_bars >= reach
