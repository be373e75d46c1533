"""A run's parts are built one way for every caller: the dataset on the run's own split (its
walk-forward fold, the lockbox cut off), the precision plugin holding the configured policy."""

from __future__ import annotations

import numpy as np
import pytest

from foxhunt.precision.plugin import PolicyMixedPrecision, PolicyPrecision, policy_of
from foxhunt.training.parts import MEASURE_DATA_DAYS, build_dataset, build_precision, measuring_config


def _times(dataset) -> dict[str, np.ndarray]:
    return {name: split.timestamps for name, split in dataset.splits.items()}


def test_a_fold_runs_dataset_is_its_folds_split_not_data_split(compose_cfg):
    cfg = compose_cfg(["model=tft", "evaluation.protocol=walk_forward", "data.source.days=30"])
    plain = _times(build_dataset(compose_cfg(["model=tft", "data.source.days=30"]), cached=False))
    folds = []
    for fold in (0, 1):
        cfg.evaluation.fold = fold
        folds.append(_times(build_dataset(cfg, cached=False)))
    assert not np.array_equal(folds[0]["test"], plain["test"])  # the fold's split, not data.split's
    assert folds[0]["test"][-1] < folds[1]["test"][0]  # later folds test later bars
    assert np.array_equal(folds[0]["train"], folds[1]["train"][: len(folds[0]["train"])])  # expanding window


def test_the_lockbox_is_cut_off_unless_opened(compose_cfg):
    cfg = compose_cfg(["data.source.days=30", "evaluation.holdout=0.1"])
    closed = build_dataset(cfg, cached=False)
    opened = build_dataset(cfg, open_holdout=True, cached=False)
    assert "holdout" not in closed.splits and len(opened.splits["holdout"]) > 0
    last_seen = max(split.timestamps[-1] for split in closed.splits.values())
    assert opened.splits["holdout"].timestamps[0] > last_seen  # no scored bar is a lockbox bar


@pytest.mark.parametrize(("precision", "plugin_type", "trainer_precision"),
                         [("fp32", PolicyPrecision, "32-true"), ("int8", PolicyPrecision, "32-true"),
                          ("bf16", PolicyMixedPrecision, "bf16-mixed")])  # fmt: skip
def test_the_precision_plugin_holds_the_configured_policy(compose_cfg, precision, plugin_type, trainer_precision):
    plugin = build_precision(compose_cfg([f"precision={precision}"]), accelerator="cpu")
    assert type(plugin) is plugin_type and plugin.precision == trainer_precision
    assert plugin.policy.name == precision

    class Holder:  # what policy_of reads: the Trainer's precision plugin
        precision_plugin = plugin

    assert policy_of(Holder()) is plugin.policy


def test_a_measuring_config_cuts_synthetic_days_unless_the_user_set_them(tmp_path):
    assert measuring_config("dqn", root_dir=tmp_path).data.source.days == MEASURE_DATA_DAYS
    assert measuring_config("dqn", ["data.source.days=20"], root_dir=tmp_path).data.source.days == 20
