"""The feature pipeline one bar at a time: O(1) work per bar, the batch pipeline's values.

:class:`StreamingFeatures` takes 1-minute bars as they arrive and returns each bar's 16 raw
feature values, the same numbers :func:`foxhunt.data.features.compute_features` gives for that
bar of the whole series (tested to float rounding). What each group needs:

- ``static``: constants of the asset, computed once;
- ``known`` (calendar): a function of the bar's timestamp alone (and of the exchange
  calendar's sessions, loaded a year ahead and bisected), computed here for one
  timestamp with :mod:`zoneinfo` (a pandas call per bar costs more than all the rest), and
  memoised per minute, because the forecasters' decoder asks for the next minutes again and
  again (:meth:`known_at`);
- ``observed``: ring buffers of the last closes and volumes and running sums of the squared
  returns and of the volumes over their trailing windows (Kahan-compensated, as pandas' rolling
  mean is), so a bar costs the same whatever the history.

Until the trailing windows are full (``FeatureConfig.warmup_bars`` bars, the rows the batch
pipeline drops) :meth:`update` returns ``None``. :func:`normalize` applies a model's stored
train statistics (the batch pipeline's z-normalization of the observed group).

Each bar is checked as it arrives: timestamps strictly increasing, prices by the one price rule
of a bar (:func:`foxhunt.data.bars.price_problem`: finite, at least one tick, on the asset's tick
grid, below the grid's exact range), volume by the one volume rule
(:func:`foxhunt.data.bars.volume_problem`: a whole count of contracts below a bound); a bad bar raises :class:`~foxhunt.data.errors.BarDataError`
naming the stream, the bar and the field, and leaves the state as it was.

Written by hand: no library streams these features, and they must equal foxhunt's own.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np

from foxhunt.assets import AssetSpec
from foxhunt.data.bars import MAX_TS_NS, MIN_TS_NS, price_problem, volume_problem
from foxhunt.data.calendar import calendar_for
from foxhunt.data.dataset import feature_groups
from foxhunt.data.errors import BarDataError
from foxhunt.data.features import (
    BAR_INTERVAL,
    DAYS_PER_WEEK,
    EPOCH_WEEKDAY,
    FEATURE_NAMES,
    MINUTES_PER_DAY,
    TRADE_DATES_PER_WEEK,
    FeatureConfig,
    clock_minutes,
    parse_hhmm,
    static_features,
)

NS_PER_S = 1_000_000_000
BAR_INTERVAL_NS = int(BAR_INTERVAL / np.timedelta64(1, "ns"))
KNOWN_CACHE_MINUTES = 4096  # memoised calendar rows (the decoder's future minutes reuse them)


class _RunningMean:
    """Mean of the last ``window`` values, O(1) per value (Kahan-compensated sums)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.values: deque[float] = deque()
        self.total = 0.0
        self.carry = 0.0

    def _add(self, value: float) -> None:
        y = value - self.carry
        t = self.total + y
        self.carry = (t - self.total) - y
        self.total = t

    def push(self, value: float) -> float | None:
        self.values.append(value)
        self._add(value)
        if len(self.values) > self.window:
            self._add(-self.values.popleft())
        return self.total / self.window if len(self.values) == self.window else None


class KnownCalendar:
    """The 8 calendar features of one timestamp, as :func:`foxhunt.data.features.known_features`
    (the same exchange-calendar sessions, looked up by bisection, a year ahead at a time)."""

    def __init__(self, asset: AssetSpec, cfg: FeatureConfig) -> None:
        self.zone = ZoneInfo(asset.session_tz)
        self.rth_zone = ZoneInfo(cfg.rth_tz)
        self.sessions = calendar_for(asset)
        self.rth_open = clock_minutes(parse_hhmm(cfg.rth_open, "features.rth_open"))
        self.rth_close = clock_minutes(parse_hhmm(cfg.rth_close, "features.rth_close"))
        self._cache: dict[int, np.ndarray] = {}
        self._arrays: dict[str, np.ndarray] | None = None
        self._span = (0, -1)  # UTC ns the loaded sessions cover

    def _session(self, ts_ns: int) -> tuple[int, int, int]:
        """(open ns, close ns, trade weekday) of the session last opened at or before ``ts_ns``."""
        arrays = self._arrays
        if arrays is None or not (self._span[0] <= ts_ns <= self._span[1]):
            arrays = self._arrays = self.sessions.stream_cover(ts_ns)
            opens = arrays["open"]
            self._span = (int(opens[0]), int(opens[-1]))
        i = max(int(np.searchsorted(arrays["open"], ts_ns, side="right")) - 1, 0)
        weekday = (int(arrays["date"][i].astype(np.int64)) + EPOCH_WEEKDAY) % DAYS_PER_WEEK
        return int(arrays["open"][i]), int(arrays["close"][i]), weekday

    def row(self, ts_ns: int) -> np.ndarray:
        """(8,) float64 known features of the bar starting at ``ts_ns`` (UTC nanoseconds)."""
        cached = self._cache.get(ts_ns)
        if cached is not None:
            return cached
        seconds = ts_ns // NS_PER_S
        utc = datetime.fromtimestamp(seconds, tz=timezone.utc)  # sub-second parts: unused, as in batch
        local = utc.astimezone(self.zone)
        minute = local.hour * 60.0 + local.minute + local.second / 60.0
        weekday = float(local.weekday())
        opened, closes, trade_weekday = self._session(ts_ns)
        length = closes - opened
        if ts_ns < closes:
            elapsed = min(max((ts_ns - opened) / length, 0.0), 1.0)
            remaining = min(max((closes - ts_ns) / length, 0.0), 1.0)
        else:  # closed time: the last session is over
            elapsed, remaining = 1.0, 0.0
        week_elapsed = min(max((trade_weekday + elapsed) / TRADE_DATES_PER_WEEK, 0.0), 1.0)
        rth = utc.astimezone(self.rth_zone)
        rth_minute = rth.hour * 60.0 + rth.minute + rth.second / 60.0
        regular = float(self.rth_open <= rth_minute < self.rth_close and rth.weekday() < TRADE_DATES_PER_WEEK)
        day_angle = 2.0 * math.pi * minute / MINUTES_PER_DAY
        week_angle = 2.0 * math.pi * weekday / DAYS_PER_WEEK
        row = np.array(
            [math.sin(day_angle), math.cos(day_angle), math.sin(week_angle), math.cos(week_angle),
             elapsed, remaining, regular, week_elapsed],
        )  # fmt: skip
        if len(self._cache) >= KNOWN_CACHE_MINUTES:
            self._cache.clear()
        self._cache[ts_ns] = row
        return row

    def future(self, ts_ns: int, horizon: int) -> np.ndarray:
        """(horizon, 8) float32: the rows of the next ``horizon`` clock minutes after ``ts_ns``,
        as :func:`foxhunt.data.features.future_known_features`."""
        return np.stack([self.row(ts_ns + k * BAR_INTERVAL_NS) for k in range(1, horizon + 1)]).astype(np.float32)


class StreamingFeatures:
    """Raw features of each new bar (see the module doc). ``origin`` names the stream in errors."""

    def __init__(self, asset: AssetSpec, cfg: Any, origin: str = "bar stream", calendar: KnownCalendar | None = None) -> None:
        self.asset = asset
        self.cfg = FeatureConfig.from_config(cfg)
        self.origin = origin
        self.calendar = calendar or KnownCalendar(asset, self.cfg)  # shareable: it depends on the asset and config only
        self.static = static_features(asset)
        self.groups = feature_groups()
        self._static, self._known, self._observed = (_index(self.groups[g]) for g in ("static", "known", "observed"))
        self._log_closes: deque[float] = deque(maxlen=self.cfg.momentum_bars + 1)
        self._square_returns = _RunningMean(self.cfg.volatility_bars)
        self._volumes = _RunningMean(self.cfg.volume_bars)
        self.last_ts: int | None = None
        self.bars = 0  # bars accepted so far
        self._grid = f"the tick grid of {asset.key}, tick {asset.tick_size:g}"  # in an off-grid price's line

    def state_bytes(self) -> int:
        """Bytes this stream's trailing windows hold (``sys.getsizeof`` of each deque and of
        its float entries); the calendar, which streams of one asset share, is not counted."""
        deques = (self._log_closes, self._square_returns.values, self._volumes.values)
        return int(sum(sys.getsizeof(d) + sum(sys.getsizeof(v) for v in d) for d in deques))

    def check(self, ts_ns: int, open_: float, high: float, low: float, close: float, volume: float) -> None:
        """Raise BarDataError for a bar the stream cannot accept (nothing is changed)."""
        if not MIN_TS_NS <= ts_ns <= MAX_TS_NS:
            self._reject(ts_ns, f"ts={ts_ns}: outside the bar times this stream reads ({_utc(MIN_TS_NS)} .. {_utc(MAX_TS_NS)})")
        if self.last_ts is not None and ts_ns <= self.last_ts:
            self._reject(ts_ns, f"out of order, not after the previous bar at {_utc(self.last_ts)}")
        tick = self.asset.tick_size
        for name, value in (("open", open_), ("high", high), ("low", low), ("close", close)):
            problem = price_problem(value, tick, grid=self._grid)
            if problem is not None:
                self._reject(ts_ns, f"{name}={value!r} {problem}")
        problem = volume_problem(volume)
        if problem is not None:
            self._reject(ts_ns, f"volume={volume!r} {problem}")
        if high < low or high < max(open_, close) or low > min(open_, close):
            self._reject(ts_ns, f"high={high}, low={low} do not bound open={open_}, close={close}")

    def _reject(self, ts_ns: int, problem: str) -> None:
        raise BarDataError(f"{self.origin}: bar {self.bars} ({_utc(ts_ns)}): {problem}")

    def update(self, ts_ns: int, open_: float, high: float, low: float, close: float, volume: float,
               checked: bool = False) -> np.ndarray | None:  # fmt: skip
        """The bar's 16 raw features (float64, ``FEATURE_NAMES`` order), or ``None`` while the
        trailing windows fill (the first ``warmup_bars`` bars). ``checked``: the caller ran
        :meth:`check` on this bar already."""
        if not checked:
            self.check(ts_ns, open_, high, low, close, volume)
        self.last_ts = ts_ns
        self.bars += 1
        log_close = math.log(close)
        previous = self._log_closes[-1] if self._log_closes else None
        self._log_closes.append(log_close)
        log_return = None if previous is None else log_close - previous
        mean_square = None if log_return is None else self._square_returns.push(log_return * log_return)
        mean_volume = self._volumes.push(float(volume))
        full = len(self._log_closes) == self._log_closes.maxlen
        if log_return is None or mean_square is None or mean_volume is None or not full:
            return None
        observed = (
            log_return,
            log_close - self._log_closes[0],
            math.sqrt(max(mean_square, 0.0)),
            math.log1p(volume) - math.log1p(mean_volume),
        )
        row = np.empty(len(FEATURE_NAMES))
        row[self._static] = self.static
        row[self._known] = self.calendar.row(ts_ns)
        row[self._observed] = observed
        return row


def _index(columns: list[int]) -> slice | np.ndarray:
    """A slice for contiguous columns (a view, no gather), else an index array."""
    if columns == list(range(columns[0], columns[-1] + 1)):
        return slice(columns[0], columns[-1] + 1)
    return np.asarray(columns)


def _utc(ts_ns: int) -> str:
    if not MIN_TS_NS <= ts_ns <= MAX_TS_NS:
        return f"ts {ts_ns}"
    return f"{np.datetime64(ts_ns, 'ns').astype('datetime64[s]')}Z"


def normalizer(n_features: int, observed: list[int], mean: np.ndarray, std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offset, scale) over all ``n_features`` columns: the model's train statistics on the
    observed group, 0 and 1 elsewhere (``(x - 0) / 1`` is ``x`` exactly)."""
    offset, scale = np.zeros(n_features), np.ones(n_features)
    offset[observed], scale[observed] = mean, std
    return offset, scale


def normalize(raw: np.ndarray, offset: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """One raw feature row -> the model's input row (float32): the observed group z-normalized
    with the model's train statistics (:func:`normalizer`), as
    :func:`foxhunt.data.dataset.build_market_dataset` does for a whole split."""
    return ((raw - offset) / scale).astype(np.float32)
