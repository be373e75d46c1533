"""Small deterministic bars frames and assets for the data-layer tests (no data source needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from foxhunt.assets import AssetSpec

CONF_ASSET = Path(__file__).resolve().parents[2] / "conf" / "asset"


def load_asset(key: str) -> AssetSpec:
    raw = OmegaConf.to_container(OmegaConf.load(CONF_ASSET / f"{key}.yaml"))
    return AssetSpec(**{k: v for k, v in raw.items() if k != "_target_"})


def session_minutes_index(asset: AssetSpec, start: str, n: int) -> pd.DatetimeIndex:
    """The first ``n`` minutes from ``start`` (UTC) that fall inside Globex sessions of
    ``asset`` (daily break and weekend left out, so the index has real gaps)."""
    stamps = pd.date_range(start, periods=n * 3, freq="1min", tz="UTC", name="ts")
    local = stamps.tz_convert(asset.session_tz)
    minute = local.hour * 60 + local.minute
    open_min = asset.open_time.hour * 60 + asset.open_time.minute
    close_min = asset.close_time.hour * 60 + asset.close_time.minute
    in_break = (minute >= close_min) & (minute < open_min)
    weekday = local.day_of_week
    weekend = (weekday == 5) | ((weekday == 4) & (minute >= close_min))
    weekend |= (weekday == 6) & (minute < open_min)
    keep = stamps[~(in_break | weekend)]
    assert len(keep) >= n, "increase the oversampling factor"
    return keep[:n]


def make_bars(
    asset: AssetSpec,
    n: int,
    seed: int = 0,
    start: str = "2024-01-04 20:00",
    index: pd.DatetimeIndex | None = None,
) -> pd.DataFrame:
    """A bars frame (contract layout) of ``n`` 1-minute bars: a random walk on the tick grid."""
    rng = np.random.default_rng(seed)
    if index is None:
        index = session_minutes_index(asset, start, n)
    steps = rng.integers(-3, 4, size=n)
    close = asset.round_to_tick(asset.price_level + asset.tick_size * np.cumsum(steps))
    open_ = np.concatenate([[close[0]], close[:-1]])
    high = np.maximum(open_, close) + asset.tick_size * rng.integers(0, 3, size=n)
    low = np.minimum(open_, close) - asset.tick_size * rng.integers(0, 3, size=n)
    volume = rng.integers(1, 500, size=n).astype(np.float64)
    return pd.DataFrame(
        {"open": open_, "high": high, "low": low, "close": close, "volume": volume},
        index=index,
    )


def replace_after(bars: pd.DataFrame, k: int, seed: int) -> pd.DataFrame:
    """Copy of ``bars`` whose rows after position ``k`` have other prices and volumes."""
    other = make_bars_like(bars, seed)
    out = bars.copy()
    out.iloc[k + 1 :] = other.iloc[k + 1 :].to_numpy()
    return out


def make_bars_like(bars: pd.DataFrame, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n = len(bars)
    close = bars["close"].to_numpy() * np.exp(rng.normal(0.0, 0.01, size=n))
    volume = rng.integers(1, 5000, size=n).astype(np.float64)
    return pd.DataFrame(
        {"open": close, "high": close * 1.001, "low": close * 0.999, "close": close, "volume": volume},
        index=bars.index,
    )
