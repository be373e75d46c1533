"""The market dataset every model trains on: features, close prices and timestamps per split.

:func:`load_market_dataset` runs the data pipeline for one asset:

1. ``source.load(asset)`` -> 1-minute bars frame (UTC index, OHLCV; a source that rolls
   contracts adds ``raw_close`` and ``roll_price``, :mod:`foxhunt.data.roll`);
2. :func:`foxhunt.data.features.compute_features` -> 16 feature columns, read from the
   (back-adjusted) OHLCV; the splits keep the raw close and the roll prices, which the
   backtest and the env trade;
3. drop the warm-up rows (trailing windows not yet full, hence NaN);
4. :func:`foxhunt.data.splits.split_slices` -> chronological train / val / test with gaps, laid
   out before the lockbox (``evaluation.holdout``: a split ``holdout`` only when it is opened);
5. z-normalize the observed group with the mean and std of the TRAIN split only (static and
   known columns are already bounded and stay as they are);
6. ``target_scale`` = std of the raw 1-bar log return over the train split (forecast targets
   are divided by it).

The result is cached on disk as one ``.npz`` file per input combination: the file name holds a
SHA-256 of the source fingerprint, the asset spec, the feature and split configs and
:data:`CACHE_VERSION`, so any change to one of them is a miss. Files are written to a temporary
name and renamed with ``os.replace`` (atomic), so a crash never leaves a half-written cache; a
file that cannot be read, or whose stored key or shapes disagree, is ignored and rebuilt.
The cache is written by hand with numpy rather than a caching library: the payload is a few
plain arrays and the key must cover exactly these inputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from foxhunt.assets import AssetSpec
from foxhunt.data.features import (
    FEATURE_GROUPS,
    FEATURE_NAMES,
    FeatureConfig,
    compute_features,
)
from foxhunt.data.roll import RAW_CLOSE, ROLL_PRICE
from foxhunt.data.splits import as_split, split_slices

log = logging.getLogger(__name__)

# Bump when the features, the normalization or the cache layout change: old files then miss.
CACHE_VERSION = "market-dataset-3"  # 2: raw close, roll prices and the rolls; 3: the walk-forward layout, the lockbox
RETURN_FEATURE = "log_return"  # observed column whose train std is the target scale
MANIFEST_VERSION = 2  # layout of MarketDataset.manifest() (dataset.json of a run)
DATASET_FILE = "dataset.json"  # the manifest, in a run's folder, its artifacts and a member's files
_CACHE_READ_ERRORS = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)


@dataclass
class SplitArrays:
    """One split: ``timestamps`` (datetime64[ns], UTC, bar start), ``features`` (float32,
    T x 16, normalized), ``close`` (float64, T: the raw close of the contract held) and
    ``roll_price`` (float64, T: on a roll bar the new contract's price at the previous bar,
    NaN elsewhere; None for a source that never rolls)."""

    timestamps: np.ndarray
    features: np.ndarray
    close: np.ndarray
    roll_price: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.close)

    def head(self, bars: int) -> SplitArrays:
        """The first ``bars`` bars."""
        roll = None if self.roll_price is None else self.roll_price[:bars]
        return SplitArrays(self.timestamps[:bars], self.features[:bars], self.close[:bars], roll)


@dataclass
class MarketDataset:
    """Features of one asset split chronologically, ready for the datamodules.

    ``groups`` maps ``static`` / ``known`` / ``observed`` to column indices of ``features``.
    ``observed_mean`` / ``observed_std`` are the train statistics the observed group was
    normalized with (raw = normalized * std + mean); ``cache_key`` the SHA-256 of the inputs;
    ``feature_config`` the feature settings the columns were computed with (the forecasters'
    future calendar and the streaming pipeline compute more calendar rows with it).
    """

    asset: AssetSpec
    feature_names: list[str]
    groups: dict[str, list[int]]
    splits: dict[str, SplitArrays]
    target_scale: float
    observed_mean: np.ndarray | None = None
    observed_std: np.ndarray | None = None
    cache_key: str = ""
    feature_config: FeatureConfig | None = None
    rolls: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def manifest(self) -> dict[str, Any]:
        """The dataset's manifest (``dataset.json``): what a trained model needs of this dataset to
        read new bars (JSON-ready): the feature names, groups and settings, the observed group's
        train statistics, the target scale, the asset spec, the cache key (a digest of the
        inputs), the splits' extents and the rolls."""
        return {
            "version": MANIFEST_VERSION,
            "feature_names": list(self.feature_names),
            "groups": {g: list(map(int, idx)) for g, idx in self.groups.items()},
            "feature_config": None if self.feature_config is None else dataclasses.asdict(self.feature_config),
            "observed_mean": [float(v) for v in np.asarray(self.observed_mean)],
            "observed_std": [float(v) for v in np.asarray(self.observed_std)],
            "target_scale": float(self.target_scale),
            "asset": dataclasses.asdict(self.asset),
            "cache_key": self.cache_key,
            "splits": {name: _extent(arrays) for name, arrays in self.splits.items()},
            "rolls": list(self.rolls),
        }

    def split(self, name: str) -> SplitArrays:
        if name not in self.splits:
            raise KeyError(f"split {name!r}: unknown (have {', '.join(self.splits)})")
        return self.splits[name]


def load_market_dataset(
    source: Any,
    asset: AssetSpec,
    features_cfg: Any,
    split_cfg: Any,
    cache_dir: str | os.PathLike | None,
) -> MarketDataset:
    """Build (or read from ``cache_dir``) the market dataset of ``asset`` from ``source``.

    ``features_cfg`` / ``split_cfg``: mappings, DictConfigs or the config dataclasses
    (:class:`FeatureConfig`, :class:`SplitConfig`), or a walk-forward fold
    (:class:`foxhunt.data.splits.FoldSplit`: its blocks, normalized with its own training
    window's statistics). ``cache_dir=None`` disables the cache.
    """
    features_cfg = FeatureConfig.from_config(features_cfg)
    split_cfg = as_split(split_cfg)
    key = cache_key(source.fingerprint(asset), asset, features_cfg, split_cfg)
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"{asset.key}-{key}.npz"
        cached = _read_cache(path, asset, key)
        if cached is not None:
            cached.feature_config = features_cfg
            log.info("market dataset %s: cache hit %s", asset.key, path)
            return cached
    dataset = build_market_dataset(source.load(asset), asset, features_cfg, split_cfg)
    dataset.cache_key = key
    if path is not None:
        _write_cache(path, dataset)
        log.info("market dataset %s: cached to %s", asset.key, path)
    return dataset


def build_market_dataset(bars: pd.DataFrame, asset: AssetSpec, features_cfg: Any, split_cfg: Any) -> MarketDataset:
    """Features, split and train normalization of a bars frame (no cache)."""
    features_cfg = FeatureConfig.from_config(features_cfg)
    features = compute_features(bars, asset, features_cfg)
    features = features.iloc[features_cfg.warmup_bars :]
    _check_finite(features)
    values = features.to_numpy(dtype=np.float64, copy=True)
    warm = features_cfg.warmup_bars
    close = bars[RAW_CLOSE if RAW_CLOSE in bars else "close"].to_numpy(dtype=np.float64, copy=True)[warm:]
    roll_price = bars[ROLL_PRICE].to_numpy(dtype=np.float64, copy=True)[warm:] if ROLL_PRICE in bars else None
    timestamps = _utc_datetime64(features.index)

    slices = split_slices(len(values), split_cfg)
    groups = feature_groups()
    observed = groups["observed"]
    train = values[slices["train"]]
    mean = train[:, observed].mean(axis=0)
    std = train[:, observed].std(axis=0)
    std = np.where(std > 0, std, 1.0)  # a constant column stays 0 instead of dividing by 0
    target_scale = float(train[:, FEATURE_NAMES.index(RETURN_FEATURE)].std())
    if not target_scale > 0:
        raise ValueError(
            f"asset {asset.key}: close is constant over the train split ({len(train)} bars); cannot scale forecast targets"
        )
    values[:, observed] = (values[:, observed] - mean) / std
    values = values.astype(np.float32)

    splits = {
        name: SplitArrays(
            timestamps=timestamps[s].copy(),
            features=values[s].copy(),
            close=close[s].copy(),
            roll_price=None if roll_price is None else roll_price[s].copy(),
        )
        for name, s in slices.items()
    }
    return MarketDataset(
        asset=asset,
        feature_names=list(FEATURE_NAMES),
        groups=groups,
        splits=splits,
        target_scale=target_scale,
        observed_mean=mean,
        observed_std=std,
        feature_config=features_cfg,
        rolls=list(bars.attrs.get("rolls", [])),
    )


def _extent(arrays: SplitArrays) -> dict[str, Any]:
    """A split's rows and its first and last bar (ISO, UTC)."""
    if not len(arrays):
        return {"rows": 0}
    first, last = np.datetime_as_string(arrays.timestamps[[0, -1]], unit="s")
    return {"rows": len(arrays), "first_bar": f"{first}Z", "last_bar": f"{last}Z"}


def feature_groups() -> dict[str, list[int]]:
    """Column indices of each feature group in ``FEATURE_NAMES`` order."""
    return {g: [FEATURE_NAMES.index(n) for n in names] for g, names in FEATURE_GROUPS.items()}


def cache_key(fingerprint: str, asset: AssetSpec, features_cfg: Any, split_cfg: Any) -> str:
    """SHA-256 (hex) of everything the cached dataset depends on."""
    payload = {
        "version": CACHE_VERSION,
        "source": str(fingerprint),
        "asset": dataclasses.asdict(asset),
        "features": dataclasses.asdict(FeatureConfig.from_config(features_cfg)),
        "split": dataclasses.asdict(as_split(split_cfg)),
    }
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _check_finite(features: pd.DataFrame) -> None:
    bad = ~np.isfinite(features.to_numpy(dtype=np.float64))
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise ValueError(
            f"features: non-finite {features.columns[col]} at {features.index[row]} (bad close or volume in the bars?)"
        )


def _utc_datetime64(index: pd.DatetimeIndex) -> np.ndarray:
    return index.tz_convert("UTC").tz_localize(None).to_numpy().astype("datetime64[ns]")


def _write_cache(path: Path, dataset: MarketDataset) -> None:
    arrays: dict[str, np.ndarray] = {
        "cache_key": np.array(dataset.cache_key),
        "feature_names": np.array(dataset.feature_names),
        "target_scale": np.array(dataset.target_scale, dtype=np.float64),
        "observed_mean": np.asarray(dataset.observed_mean, dtype=np.float64),
        "observed_std": np.asarray(dataset.observed_std, dtype=np.float64),
    }
    for group, indices in dataset.groups.items():
        arrays[f"group_{group}"] = np.asarray(indices, dtype=np.int64)
    for name, split in dataset.splits.items():
        arrays[f"{name}_timestamps"] = split.timestamps.astype("datetime64[ns]").view(np.int64)
        arrays[f"{name}_features"] = split.features
        arrays[f"{name}_close"] = split.close
        if split.roll_price is not None:
            arrays[f"{name}_roll_price"] = split.roll_price
    arrays["rolls"] = np.array(json.dumps(dataset.rolls))
    arrays["split_names"] = np.array(list(dataset.splits))
    arrays[CONTENT_KEY] = np.array(_content_sha256(arrays))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise OSError(f"cache_dir={str(path.parent)!r}: cannot write the cache ({err})") from err
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, allow_pickle=True, **arrays)  # named: numpy's stubs would read the ** as allow_pickle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


CONTENT_KEY = "content_sha256"  # the cache file's own digest of every array it holds


def _content_sha256(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 of ``arrays`` (names, dtypes, shapes and bytes, in name order): a cache file read
    back is used only when its arrays are the ones written. Its key names the inputs; an array
    edited in place (NaN features crashed the environment, a finite edit was trained on; found
    by a helper probing the data) no longer matches and the dataset is rebuilt. A digest an
    editor recomputes is not caught: a cache folder is as trusted as the data folder beside it."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _read_cache(path: Path, asset: AssetSpec, key: str) -> MarketDataset | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            if str(data["cache_key"]) != key:
                raise ValueError("stored key differs")
            stored = {name: data[name] for name in data.files if name != CONTENT_KEY}
            if CONTENT_KEY not in data.files or str(data[CONTENT_KEY]) != _content_sha256(stored):
                raise ValueError("its content is not what was written (no digest, or another one)")
            names = [str(n) for n in data["feature_names"]]
            if names != list(FEATURE_NAMES):
                raise ValueError("feature names differ")
            splits = {}
            for name in (str(n) for n in data["split_names"]):
                stamps = data[f"{name}_timestamps"].view("datetime64[ns]")
                features = data[f"{name}_features"]
                close = data[f"{name}_close"]
                roll = data[f"{name}_roll_price"] if f"{name}_roll_price" in data else None
                if features.shape != (len(stamps), len(names)) or close.shape != stamps.shape:
                    raise ValueError(f"{name} shapes disagree")
                if roll is not None and roll.shape != stamps.shape:
                    raise ValueError(f"{name} roll prices disagree")
                splits[name] = SplitArrays(timestamps=stamps, features=features, close=close, roll_price=roll)
            dataset = MarketDataset(
                asset=asset,
                feature_names=names,
                groups={g: data[f"group_{g}"].tolist() for g in FEATURE_GROUPS},
                splits=splits,
                target_scale=float(data["target_scale"]),
                observed_mean=data["observed_mean"],
                observed_std=data["observed_std"],
                cache_key=key,
                rolls=json.loads(str(data["rolls"])),
            )
    except _CACHE_READ_ERRORS as err:
        log.warning("market dataset cache %s unreadable (%s): rebuilding", path, err)
        return None
    return dataset
