"""Synthetic 1-minute CME futures bars, generated deterministically from a seed.

The generator reproduces the stylized facts a trading model meets in real minute bars, per
asset (price level, tick size, daily volatility and Globex session hours come from the
:class:`~foxhunt.assets.AssetSpec`):

* session calendar: bars only inside the sessions of the asset's exchange calendar
  (:func:`foxhunt.data.calendar.calendar_for`, pandas-market-calendars): Globex sessions open
  on the evening before each trading date (Sunday evening for Monday) and close on it, CME
  holidays have no session, an early close ends its session early, a break inside a session
  (the equity halt before 2021) has no bars; weekends and the daily break have none either;
* volatility clustering: the log-volatility is a stationary AR(1) process in trading
  minutes (a stochastic-volatility model, GARCH-like in effect: calm and busy stretches
  persist with a chosen half-life);
* heavy tails: Student-t innovations scaled to unit variance;
* intraday U shape: volatility is highest at the session's open and close;
* optional AR(1) return autocorrelation (``autocorrelation``), a learnable pattern for tests,
  and a regime change: from the first bar of the UTC date ``change_date`` on, the coefficient is
  ``autocorrelation_after`` (e.g. ``0.3`` then ``-0.3``: the pattern changes sign at a known date,
  what a rolling ensemble must notice; :mod:`foxhunt.roll`);
* a price gap across each session break;
* volume rising with volatility and with the size of the bar's move;
* OHLC consistent and on the tick grid: high/low are the exact maximum/minimum of a Brownian
  bridge between open and close (sampled in closed form), then rounded to ticks.

The per-minute volatility is calibrated so that the expected daily variance of the
log-price equals ``asset.daily_vol**2`` (the session gap taking its share).

Why hand-written: no library generates exchange-calendar minute bars with these properties.
Every recursion is vectorized with numpy: the AR(1) filters run blockwise with closed-form
powers (see :func:`ar1_filter`), so a year of one asset takes well under a second.
"""

from __future__ import annotations

import math
import zlib
from datetime import date, timedelta

import numpy as np
import pandas as pd

from foxhunt.assets import AssetSpec
from foxhunt.data.bars import (
    BAR_COLUMNS,
    INDEX_NAME,
    snap_to_tick,
    source_fingerprint,
    validate_bars,
)
from foxhunt.data.calendar import MINUTE_NS, calendar_for
from foxhunt.data.errors import BarDataError

# The settings' ranges (checked by the constructor, before anything is generated): generous, but
# past them a date leaves pandas' range, a volatility or a volume overflows, or the bars no longer
# fit in memory. Each: (low, high, low open, high open).
MAX_DAYS = 7_305  # 20 years: about 7 million bars of an asset, seconds to generate
FIRST_DATE, LAST_DATE = date(1678, 1, 1), date(2262, 4, 10)  # pandas' nanosecond timestamps
RANGES = {
    "autocorrelation": (-1.0, 1.0, True, True),
    "autocorrelation_after": (-1.0, 1.0, True, True),  # with change_date (both or neither)
    "vol_of_vol": (0.0, 2.0, False, False),  # std of the log-volatility: e**(5 x 2) at five sigmas
    "vol_half_life_minutes": (0.0, 1e6, True, False),  # two years of trading minutes (0.5**(1/h) stays < 1)
    "tail_dof": (2.0, 1000.0, True, False),  # > 2: finite variance; 1000: normal in effect
    "tail_clip": (0.0, 100.0, True, False),
    "intraday_u_depth": (0.0, 1.0, True, False),
    "intraday_u_power": (0.0, 10.0, True, False),
    "session_gap_vol": (0.0, 1.0, False, True),
    "drift_per_day": (-0.01, 0.01, False, False),  # 1% a trading day: 20 years stay within float range
    # volume: numpy's Poisson draw refuses a mean near 1e19; these keep the busiest bar's mean
    # (volume_mean x the volatility's and the move's share x the noise) below 1e18
    "volume_mean": (0.0, 1e5, True, False),  # contracts per bar (ES's busiest minutes: tens of thousands)
    "volume_vol_elasticity": (0.0, 4.0, False, False),
    "volume_return_weight": (0.0, 1.0, False, False),
    "volume_dispersion": (0.1, 1000.0, False, False),  # gamma shape of the noise: smaller draws rarer, larger outliers
}

# Blocks of the AR(1) filter are sized so that |phi|**-block stays below exp(this): the
# closed form divides by phi**k, and this bound keeps those factors far from overflow.
_AR1_BLOCK_LOG_RANGE = 200.0


def _inside(value: object, low: float, high: float, low_open: bool, high_open: bool) -> bool:
    """``value`` is a finite number in the range (``low_open``, ``high_open``: ends excluded)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return False
    return (low < value if low_open else low <= value) and (value < high if high_open else value <= high)


def ar1_filter(innovations: np.ndarray, phi: float, initial: float = 0.0) -> np.ndarray:
    """``x[t] = phi * x[t-1] + innovations[t]`` with ``x[-1] = initial``, vectorized.

    Within a block of length B, ``x[s+k] = phi**k * (phi * x[s-1] + cumsum(e[s+j] / phi**j))``;
    blocks are short enough that ``phi**-B`` cannot overflow, so the loop runs only over
    blocks (a handful for phi near 1, a few thousand for phi = 0.3 on a year of minutes).
    """
    e = np.asarray(innovations, dtype=np.float64)
    if not -1.0 < phi < 1.0:
        raise ValueError(f"AR(1) coefficient {phi!r} must lie strictly between -1 and 1")
    if phi == 0.0:
        return e.copy()
    block = max(1, int(_AR1_BLOCK_LOG_RANGE / -math.log(abs(phi))))
    block = min(block, max(1, e.size))
    powers = phi ** np.arange(block, dtype=np.float64)
    out = np.empty_like(e)
    previous = float(initial)
    for start in range(0, e.size, block):
        chunk = e[start : start + block]
        p = powers[: chunk.size]
        out[start : start + chunk.size] = p * (phi * previous + np.cumsum(chunk / p))
        previous = float(out[start + chunk.size - 1])
    return out


class SyntheticBarSource:
    """Deterministic synthetic 1-minute bars for any asset.

    Every setting comes from the config (conf/data/synthetic.yaml holds the defaults); only the
    regime change is optional (None, its absence: one regime, as in configs stored before it).

    Args:
        days: calendar days to cover, starting at ``start``: the sessions of the asset's
            calendar whose trading date falls in them.
        seed: random seed (non-negative); the asset's key is mixed in, so assets differ.
        start: first calendar date, "YYYY-MM-DD".
        autocorrelation: AR(1) coefficient of 1-minute returns (0 = none), in (-1, 1).
        change_date: a date "YYYY-MM-DD" (UTC) from whose first bar on the coefficient is
            ``autocorrelation_after``; None: one regime throughout.
        autocorrelation_after: the coefficient from ``change_date`` on, in (-1, 1) (set with it).
        vol_of_vol: standard deviation of the stationary log-volatility process.
        vol_half_life_minutes: half-life of log-volatility shocks, in trading minutes.
        tail_dof: degrees of freedom of the Student-t return innovations (> 2; smaller = heavier tails).
        tail_clip: innovations are clipped to +-this many standard deviations (a t draw can be
            astronomically large once in millions; real minute moves top out far below that).
        intraday_u_depth: volatility in mid-session relative to the session's open and close, in (0, 1].
        intraday_u_power: steepness of the U (2 = parabola).
        session_gap_vol: standard deviation of the price gap across each session break, as a
            fraction of the daily volatility (its variance is taken from the daily budget).
        drift_per_day: expected log return per trading day.
        volume_mean: mean contracts per 1-minute bar.
        volume_vol_elasticity: volume grows like volatility**elasticity.
        volume_return_weight: share of volume driven by the size of the bar's own move, in [0, 1].
        volume_dispersion: gamma shape of the volume noise (larger = less noisy).
    """

    def __init__(
        self,
        days: int,
        seed: int,
        start: str,
        autocorrelation: float,
        vol_of_vol: float,
        vol_half_life_minutes: float,
        tail_dof: float,
        tail_clip: float,
        intraday_u_depth: float,
        intraday_u_power: float,
        session_gap_vol: float,
        drift_per_day: float,
        volume_mean: float,
        volume_vol_elasticity: float,
        volume_return_weight: float,
        volume_dispersion: float,
        change_date: str | None = None,
        autocorrelation_after: float | None = None,
    ) -> None:
        def whole(key: str, value: object, low: int, high: int) -> None:
            if not (isinstance(value, int) and not isinstance(value, bool) and low <= value <= high):
                raise ValueError(f"{key}={value!r}: must be a whole number in [{low}, {high}]")

        whole("days", days, 1, MAX_DAYS)
        whole("seed", seed, 0, 2**32 - 1)
        try:
            self.start = date.fromisoformat(str(start))
        except ValueError:
            raise ValueError(f"start={start!r}: must be a date 'YYYY-MM-DD'") from None
        if not FIRST_DATE <= self.start <= LAST_DATE:
            raise ValueError(f"start={start!r}: must lie in [{FIRST_DATE}, {LAST_DATE}] (pandas' timestamps)")
        if self.start + timedelta(days=days - 1) > LAST_DATE:
            raise ValueError(f"days={days!r}: the days from start={self.start} must end by {LAST_DATE} (pandas' timestamps)")
        if (change_date is None) != (autocorrelation_after is None):
            given, missing = ("change_date", "autocorrelation_after") if autocorrelation_after is None else (
                "autocorrelation_after", "change_date")  # fmt: skip
            raise ValueError(f"{missing}=None: set it with {given} (a regime change needs both), or neither")
        self.change_date = None
        if change_date is not None:
            try:
                self.change_date = date.fromisoformat(str(change_date))
            except ValueError:
                raise ValueError(f"change_date={change_date!r}: must be a date 'YYYY-MM-DD'") from None
            if not FIRST_DATE <= self.change_date <= LAST_DATE:
                raise ValueError(f"change_date={change_date!r}: must lie in [{FIRST_DATE}, {LAST_DATE}] (pandas' timestamps)")
        arguments = locals()  # the constructor's arguments by name
        for key, (low, high, low_open, high_open) in RANGES.items():
            if key == "autocorrelation_after" and arguments[key] is None:
                continue
            if not _inside(arguments[key], low, high, low_open, high_open):
                raise ValueError(
                    f"{key}={arguments[key]!r}: must lie in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
                )
        self.days = days
        self.seed = seed
        self.autocorrelation = float(autocorrelation)
        self.vol_of_vol = float(vol_of_vol)
        self.vol_half_life_minutes = float(vol_half_life_minutes)
        self.tail_dof = float(tail_dof)
        self.tail_clip = float(tail_clip)
        self.intraday_u_depth = float(intraday_u_depth)
        self.intraday_u_power = float(intraday_u_power)
        self.session_gap_vol = float(session_gap_vol)
        self.drift_per_day = float(drift_per_day)
        self.volume_mean = float(volume_mean)
        self.volume_vol_elasticity = float(volume_vol_elasticity)
        self.volume_return_weight = float(volume_return_weight)
        self.volume_dispersion = float(volume_dispersion)
        self.autocorrelation_after = None if autocorrelation_after is None else float(autocorrelation_after)

    # ------------------------------------------------------------------ public API
    def load(self, asset: AssetSpec) -> pd.DataFrame:
        """The bars frame for ``asset`` (same seed and arguments: identical frame)."""
        index, session_id, minute_of_session, session_minutes = self._calendar(asset)
        bars = self._generate(asset, index, session_id, minute_of_session, session_minutes)
        return validate_bars(bars, asset.tick_size, origin=self._origin(asset))

    def fingerprint(self, asset: AssetSpec) -> str:
        # the calendar's library version is in it: new holiday rules, new bars, a new cache key
        params = {**self._params(), "calendar": calendar_for(asset).fingerprint()}
        return source_fingerprint("synthetic", params, asset)

    # ------------------------------------------------------------------ internals
    def _params(self) -> dict:
        change = (
            {}
            if self.change_date is None
            else {  # only when set: the fingerprint of one regime is as before
                "change_date": self.change_date.isoformat(),
                "autocorrelation_after": self.autocorrelation_after,
            }
        )
        return {
            **change,
            "days": self.days,
            "seed": self.seed,
            "start": self.start.isoformat(),
            "autocorrelation": self.autocorrelation,
            "vol_of_vol": self.vol_of_vol,
            "vol_half_life_minutes": self.vol_half_life_minutes,
            "tail_dof": self.tail_dof,
            "tail_clip": self.tail_clip,
            "intraday_u_depth": self.intraday_u_depth,
            "intraday_u_power": self.intraday_u_power,
            "session_gap_vol": self.session_gap_vol,
            "drift_per_day": self.drift_per_day,
            "volume_mean": self.volume_mean,
            "volume_vol_elasticity": self.volume_vol_elasticity,
            "volume_return_weight": self.volume_return_weight,
            "volume_dispersion": self.volume_dispersion,
        }

    def _origin(self, asset: AssetSpec) -> str:
        return f"synthetic {asset.key} (seed={self.seed}, start={self.start}, days={self.days})"

    def _calendar(self, asset: AssetSpec):
        """UTC minute stamps of every open minute of the calendar's sessions in range, each
        bar's session number, its clock minute since the session open and its session's length."""
        last = self.start + timedelta(days=self.days - 1)
        sessions = calendar_for(asset).sessions(self.start, last)
        if sessions.empty:
            raise BarDataError(
                f"{self._origin(asset)}: no trading session of the {asset.calendar} calendar in the "
                f"{self.days} day(s) from {self.start}"
            )
        opens = pd.DatetimeIndex(sessions["open"]).asi8
        closes = pd.DatetimeIndex(sessions["close"]).asi8
        lengths = (closes - opens) // MINUTE_NS  # clock minutes from open to close
        session_id = np.repeat(np.arange(len(sessions)), lengths)
        starts = np.cumsum(lengths) - lengths
        minute_of_session = np.arange(int(lengths.sum())) - np.repeat(starts, lengths)
        stamps = opens[session_id] + minute_of_session * MINUTE_NS
        breaks = sessions["break_start"].notna().to_numpy()
        if breaks.any():  # no bar inside a session's break
            bs = np.where(breaks, pd.DatetimeIndex(sessions["break_start"]).asi8, 0)[session_id]
            be = np.where(breaks, pd.DatetimeIndex(sessions["break_end"]).asi8, 0)[session_id]
            keep = ~((stamps >= bs) & (stamps < be))
            stamps, session_id, minute_of_session = stamps[keep], session_id[keep], minute_of_session[keep]
        index = pd.DatetimeIndex(stamps.astype("datetime64[ns]")).tz_localize("UTC").rename(INDEX_NAME)
        return index, session_id, minute_of_session, lengths[session_id]

    def _generate(self, asset, index, session_id, minute_of_session, session_length) -> pd.DataFrame:
        n = len(index)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, zlib.crc32(asset.key.encode())]))
        v = self.vol_of_vol
        nu = self.tail_dof

        # Intraday U shape over each session (an early close compresses it), normalized so that
        # its mean square over a regular session is 1.
        session_minutes = asset.session_minutes
        shape = self._u_shape((np.arange(session_minutes) + 0.5) / session_minutes)
        norm = math.sqrt(np.mean(shape**2))
        shape /= norm
        u = self._u_shape((minute_of_session + 0.5) / session_length) / norm

        # Log-volatility: stationary AR(1) with standard deviation v.
        phi_vol = 0.5 ** (1.0 / self.vol_half_life_minutes)
        h = ar1_filter(
            rng.standard_normal(n) * v * math.sqrt(1.0 - phi_vol**2),
            phi_vol,
            initial=rng.standard_normal() * v,
        )

        # Per-minute scale: E[sum over a session of sigma^2] = intraday share of daily variance.
        intraday_var = asset.daily_vol**2 * (1.0 - self.session_gap_vol**2)
        base = math.sqrt(intraday_var / session_minutes) * math.exp(-(v**2))
        sigma = base * u * np.exp(h)

        unit_t = math.sqrt((nu - 2.0) / nu)  # scales a Student-t draw to unit variance
        clip = self.tail_clip
        z = np.clip(rng.standard_t(nu, size=n) * unit_t, -clip, clip)
        # (1 - a) keeps the long-run (daily) variance of the AR(1) returns at the target.
        returns = self._ar1_returns(sigma * z, index) + self.drift_per_day / session_minutes

        first = np.r_[True, session_id[1:] != session_id[:-1]]
        gaps = np.zeros(n)
        n_sessions = int(first.sum())
        gaps[first] = np.clip(rng.standard_t(nu, size=n_sessions) * unit_t, -clip, clip)
        gaps[first] *= self.session_gap_vol * asset.daily_vol
        gaps[0] = 0.0  # the series starts at the asset's price level

        log_close = math.log(asset.price_level) + np.cumsum(gaps + returns)
        log_open = log_close - returns
        open_ = np.exp(log_open)
        close = np.exp(log_close)

        # High/low: exact extremes of a Brownian bridge from open to close with the bar's variance.
        spread = (sigma * open_) ** 2
        lift = np.sqrt((close - open_) ** 2 - 2.0 * spread * np.log1p(-rng.random(n)))
        drop = np.sqrt((close - open_) ** 2 - 2.0 * spread * np.log1p(-rng.random(n)))
        high = 0.5 * (open_ + close + lift)
        low = 0.5 * (open_ + close - drop)

        tick = asset.tick_size
        o, c = snap_to_tick(open_, tick), snap_to_tick(close, tick)
        h_ = np.maximum(snap_to_tick(high, tick), np.maximum(o, c))
        l_ = np.minimum(snap_to_tick(low, tick), np.minimum(o, c))

        # Volume: rises with volatility (elasticity) and with the bar's own move.
        k = self.volume_vol_elasticity
        activity = (u * np.exp(h)) ** k / (np.mean(shape**k) * math.exp(0.5 * (k * v) ** 2))
        move = np.abs(z)
        shock = (1.0 - self.volume_return_weight) + self.volume_return_weight * move / move.mean()
        noise = rng.gamma(self.volume_dispersion, 1.0 / self.volume_dispersion, size=n)
        volume = 1.0 + rng.poisson(self.volume_mean * activity * shock * noise)

        data = {"open": o, "high": h_, "low": l_, "close": c, "volume": volume.astype(np.float64)}
        return pd.DataFrame({col: data[col] for col in BAR_COLUMNS}, index=index)

    def _ar1_returns(self, shocks: np.ndarray, index: pd.DatetimeIndex) -> np.ndarray:
        """The AR(1) returns of ``shocks`` (sigma x z): coefficient ``autocorrelation``, and from
        ``change_date``'s first bar on ``autocorrelation_after``, the recursion carried across the
        change (each regime's innovations scaled by (1 - its coefficient), as the module doc says)."""
        a, b = self.autocorrelation, self.autocorrelation_after
        if self.change_date is None or b is None:  # one regime (__init__ sets both or neither)
            return ar1_filter(shocks * (1.0 - a), a)
        change = pd.Timestamp(self.change_date, tz="UTC").as_unit("ns").value
        cut = int(np.searchsorted(index.as_unit("ns").asi8, change, side="left"))
        before = ar1_filter(shocks[:cut] * (1.0 - a), a)
        after = ar1_filter(shocks[cut:] * (1.0 - b), b, initial=float(before[-1]) if cut else 0.0)
        return np.concatenate([before, after])

    def _u_shape(self, position: np.ndarray) -> np.ndarray:
        """Volatility profile at ``position`` in (0, 1) of the session (1 at the open and close)."""
        return self.intraday_u_depth + (1.0 - self.intraday_u_depth) * np.abs(2.0 * position - 1.0) ** self.intraday_u_power
