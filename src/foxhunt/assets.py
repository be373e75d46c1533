"""Contract specifications of the CME futures foxhunt trades.

An :class:`AssetSpec` is built by Hydra from ``conf/asset/<name>.yaml`` (``_target_`` points
here). It carries what the exchange publishes (tick, multiplier, session hours) and the
parameters the synthetic source needs to generate realistic bars (price level, daily
volatility). Every other module reads contract facts from this object, never from literals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import time
from zoneinfo import ZoneInfo

import numpy as np

from foxhunt.errors import ConfigError


@dataclass(frozen=True)
class AssetSpec:
    """One CME futures contract family (the parent symbol, e.g. ``ES.FUT``).

    Session hours are given in the exchange's local time zone: Globex opens on the evening
    before the trading date (``session_open``, Sunday to Thursday) and closes at
    ``session_close`` (Monday to Friday), with a daily maintenance break between close and
    the next open. Holidays, early closes and the sessions' actual bounds come from the
    exchange calendar ``calendar`` names (:func:`foxhunt.data.calendar.calendar_for`, which
    checks its regular hours against these).
    """

    key: str  # short name used in configs and run names: es, nq, 6e, zn
    symbol: str  # Databento parent symbol: ES.FUT
    root: str  # contract root: ES
    description: str
    currency: str
    tick_size: float  # minimum price increment, in price units
    multiplier: float  # contract value per 1.0 of price, in USD
    tick_value: float  # USD per tick; must equal tick_size * multiplier
    session_tz: str  # IANA zone of the session hours, e.g. America/New_York
    session_open: str  # "HH:MM" local, Globex open (evening before the trade date)
    session_close: str  # "HH:MM" local, Globex close
    calendar: str  # pandas-market-calendars name of the exchange calendar (foxhunt.data.calendar)
    price_level: float  # typical price, the synthetic source's starting level
    daily_vol: float  # typical daily return volatility (fraction, e.g. 0.01 = 1%)

    def __post_init__(self) -> None:
        for name in ("tick_size", "multiplier", "tick_value", "price_level", "daily_vol"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(f"asset.{name}={value!r}: must be a positive number")
        if not math.isclose(self.tick_value, self.tick_size * self.multiplier, rel_tol=1e-9):
            raise ConfigError(
                f"asset.tick_value={self.tick_value}: must equal tick_size x multiplier "
                f"= {self.tick_size * self.multiplier:g} for {self.symbol}"
            )
        try:
            ZoneInfo(self.session_tz)
        except (ValueError, KeyError):  # an unknown zone (ZoneInfoNotFoundError is a KeyError), or not a zone name
            raise ConfigError(f"asset.session_tz={self.session_tz!r}: not an IANA time zone (e.g. America/New_York)") from None
        if not (isinstance(self.calendar, str) and self.calendar.strip()):
            raise ConfigError(f"asset.calendar={self.calendar!r}: must name an exchange calendar (e.g. CME_Equity)")
        self.open_time, self.close_time  # noqa: B018  (parse now: fail early on a bad "HH:MM")

    @property
    def open_time(self) -> time:
        return _parse_hhmm(self.session_open, "asset.session_open")

    @property
    def close_time(self) -> time:
        return _parse_hhmm(self.session_close, "asset.session_close")

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.session_tz)

    @property
    def session_minutes(self) -> int:
        """Minutes of trading in one Globex session (open on the evening before, to close)."""
        o, c = self.open_time, self.close_time
        return (24 * 60 - (o.hour * 60 + o.minute)) + c.hour * 60 + c.minute

    def round_to_tick(self, price):
        """Nearest price on the tick grid (works on floats and numpy arrays)."""
        return np.round(np.asarray(price, dtype=np.float64) / self.tick_size) * self.tick_size


def _parse_hhmm(text: str, key: str) -> time:
    try:
        hh, mm = text.split(":")
        return time(int(hh), int(mm))
    except (ValueError, AttributeError):
        raise ConfigError(f"{key}={text!r}: must be a local time 'HH:MM'") from None
