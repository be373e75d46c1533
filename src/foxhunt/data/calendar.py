"""The exchange calendar of an asset: CME Globex sessions, holidays, early closes and breaks.

Why a library: holiday rules, half days and their history (the equity halt that ended on
2021-06-28, Juneteenth from 2022, a Good Friday opened for the employment report) are facts
the exchange publishes and changes; pandas-market-calendars keeps them per product group and
is maintained against the CME holiday pages. Each asset config names its calendar
(``conf/asset/*.yaml``: ``calendar``): ``CME_Equity`` for ES and NQ, ``CMEGlobex_FX`` for 6E,
``CME Globex Fixed Income`` for ZN. :func:`calendar_for` checks that the calendar's regular
hours are the asset's ``session_open``/``session_close``.

Written here by hand, because the library does not do it:

* minute arithmetic on a bars index, vectorized with ``searchsorted`` over the sessions' UTC
  bounds: the trading date of each bar (:meth:`SessionCalendar.trading_dates`), whether a bar
  lies inside a session (:meth:`~SessionCalendar.open_mask`), the open minutes in a span
  (:meth:`~SessionCalendar.open_minutes`) and the missing open minutes between consecutive
  bars (:meth:`~SessionCalendar.gaps`: a hole in real data, told apart from a closed market);
* the figures the Sharpe annualization needs (:meth:`~SessionCalendar.annual`);
* one correction of the library (:func:`_good_friday_fix`): from 2023 its Globex equity, FX
  and fixed-income calendars make every Good Friday an early close, a rule taken from 2023
  (2023-04-07 and 2026-04-03 fell on the monthly employment report and CME opened). CME
  closes Good Friday otherwise (2024-03-29, 2025-04-18); the library's own ``CME_Bond``
  calendar lists the Good Fridays CME opens (``BondsGoodFridayOpen``), and that list is
  applied here to every calendar. Nothing else is patched: what the library says is used.

Conventions: a session is indexed by its trading date (the date it closes on; Globex opens
on the evening before); bounds are UTC; a bar labelled ``t`` (its start) is inside a session
when ``open <= t < close`` and not in its break ``[break_start, break_end)``.
"""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd
import pandas_market_calendars as mcal
from pandas.tseries.holiday import GoodFriday
from pandas_market_calendars.calendars.cme import BondsGoodFridayOpen

from foxhunt.data.bars import MINUTE_NS

if TYPE_CHECKING:
    from foxhunt.assets import AssetSpec

LIBRARY = "pandas_market_calendars"
DAY_NS = 24 * 60 * MINUTE_NS
DAYS_PER_YEAR = 365.25  # mean calendar year (Julian), the unit of "per year"
# Sessions are fetched this many days beyond the bars on each side, so that the session a
# bar belongs to (opened the evening before, or before a long weekend) is always among them.
_MARGIN_DAYS = 10
_STREAM_AHEAD_DAYS = 370  # a stream loads the sessions of the year ahead at once
_FIRST_GOOD_FRIDAY_RULE_YEAR = 2023  # the library's "every Good Friday an early close" rule starts here


class CalendarError(ValueError):
    """An unknown calendar name or a calendar that does not fit the asset (one line)."""


@dataclass(frozen=True)
class AnnualFigures:
    """The calendar's sessions and open minutes over a reference span (both ends included)."""

    calendar: str
    start: date
    end: date
    sessions: int
    open_minutes: int

    @property
    def years(self) -> float:
        return ((self.end - self.start).days + 1) / DAYS_PER_YEAR

    @property
    def sessions_per_year(self) -> float:
        return self.sessions / self.years

    @property
    def minutes_per_session(self) -> float:
        return self.open_minutes / self.sessions

    @property
    def open_minutes_per_year(self) -> float:
        return self.open_minutes / self.years


class SessionCalendar:
    """One pandas-market-calendars calendar, with the minute arithmetic foxhunt needs.

    Args:
        name: a calendar name the library knows (``CME_Equity``, ``CMEGlobex_FX``, ...).
        key: the config key that named it, for the one-line error.
    """

    def __init__(self, name: str, key: str = "asset.calendar") -> None:
        if not isinstance(name, str) or name not in mcal.get_calendar_names():
            raise CalendarError(
                f"{key}={name!r}: unknown exchange calendar (pandas_market_calendars names, e.g. "
                f"CME_Equity, CMEGlobex_FX, CME Globex Fixed Income)"
            )
        self.name = name
        self.version = importlib.metadata.version("pandas_market_calendars")
        self._cal = mcal.get_calendar(name)
        self.zone = str(self._cal.tz)
        self._bounds: tuple[int, int] | None = None  # loaded span [first date, last date], days since epoch
        self._arrays: dict[str, np.ndarray] = {}

    def __repr__(self) -> str:
        return f"SessionCalendar({self.name!r}, {LIBRARY} {self.version})"

    @property
    def library(self) -> str:
        return f"{LIBRARY} {self.version}"

    def fingerprint(self) -> dict[str, str]:
        """What identifies the sessions this calendar gives (for cache keys)."""
        return {"name": self.name, "library": LIBRARY, "version": self.version}

    # ------------------------------------------------------------------ sessions by date
    def sessions(self, start: Any, end: Any) -> pd.DataFrame:
        """One row per trading date in ``[start, end]`` (dates, both included): ``open``,
        ``close`` (early closes applied), ``break_start``, ``break_end`` (NaT: no break), UTC."""
        return self._schedule(_day(start), _day(end)).copy()

    def holidays(self, start: Any, end: Any) -> pd.DatetimeIndex:
        """Weekdays (Monday-Friday) in ``[start, end]`` without a session."""
        days = pd.bdate_range(_day(start), _day(end))
        return days.difference(self._schedule(_day(start), _day(end)).index).rename("date")

    def early_closes(self, start: Any, end: Any) -> pd.Series:
        """The sessions in ``[start, end]`` that close before the regular close (the library's
        ``early_closes``): the close (UTC) by trading date."""
        first, last = _day(start), _day(end)
        schedule = self._library_schedule(first, last)
        if schedule.empty:  # no session in the range (a holiday's bars alone): the library's .dt fails on it
            return pd.Series([], index=pd.DatetimeIndex([], name=schedule.index.name), dtype="datetime64[ns, UTC]", name="close")
        early = self._cal.early_closes(schedule)
        keep = self._schedule(first, last).index
        return early["market_close"].reindex(early.index.intersection(keep)).astype("datetime64[ns, UTC]").rename("close")

    # ------------------------------------------------------------------ bars
    def trading_dates(self, index: pd.DatetimeIndex) -> np.ndarray:
        """The trading date (``datetime64[D]``) of each bar: the session it lies in; a bar
        outside every session (see :meth:`open_mask`) gets the session last opened before it."""
        stamps = _ns(index)
        if stamps.size == 0:
            return np.empty(0, "datetime64[D]")
        arrays = self._cover(stamps)
        i = np.searchsorted(arrays["open"], stamps, side="right") - 1
        return arrays["date"][np.maximum(i, 0)].astype("datetime64[D]")

    def session_of(self, index: pd.DatetimeIndex) -> dict[str, np.ndarray]:
        """Per bar, the session last opened at or before it: ``date`` (datetime64[D]),
        ``open`` and ``close`` (int64 UTC ns), ``inside`` (bool: before that session's close)."""
        stamps = _ns(index)
        arrays = self._cover(stamps) if stamps.size else self._cover(np.zeros(1, np.int64))
        i = np.maximum(np.searchsorted(arrays["open"], stamps, side="right") - 1, 0)
        opens, closes = arrays["open"][i], arrays["close"][i]
        return {"date": arrays["date"][i].astype("datetime64[D]"), "open": opens, "close": closes,
                "inside": stamps < closes}  # fmt: skip

    def open_mask(self, index: pd.DatetimeIndex) -> np.ndarray:
        """True where the bar starts inside a session (after the open, before the close and
        outside the session's break)."""
        stamps = _ns(index)
        if stamps.size == 0:
            return np.zeros(0, bool)
        starts, ends, _ = self._intervals(stamps)
        i = np.searchsorted(starts, stamps, side="right") - 1
        return (i >= 0) & (stamps < ends[np.maximum(i, 0)])

    def open_minutes(self, start: Any, end: Any) -> int:
        """Open-market minutes in the time span ``[start, end)`` (timestamps, UTC if naive)."""
        a, b = _stamp_ns(start), _stamp_ns(end)
        if b <= a:
            return 0
        starts, ends, cum = self._intervals(np.array([a, b], np.int64))
        done = _open_before(np.array([a, b], np.int64), starts, ends, cum)
        return int((done[1] - done[0]) // MINUTE_NS)

    def gaps(self, index: pd.DatetimeIndex, min_minutes: int = 1) -> pd.DataFrame:
        """Runs of missing open-market minutes between consecutive bars.

        For each pair of consecutive bars ``a < b`` the minutes ``[a + 1 min, b)`` are counted
        where the market is open; a run of at least ``min_minutes`` is one row: ``start`` (the
        first missing open minute), ``end`` (the end of the last one, exclusive), ``open_minutes``
        (how many) and ``closed_minutes`` (minutes of the run the market was closed: a break, a
        weekend, a holiday or an early close inside it). A closed market alone is never a gap.
        """
        if isinstance(min_minutes, bool) or not isinstance(min_minutes, int) or min_minutes < 1:
            raise ValueError(f"gaps min_minutes={min_minutes!r}: must be a whole number >= 1")
        stamps = _ns(index)
        columns = {"start": pd.DatetimeIndex([], tz="UTC"), "end": pd.DatetimeIndex([], tz="UTC"),
                   "open_minutes": np.empty(0, np.int64), "closed_minutes": np.empty(0, np.int64)}  # fmt: skip
        if stamps.size < 2:
            return pd.DataFrame(columns)
        if np.any(np.diff(stamps) <= 0):
            raise ValueError("gaps: bar timestamps must be strictly increasing")
        starts, ends, cum = self._intervals(stamps)
        a = stamps[:-1] + MINUTE_NS
        b = stamps[1:]
        fa, fb = _open_before(a, starts, ends, cum), _open_before(b, starts, ends, cum)
        missing = np.where(b > a, (fb - fa) // MINUTE_NS, 0)
        rows = np.flatnonzero(missing >= min_minutes)
        a, b, fa, fb = a[rows], b[rows], fa[rows], fb[rows]
        first = _at_open_time(fa, starts, cum, after=True)
        last_end = _at_open_time(fb, starts, cum, after=False)
        open_min = missing[rows]
        span = (last_end - first) // MINUTE_NS
        return pd.DataFrame({
            "start": pd.DatetimeIndex(first.astype("datetime64[ns]")).tz_localize("UTC"),
            "end": pd.DatetimeIndex(last_end.astype("datetime64[ns]")).tz_localize("UTC"),
            "open_minutes": open_min.astype(np.int64),
            "closed_minutes": (span - open_min).astype(np.int64),
        })  # fmt: skip

    # ------------------------------------------------------------------ annualization
    def annual(self, start: Any, end: Any) -> AnnualFigures:
        """Sessions and open minutes over the trading dates ``[start, end]`` (both included)."""
        first, last = _day(start), _day(end)
        if last < first:
            raise ValueError(f"calendar span {first}..{last}: the end is before the start")
        schedule = self._schedule(first, last)
        if schedule.empty:
            raise ValueError(f"calendar {self.name}: no session in {first}..{last}")
        minutes = _session_minutes(schedule)
        return AnnualFigures(self.name, first, last, int(len(schedule)), int(minutes.sum()))

    # ------------------------------------------------------------------ internals
    def _library_schedule(self, first: date, last: date) -> pd.DataFrame:
        return _library_schedule(self.name, first, last)

    def _schedule(self, first: date, last: date) -> pd.DataFrame:
        return _corrected_schedule(self.name, first, last)

    def _cover(self, stamps: np.ndarray, ahead: int = _MARGIN_DAYS) -> dict[str, np.ndarray]:
        """Session arrays spanning the stamps (with margins), loaded once per wider span."""
        lo = int(stamps.min() // DAY_NS) - _MARGIN_DAYS
        hi = int(stamps.max() // DAY_NS) + ahead
        if self._bounds is None or lo < self._bounds[0] or hi > self._bounds[1]:
            if self._bounds is not None:
                lo, hi = min(lo, self._bounds[0]), max(hi, self._bounds[1])
            schedule = self._schedule(_epoch_day(lo), _epoch_day(hi))
            if schedule.empty:
                raise ValueError(f"calendar {self.name}: no session between {_epoch_day(lo)} and {_epoch_day(hi)}")
            self._arrays = _arrays(schedule)
            self._bounds = (lo, hi)
        return self._arrays

    def _intervals(self, stamps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        arrays = self._cover(stamps)
        return arrays["iv_start"], arrays["iv_end"], arrays["iv_cum"]

    def stream_cover(self, ts_ns: int) -> dict[str, np.ndarray]:
        """The session arrays from shortly before one timestamp to a year after it (for
        one-bar-at-a-time callers: one schedule per year of bars)."""
        return self._cover(np.array([ts_ns], np.int64), ahead=_STREAM_AHEAD_DAYS)


# ----------------------------------------------------------------------------- helpers
@functools.lru_cache(maxsize=64)
def _library_schedule(name: str, first: date, last: date) -> pd.DataFrame:
    return mcal.get_calendar(name).schedule(first, last)


@functools.lru_cache(maxsize=64)
def _corrected_schedule(name: str, first: date, last: date) -> pd.DataFrame:
    raw = _good_friday_fix(_library_schedule(name, first, last))

    def utc(column: str) -> pd.Series:
        if column not in raw:
            return pd.Series(pd.NaT, index=raw.index, dtype="datetime64[ns, UTC]")
        return raw[column].astype("datetime64[ns, UTC]")

    opens, closes, bs, be = utc("market_open"), utc("market_close"), utc("break_start"), utc("break_end")
    # A break counts only where it lies inside the session and lasts: the library keeps the
    # columns with equal ends after a halt was abolished, and leaves them past an early close.
    bs = bs.where(bs > opens).clip(upper=closes)
    be = be.clip(upper=closes)
    real = be > bs
    out = pd.DataFrame({"open": opens, "close": closes, "break_start": bs.where(real), "break_end": be.where(real)})
    out.index = pd.DatetimeIndex(raw.index.to_numpy().astype("datetime64[ns]"), name="date")
    return out


def _good_friday_fix(schedule: pd.DataFrame) -> pd.DataFrame:
    """Drop the Good Friday sessions from 2023 on that are not in the library's own list of
    Good Fridays CME opens (the employment-report days of ``CME_Bond``; see the module doc)."""
    if schedule.empty:
        return schedule
    first, last = schedule.index[0], schedule.index[-1]
    fridays = GoodFriday.dates(max(first, pd.Timestamp(f"{_FIRST_GOOD_FRIDAY_RULE_YEAR}-01-01")), last)
    opened = {pd.Timestamp(d).tz_localize(None).normalize() for d in BondsGoodFridayOpen}
    closed = [d for d in fridays if d.normalize() not in opened]
    return schedule.drop(index=[d for d in closed if d in schedule.index])


def _arrays(schedule: pd.DataFrame) -> dict[str, np.ndarray]:
    """int64 UTC ns arrays of the sessions and of their open intervals (breaks cut out)."""
    opens = _col_ns(schedule["open"])
    closes = _col_ns(schedule["close"])
    bs, be = _col_ns(schedule["break_start"]), _col_ns(schedule["break_end"])
    has_break = bs != np.iinfo(np.int64).min
    iv_start = np.concatenate([opens, be[has_break]])
    iv_end = np.concatenate([np.where(has_break, bs, closes), closes[has_break]])
    order = np.argsort(iv_start, kind="stable")
    iv_start, iv_end = iv_start[order], iv_end[order]
    iv_cum = np.concatenate([[0], np.cumsum(iv_end - iv_start)])  # open ns before each interval
    return {"date": schedule.index.to_numpy().astype("datetime64[D]"), "open": opens, "close": closes,
            "iv_start": iv_start, "iv_end": iv_end, "iv_cum": iv_cum}  # fmt: skip


def _open_before(t: np.ndarray, starts: np.ndarray, ends: np.ndarray, cum: np.ndarray) -> np.ndarray:
    """Open ns from the first loaded interval's start up to each ``t``."""
    i = np.searchsorted(starts, t, side="right") - 1
    j = np.maximum(i, 0)
    inside = np.clip(t - starts[j], 0, ends[j] - starts[j])
    return np.where(i >= 0, cum[j] + inside, 0)


def _at_open_time(c: np.ndarray, starts: np.ndarray, cum: np.ndarray, after: bool) -> np.ndarray:
    """The instant at which ``c`` open ns have elapsed: the first open instant at or after it
    (``after``), or the end of open time at it (the last open instant's end, else)."""
    side: Literal["left", "right"] = "right" if after else "left"
    j = np.clip(np.searchsorted(cum, c, side=side) - 1, 0, len(starts) - 1)
    return starts[j] + (c - cum[j])


def _session_minutes(schedule: pd.DataFrame) -> np.ndarray:
    total = (_col_ns(schedule["close"]) - _col_ns(schedule["open"])) // MINUTE_NS
    bs, be = _col_ns(schedule["break_start"]), _col_ns(schedule["break_end"])
    has_break = bs != np.iinfo(np.int64).min
    return total - np.where(has_break, (be - bs) // MINUTE_NS, 0)


def _col_ns(column: pd.Series) -> np.ndarray:
    return pd.DatetimeIndex(column).as_unit("ns").asi8


def _ns(index: Any) -> np.ndarray:
    if isinstance(index, pd.DatetimeIndex):
        if index.tz is None:
            raise ValueError("calendar: bar timestamps have no time zone, expected UTC")
        return index.tz_convert("UTC").as_unit("ns").asi8
    values = np.asarray(index)
    if values.dtype.kind == "M":
        return values.astype("datetime64[ns]").astype(np.int64)
    return values.astype(np.int64)


def _stamp_ns(value: Any) -> int:
    stamp = pd.Timestamp(value)
    stamp = stamp.tz_localize("UTC") if stamp.tz is None else stamp.tz_convert("UTC")
    return int(stamp.as_unit("ns").value)


def _day(value: Any) -> date:
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    return pd.Timestamp(value).date()


def _epoch_day(days: int) -> date:
    return date(1970, 1, 1) + timedelta(days=days)


# ----------------------------------------------------------------------------- per asset
@functools.lru_cache(maxsize=16)
def _calendar(name: str) -> SessionCalendar:
    return SessionCalendar(name)


def calendar_for(asset: AssetSpec) -> SessionCalendar:
    """The calendar the asset's config names (``asset.calendar``), checked against its hours:
    the calendar's regular session must open and close at ``asset.session_open``/``session_close``
    (``asset.session_tz``), else a one-line :class:`CalendarError` naming the keys."""
    cal = _calendar(asset.calendar)
    _check_hours(cal, asset)
    return cal


# The library gives its regular hours as clock times in its own zone; they are compared with
# the asset's in the asset's zone on this date (any date away from a daylight-saving change:
# Chicago and New York change together, so the offset between them never varies).
_ZONE_REFERENCE_DATE = date(2024, 1, 2)


def _regular_hours(cal: SessionCalendar, zone: str) -> tuple[str, str]:
    """The calendar's regular open and close as local "HH:MM" in ``zone``."""

    def local(t) -> str:
        moment = datetime.combine(_ZONE_REFERENCE_DATE, t, tzinfo=ZoneInfo(cal.zone)).astimezone(ZoneInfo(zone))
        return moment.strftime("%H:%M")

    return local(cal._cal.open_time), local(cal._cal.close_time)


def _check_hours(cal: SessionCalendar, asset: AssetSpec) -> None:
    opens, closes = _regular_hours(cal, asset.session_tz)
    if (opens, closes) != (asset.session_open, asset.session_close):
        raise CalendarError(
            f"asset.calendar={cal.name!r}: its regular session is {opens}-{closes} {asset.session_tz}, "
            f"but asset.session_open/session_close say {asset.session_open}-{asset.session_close} ({asset.key})"
        )
