"""Walk-forward folds: boundaries with purge and embargo on hand-made indexes, bad settings get
their line, and a fold's normalization never sees a bar after its training window."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foxhunt.data.dataset import build_market_dataset
from foxhunt.data.features import FeatureConfig
from foxhunt.data.splits import FoldSplit, WalkForwardConfig, split_slices
from tests.evaluation.test_backtest import ES


def wf(**overrides) -> WalkForwardConfig:
    values = {"folds": 3, "window": "expanding", "train": 0.4, "val": 0.1, "test": 0.1, "purge_bars": 5,
              "embargo_bars": 7} | overrides  # fmt: skip
    return WalkForwardConfig(**values)


def bounds(fold: dict[str, slice]) -> dict[str, tuple[int, int]]:
    return {name: (s.start, s.stop) for name, s in fold.items()}


def test_expanding_folds_by_hand():
    # 1000 bars: train 400, val 100, test 100, purge 5, embargo 7. The test blocks tile the end:
    # fold 2 tests [900, 1000), fold 1 [900 - 7 - 100, 893) = [793, 893), fold 0 [686, 786).
    folds = [bounds(f) for f in wf().fold_slices(1000)]
    assert folds == [
        {"train": (0, 576), "val": (581, 681), "test": (686, 786)},
        {"train": (0, 683), "val": (688, 788), "test": (793, 893)},
        {"train": (0, 790), "val": (795, 895), "test": (900, 1000)},
    ]


def test_rolling_folds_keep_the_window_length():
    folds = [bounds(f) for f in wf(window="rolling").fold_slices(1000)]
    assert [f["train"] for f in folds] == [(176, 576), (283, 683), (390, 790)]
    assert [f["test"] for f in folds] == [(686, 786), (793, 893), (900, 1000)]


@given(
    n_bars=st.integers(300, 5000), folds=st.integers(1, 5), purge=st.integers(0, 30), embargo=st.integers(0, 30),
    window=st.sampled_from(["expanding", "rolling"]),
)  # fmt: skip
@settings(max_examples=200, deadline=None)
def test_fold_invariants(n_bars, folds, purge, embargo, window):
    cfg = wf(folds=folds, purge_bars=purge, embargo_bars=embargo, window=window, train=0.3, val=0.05, test=0.1)
    try:
        layout = cfg.fold_slices(n_bars)
    except ValueError as exc:
        assert "evaluation.walk_forward" in str(exc)
        return
    for k, fold in enumerate(layout):
        train, val, test = fold["train"], fold["val"], fold["test"]
        assert 0 <= train.start < train.stop and train.stop - train.start >= int(n_bars * 0.3)
        assert val.start - train.stop == purge and test.start - val.stop == purge  # purged on both sides
        assert test.stop <= n_bars
        if k:  # consecutive test blocks: embargo_bars apart, never overlapping
            assert test.start - layout[k - 1]["test"].stop == embargo
            assert train.stop > layout[k - 1]["train"].stop  # each fold trains on more recent bars
    assert layout[-1]["test"].stop == n_bars  # the last fold tests on the most recent bars


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"folds": 0}, r"evaluation.walk_forward.folds=0: must be an integer >= 1"),
        ({"window": "sliding"}, r"evaluation.walk_forward.window='sliding': must be one of expanding, rolling"),
        ({"test": 1.5}, r"evaluation.walk_forward.test=1.5: must be a fraction"),
        ({"purge_bars": -1}, r"evaluation.walk_forward.purge_bars=-1: must be an integer >= 0"),
        ({"folds": 6}, r"train \+ val \+ folds x test = 0.4 \+ 0.1 \+ 6 x 0.1 = 1.1 of the bars: must be <= 1"),
    ],
)
def test_bad_settings_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        wf(**overrides)


def test_too_few_bars_says_what_the_folds_need():
    with pytest.raises(ValueError, match=r"3 folds need \d+ bars .* the data has 50 after warm-up"):
        wf(purge_bars=20).fold_slices(50)


def test_fold_split_is_what_split_slices_takes():
    cfg = wf()
    assert split_slices(1000, FoldSplit(cfg, 1)) == cfg.fold_slices(1000)[1]
    with pytest.raises(ValueError, match=r"evaluation.fold=3: must be in 0..2"):
        FoldSplit(cfg, 3)


FEATURES = FeatureConfig(momentum_bars=5, volatility_bars=5, volume_bars=5)


def bars(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    close = 4800 + np.cumsum(rng.normal(0, 1, n)).round() * 0.25
    index = pd.date_range("2024-03-04 14:30", periods=n, freq="1min", tz="UTC")
    return pd.DataFrame({"open": close, "high": close + 0.5, "low": close - 0.5, "close": close,
                         "volume": rng.integers(100, 1000, n).astype(float)}, index=index)  # fmt: skip


@given(seed=st.integers(0, 2**16), fold=st.integers(0, 2), scale=st.floats(0.5, 3.0))
@settings(max_examples=25, deadline=None)
def test_fold_normalization_is_independent_of_later_bars(seed, fold, scale):
    """Changing every bar after a fold's training window (prices and volumes) leaves the fold's
    normalization statistics, its target scale and its training features as they were."""
    frame = bars(1200, seed)
    split = FoldSplit(wf(purge_bars=10, embargo_bars=10), fold)
    dataset = build_market_dataset(frame, ES, FEATURES, split)
    train_rows = len(dataset.splits["train"])
    cut = FEATURES.warmup_bars + train_rows  # first raw bar after the fold's training window
    changed = frame.copy()
    later = changed.index[cut:]
    changed.loc[later, ["open", "high", "low", "close"]] = changed.loc[later, ["open", "high", "low", "close"]] * scale
    changed.loc[later, "volume"] = changed.loc[later, "volume"][::-1].to_numpy()
    again = build_market_dataset(changed, ES, FEATURES, split)
    np.testing.assert_array_equal(again.observed_mean, dataset.observed_mean)
    np.testing.assert_array_equal(again.observed_std, dataset.observed_std)
    assert again.target_scale == dataset.target_scale
    np.testing.assert_array_equal(again.splits["train"].features, dataset.splits["train"].features)
