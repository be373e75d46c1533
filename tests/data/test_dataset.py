"""Market dataset: warm-up drop, chronological split, train-only normalization, disk cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from market_bars import load_asset, make_bars, replace_after
from omegaconf import OmegaConf

from configs import csv_source, synthetic_source
from foxhunt.data.dataset import (
    CACHE_VERSION,
    MarketDataset,
    build_market_dataset,
    cache_key,
    load_market_dataset,
)
from foxhunt.data.features import FEATURE_GROUPS, FEATURE_NAMES, compute_features

ES = load_asset("es")
FEATURES_CFG = {
    "momentum_bars": 5,
    "volatility_bars": 10,
    "volume_bars": 20,
    "rth_open": "09:30",
    "rth_close": "16:00",
    "rth_tz": "America/New_York",
}
SPLIT_CFG = {"train": 0.6, "val": 0.2, "test": 0.2, "gap_bars": 7}
N_BARS = 519  # 500 after the 19 warm-up bars
WARMUP = 19  # max(5, 10, 20 - 1)
OBSERVED = [FEATURE_NAMES.index(n) for n in FEATURE_GROUPS["observed"]]
UNSCALED = [FEATURE_NAMES.index(n) for n in FEATURE_GROUPS["static"] + FEATURE_GROUPS["known"]]


class CountingSource:
    """A data source that returns fixed bars and counts its loads."""

    def __init__(self, bars: pd.DataFrame, fingerprint: str = "bars-v1") -> None:
        self.bars = bars
        self.loads = 0
        self._fingerprint = fingerprint

    def load(self, asset):
        self.loads += 1
        return self.bars.copy()

    def fingerprint(self, asset) -> str:
        return f"{self._fingerprint}:{asset.key}"


@pytest.fixture(scope="module")
def bars() -> pd.DataFrame:
    return make_bars(ES, N_BARS, seed=11)


@pytest.fixture(scope="module")
def dataset(bars) -> MarketDataset:
    return build_market_dataset(bars, ES, FEATURES_CFG, SPLIT_CFG)


def test_layout_and_sizes(dataset, bars):
    assert dataset.asset == ES
    assert dataset.feature_names == list(FEATURE_NAMES)
    assert dataset.groups == {
        "static": [0, 1, 2, 3],
        "known": [4, 5, 6, 7, 8, 9, 10, 11],
        "observed": [12, 13, 14, 15],
    }
    # 500 rows after warm-up; usable 486: train 291, val 97, test 98
    assert {k: len(v) for k, v in dataset.splits.items()} == {"train": 291, "val": 97, "test": 98}
    for split in dataset.splits.values():
        assert split.features.dtype == np.float32 and split.features.shape[1] == 16
        assert split.close.dtype == np.float64
        assert split.timestamps.dtype == np.dtype("datetime64[ns]")
        assert np.isfinite(split.features).all()
    train = dataset.splits["train"]
    expected_first = bars.index[WARMUP].tz_convert(None).to_datetime64()
    assert train.timestamps[0] == expected_first
    np.testing.assert_array_equal(train.close, bars["close"].to_numpy()[WARMUP : WARMUP + 291])


def test_splits_chronological_with_exact_gap(dataset, bars):
    stamps = bars.index.tz_convert(None).to_numpy()
    position = {ts: i for i, ts in enumerate(stamps)}
    order = ["train", "val", "test"]
    for before, after in zip(order, order[1:]):
        last = dataset.splits[before].timestamps[-1]
        first = dataset.splits[after].timestamps[0]
        assert last < first
        assert position[first] - position[last] - 1 == SPLIT_CFG["gap_bars"]
    assert dataset.splits["test"].timestamps[-1] == stamps[-1]


def test_observed_normalized_with_train_statistics(dataset, bars):
    train = dataset.splits["train"].features[:, OBSERVED].astype(np.float64)
    np.testing.assert_allclose(train.mean(axis=0), 0.0, atol=1e-6)
    np.testing.assert_allclose(train.std(axis=0), 1.0, atol=1e-5)
    raw = compute_features(bars, ES, FEATURES_CFG).to_numpy()[WARMUP:]
    raw_train = raw[:291, OBSERVED]
    np.testing.assert_allclose(dataset.observed_mean, raw_train.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(dataset.observed_std, raw_train.std(axis=0), rtol=1e-12)
    # val rows use the same train statistics
    raw_val = raw[291 + 7 : 291 + 7 + 97, OBSERVED]
    expected_val = (raw_val - raw_train.mean(axis=0)) / raw_train.std(axis=0)
    np.testing.assert_allclose(dataset.splits["val"].features[:, OBSERVED], expected_val, rtol=1e-5, atol=1e-5)
    # static and known columns are the raw values
    np.testing.assert_array_equal(dataset.splits["train"].features[:, UNSCALED], raw[:291, UNSCALED].astype(np.float32))


def test_target_scale_is_train_std_of_one_bar_log_returns(dataset, bars):
    close = bars["close"].to_numpy()
    # train rows are bars WARMUP .. WARMUP+290; the first return reaches back one bar
    returns = np.log(close[WARMUP : WARMUP + 291] / close[WARMUP - 1 : WARMUP + 290])
    assert dataset.target_scale == pytest.approx(returns.std(), rel=1e-12)


def test_changing_val_and_test_bars_leaves_train_untouched(dataset, bars):
    last_train_bar = WARMUP + 291 - 1
    changed = build_market_dataset(replace_after(bars, last_train_bar, 5), ES, FEATURES_CFG, SPLIT_CFG)
    np.testing.assert_array_equal(changed.splits["train"].features, dataset.splits["train"].features)
    np.testing.assert_array_equal(changed.observed_mean, dataset.observed_mean)
    np.testing.assert_array_equal(changed.observed_std, dataset.observed_std)
    assert changed.target_scale == dataset.target_scale
    assert not np.array_equal(changed.splits["val"].features, dataset.splits["val"].features)
    # and changing one train bar does change the statistics
    moved = build_market_dataset(replace_after(bars, last_train_bar - 1, 5), ES, FEATURES_CFG, SPLIT_CFG)
    assert not np.array_equal(moved.observed_mean, dataset.observed_mean)


def test_constant_close_and_bad_prices_fail_clearly(bars):
    flat = bars.copy()
    flat["close"] = 4800.0
    with pytest.raises(ValueError, match="close is constant over the train split"):
        build_market_dataset(flat, ES, FEATURES_CFG, SPLIT_CFG)
    broken = bars.copy()
    broken.iloc[100, broken.columns.get_loc("close")] = -1.0
    with pytest.raises(ValueError, match=r"bars frame: close=-1\.0 at 2024-.* \(row 100\)"):
        build_market_dataset(broken, ES, FEATURES_CFG, SPLIT_CFG)


def _assert_same(a: MarketDataset, b: MarketDataset) -> None:
    assert a.feature_names == b.feature_names and a.groups == b.groups
    assert a.target_scale == b.target_scale
    np.testing.assert_array_equal(a.observed_mean, b.observed_mean)
    for name in ("train", "val", "test"):
        x, y = a.splits[name], b.splits[name]
        np.testing.assert_array_equal(x.features, y.features)
        np.testing.assert_array_equal(x.close, y.close)
        np.testing.assert_array_equal(x.timestamps, y.timestamps)
        assert x.timestamps.dtype == y.timestamps.dtype


def test_cache_hit_skips_the_source(bars, dataset, tmp_path):
    source = CountingSource(bars)
    first = load_market_dataset(source, ES, FEATURES_CFG, SPLIT_CFG, tmp_path)
    assert source.loads == 1
    _assert_same(first, dataset)
    files = list(tmp_path.iterdir())
    assert [f.name for f in files] == [f"es-{first.cache_key}.npz"]
    assert len(first.cache_key) == 64
    # second call, configs given as DictConfigs: same key, read from disk
    second = load_market_dataset(source, ES, OmegaConf.create(FEATURES_CFG), OmegaConf.create(SPLIT_CFG), str(tmp_path))
    assert source.loads == 1
    _assert_same(second, first)
    assert second.cache_key == first.cache_key
    assert second.asset == ES


@pytest.mark.parametrize(
    "change",
    [
        {"features": {"momentum_bars": 6}},
        {"split": {"gap_bars": 8}},
        {"fingerprint": "bars-v2"},
        {"asset": "nq"},
    ],
)
def test_cache_misses_on_changed_inputs(bars, tmp_path, change):
    source = CountingSource(bars)
    load_market_dataset(source, ES, FEATURES_CFG, SPLIT_CFG, tmp_path)
    features = {**FEATURES_CFG, **change.get("features", {})}
    split = {**SPLIT_CFG, **change.get("split", {})}
    asset = load_asset(change["asset"]) if "asset" in change else ES
    if "fingerprint" in change:
        source = CountingSource(bars, change["fingerprint"])
    loads_before = source.loads
    load_market_dataset(source, asset, features, split, tmp_path)
    assert source.loads == loads_before + 1
    assert len(list(tmp_path.glob("*.npz"))) == 2


def test_cache_key_covers_version_and_is_stable():
    key = cache_key("fp", ES, FEATURES_CFG, SPLIT_CFG)
    assert key == cache_key("fp", ES, OmegaConf.create(FEATURES_CFG), SPLIT_CFG)
    assert key != cache_key("fp2", ES, FEATURES_CFG, SPLIT_CFG)
    assert CACHE_VERSION


def _edited(path, value: float | None) -> None:
    """The cache's train features set to ``value`` (None: a small finite shift), the rest as written."""
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    arrays["train_features"] = arrays["train_features"] + 1e-3 if value is None else np.full_like(arrays["train_features"], value)
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)


# nan and shifted: arrays edited in place, the file still a zip with every array (a NaN crashed the environment after
# a 'cache hit', a finite edit was trained on silently; found by a helper probing the data)
@pytest.mark.parametrize("damage", ["garbage", "truncate", "empty", "nan", "shifted"])
def test_corrupt_cache_is_rebuilt(bars, dataset, tmp_path, damage):
    source = CountingSource(bars)
    first = load_market_dataset(source, ES, FEATURES_CFG, SPLIT_CFG, tmp_path)
    path = tmp_path / f"es-{first.cache_key}.npz"
    content = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"not a zip file" * 10)
    elif damage == "truncate":
        path.write_bytes(content[: len(content) // 2])
    elif damage in ("nan", "shifted"):
        _edited(path, np.nan if damage == "nan" else None)
    else:
        path.write_bytes(b"")
    rebuilt = load_market_dataset(source, ES, FEATURES_CFG, SPLIT_CFG, tmp_path)
    assert source.loads == 2
    _assert_same(rebuilt, dataset)
    assert path.stat().st_size == len(content)  # rewritten whole (zip dates may differ)
    load_market_dataset(source, ES, FEATURES_CFG, SPLIT_CFG, tmp_path)
    assert source.loads == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temp files left


def test_failed_write_leaves_no_partial_file(bars, tmp_path, monkeypatch):
    def explode(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", explode)
    with pytest.raises(OSError, match="disk full"):
        load_market_dataset(CountingSource(bars), ES, FEATURES_CFG, SPLIT_CFG, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_no_cache_dir_means_no_cache(bars):
    source = CountingSource(bars)
    load_market_dataset(source, ES, FEATURES_CFG, SPLIT_CFG, None)
    load_market_dataset(source, ES, FEATURES_CFG, SPLIT_CFG, None)
    assert source.loads == 2


def test_synthetic_source_end_to_end_with_cache(tmp_path, monkeypatch):
    from foxhunt.data.sources.synthetic import SyntheticBarSource

    source = synthetic_source(days=5, seed=0)
    first = load_market_dataset(source, ES, FEATURES_CFG, SPLIT_CFG, tmp_path)
    bars = source.load(ES)
    assert sum(len(s) for s in first.splits.values()) == len(bars) - WARMUP - 2 * 7
    # a second call reads the cache: the source's load is not called again
    monkeypatch.setattr(SyntheticBarSource, "load", lambda self, asset: pytest.fail("loaded"))
    second = load_market_dataset(source, ES, FEATURES_CFG, SPLIT_CFG, tmp_path)
    _assert_same(second, first)
    assert second.cache_key != cache_key(synthetic_source(days=5, seed=1).fingerprint(ES), ES, FEATURES_CFG, SPLIT_CFG)


@pytest.mark.realdata
def test_real_6e_minute_bars(real_data_dir, tmp_path):

    asset = load_asset("6e")
    source = csv_source(str(real_data_dir / "6e_minute"))
    dataset = load_market_dataset(source, asset, FEATURES_CFG, SPLIT_CFG, tmp_path)
    rows = 29_996 - WARMUP
    usable = rows - 2 * 7
    assert len(dataset.splits["train"]) == int(usable * 0.6)
    assert sum(len(s) for s in dataset.splits.values()) == usable
    train = dataset.splits["train"].features[:, OBSERVED].astype(np.float64)
    np.testing.assert_allclose(train.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(train.std(axis=0), 1.0, atol=1e-4)
    # one-minute 6E returns: a fraction of a basis point to a few basis points
    assert 1e-5 < dataset.target_scale < 1e-3
    known = np.concatenate([s.features[:, 4:12] for s in dataset.splits.values()])
    assert known.min() >= -1.0 and known.max() <= 1.0
    regular = known[:, FEATURE_NAMES.index("regular_hours") - 4]
    assert 0.2 < regular.mean() < 0.45  # 6.5 of 23 session hours, busier bars
    # the bar starting 2024-01-02 14:30 UTC (08:30 CT) sits 930 minutes into the session
    stamps = np.concatenate([s.timestamps for s in dataset.splits.values()])
    row = int(np.searchsorted(stamps, np.datetime64("2024-01-02T14:30", "ns")))
    assert stamps[row] == np.datetime64("2024-01-02T14:30", "ns")
    assert known[row, FEATURE_NAMES.index("session_elapsed") - 4] == pytest.approx(930 / 1380)


def test_accepts_the_pipeline_config_of_conf(bars, tmp_path):
    conf = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf/data/pipeline/default.yaml")
    source = CountingSource(bars)
    dataset = load_market_dataset(source, ES, conf.features, conf.split, tmp_path)
    warmup = max(conf.features.momentum_bars, conf.features.volatility_bars, conf.features.volume_bars - 1)
    usable = N_BARS - warmup - 2 * conf.split.gap_bars
    assert len(dataset.splits["train"]) == int(usable * conf.split.train)
    assert sum(len(s) for s in dataset.splits.values()) == usable
