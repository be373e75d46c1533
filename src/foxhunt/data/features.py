"""Per-bar features of a bars frame: 16 columns in three groups (static, known, observed).

The groups follow the Temporal Fusion Transformer's split of inputs, which every model reads:

* ``static`` (4): contract attributes, one constant per asset, pre-scaled to order one so they
  need no normalization.
* ``known`` (8): calendar features, known in advance for any future bar, bounded in [-1, 1]
  or [0, 1]; clock features in the exchange's time zone (``asset.session_tz``); the session
  features (elapsed, remaining, week elapsed) from the actual session of each bar in the
  asset's exchange calendar (:mod:`foxhunt.data.calendar`: a holiday has none, an early
  close shortens its session; in closed time the last session reads as over); the
  regular-trading-hours flag uses its own hours and zone (default: the US cash-equity
  session, 09:30-16:00 New York time, whatever the contract).
* ``observed`` (4): market features from past prices and volume. They are returned raw here;
  :mod:`foxhunt.data.dataset` z-normalizes them with train-split statistics.

Known features of the FUTURE (the forecasters' decoder inputs, :func:`future_known_features`)
are those of the next clock minutes after a bar (``t + k`` bar intervals, ``k = 1 .. horizon``),
never of the bars that actually come next: whether a next bar exists, and when (after a quiet
minute, a session break, a weekend), is not known in advance, and a live stream that scores each
bar as it arrives cannot see it.

No look-ahead: the feature row of bar ``t`` uses bars ``<= t`` only (rolling windows are
trailing, returns look backwards). Windows count BARS, not minutes: a bars frame has no row for
a minute without trade, a session break or a weekend, and the return of the first bar after such
a gap is taken over the gap (from the last bar before it). That keeps the return series
gap-free and sums to the true price change, at the cost of one larger return per gap; the
``session_elapsed`` feature tells the models where these bars are.

Written with numpy/pandas rather than a feature library: the 16 columns are simple, must be
exactly reproducible for the cache key, and the session arithmetic (Globex sessions open the
evening before the trade date) is specific to futures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import time
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

from foxhunt.assets import AssetSpec
from foxhunt.config.sections import dataclass_values
from foxhunt.data.bars import BAR_COLUMNS, bad_volume_mask
from foxhunt.data.calendar import calendar_for

MINUTES_PER_DAY = 24 * 60
DAYS_PER_WEEK = 7
TRADE_DATES_PER_WEEK = 5  # Monday to Friday trade dates
EPOCH_WEEKDAY = 3  # 1970-01-01 was a Thursday (Monday = 0)
BASIS_POINTS = 1e4
PERCENT = 100.0
#: Every source yields 1-minute bars: the step of the future calendar (decoder inputs).
BAR_INTERVAL = np.timedelta64(60, "s")


FEATURE_GROUPS: dict[str, tuple[str, ...]] = {
    "static": (
        "tick_size_bps",  # tick_size / price_level, in basis points
        "log10_tick_value",  # log10 of the USD value of one tick
        "daily_vol_pct",  # typical daily return volatility, in percent
        "session_hours_frac",  # length of the Globex session / 24 h
    ),
    "known": (
        "minute_of_day_sin",  # sin(2 pi m / 1440), m = local minute of day (exchange zone)
        "minute_of_day_cos",  # cos(2 pi m / 1440)
        "day_of_week_sin",  # sin(2 pi d / 7), d = local weekday, Monday = 0
        "day_of_week_cos",  # cos(2 pi d / 7)
        "session_elapsed",  # time since the session open / session length, in [0, 1] (calendar's session)
        "session_remaining",  # time to the session close / session length, in [0, 1] (early closes shorten it)
        "regular_hours",  # 1.0 inside the regular (day) trading hours on a weekday, else 0.0
        "week_elapsed",  # (trade-date weekday + session_elapsed) / 5, in [0, 1]
    ),
    "observed": (
        "log_return",  # log(close_t / close_{t-1}), over gaps
        "momentum",  # log(close_t / close_{t-momentum_bars})
        "realized_vol",  # sqrt(mean of log_return^2 over the last volatility_bars bars)
        "log_volume_ratio",  # log((1 + v_t) / (1 + mean of v over the last volume_bars bars))
    ),
}
FEATURE_NAMES: tuple[str, ...] = tuple(n for names in FEATURE_GROUPS.values() for n in names)


# The regular-hours flag marks the US cash-equity session (NYSE / Nasdaq, 09:30-16:00 New York
# time): the busiest hours of all four contracts. A market fact, overridable per config.
US_CASH_SESSION_OPEN = "09:30"
US_CASH_SESSION_CLOSE = "16:00"
US_CASH_SESSION_TZ = "America/New_York"


@dataclass(frozen=True)
class FeatureConfig:
    """Tunables of the features (Hydra node ``data.features``).

    momentum_bars: bars back for the momentum log return.
    volatility_bars: trailing bars of 1-bar log returns in the realized volatility.
    volume_bars: trailing bars of volume in the mean the current volume is compared to.
    rth_open / rth_close: regular trading hours, "HH:MM" local to ``rth_tz`` (open inclusive,
        close exclusive); default the US cash-equity session 09:30-16:00 New York time.
    rth_tz: IANA zone of rth_open / rth_close.
    """

    momentum_bars: int
    volatility_bars: int
    volume_bars: int
    rth_open: str = US_CASH_SESSION_OPEN
    rth_close: str = US_CASH_SESSION_CLOSE
    rth_tz: str = US_CASH_SESSION_TZ

    def __post_init__(self) -> None:
        for name in ("momentum_bars", "volatility_bars", "volume_bars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"features.{name}={value!r}: must be an integer >= 1")
        parse_hhmm(self.rth_open, "features.rth_open")
        parse_hhmm(self.rth_close, "features.rth_close")
        try:
            ZoneInfo(self.rth_tz)
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"features.rth_tz={self.rth_tz!r}: unknown IANA time zone") from None

    @property
    def warmup_bars(self) -> int:
        """Leading rows whose observed features are undefined (NaN)."""
        return max(self.momentum_bars, self.volatility_bars, self.volume_bars - 1)

    @classmethod
    def from_config(cls, cfg: Any) -> FeatureConfig:
        """Build from a FeatureConfig, a dataclass, a mapping or an OmegaConf DictConfig."""
        return cls(**dataclass_values(cls, cfg, "features"))


def compute_features(bars: pd.DataFrame, asset: AssetSpec, cfg: Any) -> pd.DataFrame:
    """The 16 feature columns (``FEATURE_NAMES`` order) of a bars frame, float64, same index.

    ``cfg`` is a :class:`FeatureConfig` or anything :meth:`FeatureConfig.from_config` takes.
    The first ``cfg.warmup_bars`` rows have NaN observed features (trailing windows not full).
    """
    cfg = FeatureConfig.from_config(cfg)
    _check_bars(bars)
    index = bars.index
    columns = {}
    columns.update(_static_features(asset, len(index)))
    columns.update(_known_features(index, asset, cfg))
    columns.update(_observed_features(bars, cfg))
    return pd.DataFrame(columns, index=index, columns=list(FEATURE_NAMES), dtype=np.float64)


def known_features(index: pd.DatetimeIndex, asset: AssetSpec, cfg: Any) -> np.ndarray:
    """The 8 ``known`` (calendar) columns of any timestamps (UTC DatetimeIndex), float64 (N, 8)."""
    cfg = FeatureConfig.from_config(cfg)
    columns = _known_features(index, asset, cfg)
    return np.stack([columns[name] for name in FEATURE_GROUPS["known"]], axis=1)


def future_known_features(timestamps: np.ndarray, horizon: int, asset: AssetSpec, cfg: Any) -> np.ndarray:
    """(T, horizon, 8) float32: the known features of the clock minutes ``t + k`` bar intervals
    (``k = 1 .. horizon``) after each bar start ``t`` of ``timestamps`` (datetime64, UTC)."""
    stamps = np.asarray(timestamps, dtype="datetime64[ns]")
    steps = np.arange(1, horizon + 1) * BAR_INTERVAL
    future = (stamps[:, None] + steps[None, :]).reshape(-1)
    index = pd.DatetimeIndex(future).tz_localize("UTC")
    return known_features(index, asset, cfg).astype(np.float32).reshape(len(stamps), horizon, -1)


def static_features(asset: AssetSpec) -> np.ndarray:
    """The 4 ``static`` columns of ``asset`` (constant per contract), float64 (4,)."""
    columns = _static_features(asset, 1)
    return np.array([columns[name][0] for name in FEATURE_GROUPS["static"]], dtype=np.float64)


def _static_features(asset: AssetSpec, n: int) -> dict[str, np.ndarray]:
    values = {
        "tick_size_bps": asset.tick_size / asset.price_level * BASIS_POINTS,
        "log10_tick_value": math.log10(asset.tick_value),
        "daily_vol_pct": asset.daily_vol * PERCENT,
        "session_hours_frac": session_length(asset) / MINUTES_PER_DAY,
    }
    return {name: np.full(n, value, dtype=np.float64) for name, value in values.items()}


def _known_features(index: pd.DatetimeIndex, asset: AssetSpec, cfg: FeatureConfig) -> dict:
    local = index.tz_convert(asset.session_tz)
    minute = _minute_of_day(local)
    weekday = local.day_of_week.to_numpy().astype(np.float64)

    # The session of each timestamp from the asset's exchange calendar: the one it lies in, or,
    # in closed time (daily break, weekend, holiday, after an early close), the one that ended
    # last, which then reads as over (elapsed 1, remaining 0).
    session = calendar_for(asset).session_of(index)
    stamps = index.as_unit("ns").asi8
    length = session["close"] - session["open"]
    inside = session["inside"]
    elapsed = np.where(inside, np.clip((stamps - session["open"]) / length, 0.0, 1.0), 1.0)
    remaining = np.where(inside, np.clip((session["close"] - stamps) / length, 0.0, 1.0), 0.0)
    trade_weekday = trade_weekdays(session["date"])
    week_elapsed = np.clip((trade_weekday + elapsed) / TRADE_DATES_PER_WEEK, 0.0, 1.0)

    rth_local = index.tz_convert(cfg.rth_tz)
    rth_minute = _minute_of_day(rth_local)
    rth_open = clock_minutes(parse_hhmm(cfg.rth_open, "features.rth_open"))
    rth_close = clock_minutes(parse_hhmm(cfg.rth_close, "features.rth_close"))
    weekday_rth = rth_local.day_of_week.to_numpy() < TRADE_DATES_PER_WEEK
    regular = (rth_minute >= rth_open) & (rth_minute < rth_close) & weekday_rth

    day_angle = 2.0 * np.pi * minute / MINUTES_PER_DAY
    week_angle = 2.0 * np.pi * weekday / DAYS_PER_WEEK
    return {
        "minute_of_day_sin": np.sin(day_angle),
        "minute_of_day_cos": np.cos(day_angle),
        "day_of_week_sin": np.sin(week_angle),
        "day_of_week_cos": np.cos(week_angle),
        "session_elapsed": elapsed,
        "session_remaining": remaining,
        "regular_hours": regular.astype(np.float64),
        "week_elapsed": week_elapsed,
    }


def _observed_features(bars: pd.DataFrame, cfg: FeatureConfig) -> dict[str, np.ndarray]:
    log_close = pd.Series(np.log(bars["close"].to_numpy(dtype=np.float64)))
    log_return = log_close.diff()
    momentum = log_close - log_close.shift(cfg.momentum_bars)
    window = cfg.volatility_bars
    mean_square = (log_return**2).rolling(window, min_periods=window).mean()
    # Rolling sums can round a zero mean to a tiny negative number: clip before the root.
    realized_vol = np.sqrt(mean_square.clip(lower=0.0))
    volume = pd.Series(bars["volume"].to_numpy(dtype=np.float64))
    window = cfg.volume_bars
    mean_volume = volume.rolling(window, min_periods=window).mean()
    log_volume_ratio = np.log1p(volume) - np.log1p(mean_volume)
    return {
        "log_return": log_return.to_numpy(),
        "momentum": momentum.to_numpy(),
        "realized_vol": realized_vol.to_numpy(),
        "log_volume_ratio": log_volume_ratio.to_numpy(),
    }


def _check_bars(bars: pd.DataFrame) -> None:
    missing = [c for c in BAR_COLUMNS if c not in bars.columns]
    if missing:
        raise ValueError(f"bars frame: missing columns {missing} (need {list(BAR_COLUMNS)})")
    index = bars.index
    if not isinstance(index, pd.DatetimeIndex) or index.tz is None:
        raise ValueError("bars frame: index must be a time-zone aware (UTC) DatetimeIndex")
    if not index.is_monotonic_increasing or not index.is_unique:
        raise ValueError("bars frame: index must be strictly increasing (sorted, no duplicates)")
    close = bars["close"].to_numpy(dtype=np.float64)
    volume = bars["volume"].to_numpy(dtype=np.float64)
    checks = (
        ("close", close, np.isfinite(close) & (close > 0), "> 0"),
        ("volume", volume, ~bad_volume_mask(volume), "a whole count of contracts (foxhunt.data.bars.volume_problem)"),
    )
    for column, values, ok, rule in checks:
        bad = ~ok
        if bad.any():
            row = int(np.argmax(bad))
            raise ValueError(
                f"bars frame: {column}={float(values[row])!r} at {index[row]} (row {row}): must be finite and {rule}"
            )


def trade_weekdays(dates: np.ndarray) -> np.ndarray:
    """Weekday (Monday = 0) of ``datetime64[D]`` trading dates, float64."""
    days = np.asarray(dates, dtype="datetime64[D]").astype(np.int64)
    return np.mod(days + EPOCH_WEEKDAY, DAYS_PER_WEEK).astype(np.float64)


def session_length(asset: AssetSpec) -> int:
    """Minutes from session open to close (a session may span midnight); 24 h if equal."""
    length = (clock_minutes(asset.close_time) - clock_minutes(asset.open_time)) % MINUTES_PER_DAY
    return length or MINUTES_PER_DAY


def _minute_of_day(local: pd.DatetimeIndex) -> np.ndarray:
    hours = local.hour.to_numpy().astype(np.float64)
    minutes = local.minute.to_numpy().astype(np.float64)
    seconds = local.second.to_numpy().astype(np.float64)
    return hours * 60.0 + minutes + seconds / 60.0


def clock_minutes(t: time) -> int:
    """Minutes since midnight of a clock time."""
    return t.hour * 60 + t.minute


def parse_hhmm(text: Any, key: str) -> time:
    try:
        hh, mm = str(text).split(":")
        return time(int(hh), int(mm))
    except ValueError:
        raise ValueError(f"{key}={text!r}: must be a local time 'HH:MM'") from None
