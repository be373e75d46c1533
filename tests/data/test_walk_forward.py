"""Walk-forward folds: boundaries with purges on hand-made indexes, no validation bar is ever a
test bar of the cell, the lockbox is cut off before the folds, bad settings get their line, and a
fold's normalization never sees a bar after its training window."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.evaluation.test_backtest import ES

from foxhunt.data.dataset import build_market_dataset
from foxhunt.data.features import FeatureConfig
from foxhunt.data.splits import FoldSplit, WalkForwardConfig, split_slices


def wf(**overrides) -> WalkForwardConfig:
    values = {"folds": 3, "window": "expanding", "train": 0.3, "val": 0.05, "test": 0.1, "purge_bars": 5} | overrides
    return WalkForwardConfig(**values)


def bounds(fold: dict[str, slice]) -> dict[str, tuple[int, int]]:
    return {name: (s.start, s.stop) for name, s in fold.items()}


def test_expanding_folds_by_hand():
    # 1000 bars: val 50, test 100, purge 5: each fold's segment [p][val][p][test] is 160 bars and
    # the three segments tile the end: [520, 680), [680, 840), [840, 1000). Fold k trains on
    # everything before its segment (the earlier folds' test blocks included).
    folds = [bounds(f) for f in wf().fold_slices(1000)]
    assert folds == [
        {"train": (0, 520), "val": (525, 575), "test": (580, 680)},
        {"train": (0, 680), "val": (685, 735), "test": (740, 840)},
        {"train": (0, 840), "val": (845, 895), "test": (900, 1000)},
    ]


def test_rolling_folds_keep_the_window_length():
    folds = [bounds(f) for f in wf(window="rolling").fold_slices(1000)]
    assert [f["train"] for f in folds] == [(220, 520), (380, 680), (540, 840)]
    assert [f["test"] for f in folds] == [(580, 680), (740, 840), (900, 1000)]


@given(
    n_bars=st.integers(300, 5000), folds=st.integers(1, 5), purge=st.integers(0, 30),
    window=st.sampled_from(["expanding", "rolling"]),
)  # fmt: skip
@settings(max_examples=200, deadline=None)
def test_fold_invariants(n_bars, folds, purge, window):
    cfg = wf(folds=folds, purge_bars=purge, window=window, train=0.2, val=0.05, test=0.1)
    try:
        layout = cfg.fold_slices(n_bars)
    except ValueError as exc:
        assert "evaluation.walk_forward" in str(exc)
        return
    tested = set().union(*(range(f["test"].start, f["test"].stop) for f in layout))
    for k, fold in enumerate(layout):
        train, val, test = fold["train"], fold["val"], fold["test"]
        assert 0 <= train.start < train.stop and train.stop - train.start >= int(n_bars * 0.2)
        assert val.start - train.stop == purge and test.start - val.stop == purge  # purged on both sides
        assert train.stop <= val.start < val.stop <= test.start < test.stop <= n_bars
        assert tested.isdisjoint(range(val.start, val.stop))  # no bar the cell reports as test selects
        if k:  # a fold trains on every bar before its own segment: the earlier folds' too
            assert train.stop == layout[k - 1]["test"].stop
    assert layout[-1]["test"].stop == n_bars  # the last fold tests on the most recent bars


@given(n_bars=st.integers(400, 5000), holdout=st.floats(0.01, 0.3), fold=st.integers(0, 2))
@settings(max_examples=100, deadline=None)
def test_the_lockbox_is_cut_off_before_every_split_and_opened_only_on_request(n_bars, holdout, fold):
    cfg = wf(train=0.2)
    n_holdout = int(n_bars * holdout)
    try:
        closed = split_slices(n_bars, FoldSplit(cfg, fold, holdout=holdout))
    except ValueError as exc:
        assert "evaluation." in str(exc)
        return
    assert set(closed) == {"train", "val", "test"}
    assert max(s.stop for s in closed.values()) <= n_bars - n_holdout - cfg.purge_bars  # a purge before the lockbox
    assert closed == split_slices(n_bars - n_holdout - cfg.purge_bars, FoldSplit(cfg, fold))  # folds over the bars before it
    opened = split_slices(n_bars, FoldSplit(cfg, fold, holdout=holdout, open_holdout=True))
    assert opened["holdout"] == slice(n_bars - n_holdout, n_bars) and {k: opened[k] for k in closed} == closed
    single = {"train": 0.7, "val": 0.15, "test": 0.15, "gap_bars": 10}
    plain = split_slices(n_bars, {**single, "holdout": holdout})
    assert max(s.stop for s in plain.values()) <= n_bars - n_holdout - 10 and "holdout" not in plain


def test_opening_a_lockbox_that_is_not_there_is_refused():
    with pytest.raises(ValueError, match="evaluation.holdout=null: the run keeps no lockbox to open"):
        split_slices(1000, FoldSplit(wf(), 0, open_holdout=True))
    with pytest.raises(ValueError, match=r"evaluation.holdout=1.5: must be a fraction of the bars in \[0, 1\)"):
        FoldSplit(wf(), 0, holdout=1.5)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"folds": 0}, r"evaluation.walk_forward.folds=0: must be an integer >= 1"),
        ({"window": "sliding"}, r"evaluation.walk_forward.window='sliding': must be one of expanding, rolling"),
        ({"test": 1.5}, r"evaluation.walk_forward.test=1.5: must be a fraction"),
        ({"purge_bars": -1}, r"evaluation.walk_forward.purge_bars=-1: must be an integer >= 0"),
        ({"folds": 5}, r"train \+ folds x \(val \+ test\) = 0.3 \+ 5 x \(0.05 \+ 0.1\) = 1.05 of the bars: must be <= 1"),
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
    split = FoldSplit(wf(purge_bars=10), fold)
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


def test_no_bar_a_default_walk_forward_cell_reports_as_test_is_a_validation_bar(compose_cfg):
    """The default walk-forward of a forecaster cell, built as its folds' runs build it: the
    pooled validation blocks (what sweeps, searches and register select on) and the pooled test
    blocks share no bar, and every purge covers the TFT's horizon."""
    from hydra.utils import instantiate

    from foxhunt.data.dataset import load_market_dataset
    from foxhunt.training.parts import run_split

    cfg = compose_cfg(["model=tft", "evaluation.protocol=walk_forward", "data.source.days=30"])
    asset, source = instantiate(cfg.asset), instantiate(cfg.data.source)
    val, test = set(), set()
    for fold in range(cfg.evaluation.walk_forward.folds):
        cfg.evaluation.fold = fold
        dataset = load_market_dataset(source, asset, cfg.data.features, run_split(cfg), None)
        val |= set(dataset.splits["val"].timestamps.tolist())
        test |= set(dataset.splits["test"].timestamps.tolist())
        assert dataset.splits["train"].timestamps[-1] < dataset.splits["val"].timestamps[0]
    assert val and test and val.isdisjoint(test)
    assert cfg.evaluation.walk_forward.purge_bars >= cfg.model.window.horizon
