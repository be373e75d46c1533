"""The config hash: the same training gives the same hash, whatever only displays, launches or
records it; anything that changes the result gives another."""

from __future__ import annotations

import pytest

from foxhunt.runs.config_hash import config_hash


def test_config_hash_ignores_folders_launch_and_tracking_but_not_training(compose_cfg, tmp_path):
    base = config_hash(compose_cfg(["model=dqn", "trainer=smoke"]))
    assert len(base) == 16
    same = [
        ["model=dqn", "trainer=smoke", "paths.output_dir=/elsewhere"],
        ["model=dqn", "trainer=smoke", "strategy=parallel"],
        ["model=dqn", "trainer=smoke", "logger=none"],
        ["model=dqn", "trainer=smoke", "resume=true"],
    ]
    for overrides in same:
        assert config_hash(compose_cfg(overrides)) == base, overrides
    different = [
        ["model=dqn", "trainer=smoke", "seed=7"],
        ["model=dqn", "trainer=smoke", "model.module.lr=0.01"],
        ["model=dqn", "trainer=default"],
        ["model=dqn", "trainer=smoke", "asset=nq"],
    ]
    for overrides in different:
        assert config_hash(compose_cfg(overrides)) != base, overrides


BASE = ["model=dqn", "trainer=smoke"]


@pytest.mark.parametrize(
    ("override", "same"),
    [
        # only displayed, sampled or logged: the same training
        ("callbacks.progress_bar.refresh_rate=1", True),
        ("~callbacks.progress_bar", True),
        ("trainer.log_every_n_steps=7", True),
        ("callbacks.progress.every_n_steps=3", True),
        ("callbacks.memory_budget.sample_every_n_steps=5", True),
        ("evaluation.plot_equity=false", True),
        ("model.expected_seconds_per_batch=3", True),
        ("jobs.batches_per_epoch_if_unknown=7", True),
        # what changes the result: another training
        ("trainer.max_epochs=2", False),
        ("+trainer.max_steps=5", False),
        ("trainer.limit_train_batches=9", False),
        ("trainer.limit_val_batches=3", False),
        ("execution.commission_usd=1.0", False),
        ("evaluation.max_bars=100", False),
        ("data.source.days=7", False),
        ("data.split.gap_bars=30", False),
        ("precision=bf16", False),
        ("callbacks.memory_budget.on_breach=stop", False),
    ],
)
def test_config_hash_keeps_display_and_cadence_out_and_what_changes_the_result_in(compose_cfg, override, same):
    assert (config_hash(compose_cfg([*BASE, override])) == config_hash(compose_cfg(BASE))) is same
