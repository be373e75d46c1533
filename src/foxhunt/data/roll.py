"""Continuous futures without look-ahead: the roll schedule and back-adjustment.

A parent symbol (ES.FUT) trades several contract months at once; a training series follows
one of them per session and moves to the next before the held one expires. Three rules,
all decided from what was known before the session opened:

* ``by: volume``: the contract of session D is the one that traded the most contracts in
  the last session before D in the data (never the volume of D itself: the choice would
  then use information from later in D's own day);
* ``by: open_interest``: the contract with the largest open interest published (Databento
  statistics records, ``ts_recv``) before D's first bar;
* ``expiry_sessions: N`` (optional, with either): roll at the latest when N sessions or
  fewer remain to the held contract's expiration (Databento definition records).

A roll never goes back to an earlier expiry. The first session of the data, with nothing
before it to read, holds the nearest expiry that is not expired; a contract past its
expiration (known from the definition records or, without them, its contract month) is never
held, and a session where the decided contract has no bar moves to the nearest later expiry
that has one (each row of the schedule says which of these happened and why).

**The roll as a trade.** The held position moves from the old contract to the new one at the
session boundary: closed at the old contract's last close, reopened at the new contract's
price at that moment (its last close at or before the old contract's last bar; its first open
when it had not traded yet). That price is the roll bar's ``roll_price``; what a position held
over a roll bar earns and costs (the move from ``roll_price``, two contracts' costs) is
:mod:`foxhunt.trading.pnl`'s.

**Back-adjustment** (``adjust``) makes the series features read continuous; the latest
contract keeps its raw prices and history is shifted:

* ``difference``: every bar before a roll moves by the roll's gap ``roll_price - old close``
  (point moves exact; log returns of early history change with the level);
* ``ratio``: every bar before a roll is multiplied by ``roll_price / old close`` (returns
  exact, so return features equal what a live reader of the raw contracts computes);
* ``none``: raw prices (the series jumps by the spread at each roll).

Trading always uses the raw prices and ``roll_price``: PnL is what an account would have
seen. Written by hand: no maintained library builds look-ahead-free continuous contracts
from Databento or Lean bars (nautilus_trader back-adjusts only from a roll table the user
gives; pandas and the market-calendar libraries do not roll).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from foxhunt.assets import AssetSpec
from foxhunt.data.bars import BAR_COLUMNS, INDEX_NAME, validate_bars
from foxhunt.data.calendar import calendar_for
from foxhunt.data.errors import BarDataError

ROLL_BY = ("volume", "open_interest")
ADJUSTMENTS = ("none", "difference", "ratio")
ROLL_KEYS = ("by", "expiry_sessions")  # data.source.roll's mapping
PRICE_COLUMNS = ("open", "high", "low", "close")
RAW_CLOSE = "raw_close"  # column of a continuous frame: the held contract's own close
ROLL_PRICE = "roll_price"  # column: the new contract's entry price on a roll bar, NaN elsewhere
CONTRACT = "contract"  # column: the contract each bar is taken from
ROLL_SCHEDULE_FILE = "roll_schedule.csv"  # the artifact of a run whose source rolls
SCHEDULE_COLUMNS = ("session", "first_bar", "from_contract", "to_contract", "reason",
                    "from_price", "roll_price", "gap")  # fmt: skip


@dataclass(frozen=True)
class RollRule:
    """How a continuous series rolls (``data.source.roll`` and ``data.source.adjust``): every field from
    the config (conf/data/<source>.yaml holds the defaults)."""

    by: str
    expiry_sessions: int | None
    adjust: str

    def __post_init__(self) -> None:
        if self.by not in ROLL_BY:
            raise ValueError(f"roll.by={self.by!r}: must be one of {', '.join(ROLL_BY)}")
        n = self.expiry_sessions
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ValueError(f"roll.expiry_sessions={n!r}: must be null or an integer >= 0")
        if self.adjust not in ADJUSTMENTS:
            raise ValueError(f"adjust={self.adjust!r}: must be one of {', '.join(ADJUSTMENTS)}")

    @classmethod
    def from_config(cls, roll: Any, adjust: str) -> RollRule:
        """From the source's ``roll`` mapping (``by``, ``expiry_sessions``: both) and ``adjust``; the short form
        ``roll=volume`` is ``{by: volume, expiry_sessions: null}``."""
        if isinstance(roll, str):
            roll = {"by": roll, "expiry_sessions": None}
        if not isinstance(roll, Mapping):
            raise ValueError(f"roll={roll!r}: must be a mapping with keys {', '.join(ROLL_KEYS)}")
        unknown = sorted(set(roll) - set(ROLL_KEYS))
        if unknown:
            raise ValueError(f"roll.{unknown[0]}: unknown key (allowed: {', '.join(ROLL_KEYS)})")
        missing = [key for key in ROLL_KEYS if key not in roll]
        if missing:
            raise ValueError(f"roll.{missing[0]}: missing (the mapping needs {', '.join(ROLL_KEYS)})")
        return cls(by=str(roll["by"]), expiry_sessions=roll["expiry_sessions"], adjust=str(adjust))

    def params(self) -> dict[str, Any]:
        return {"by": self.by, "expiry_sessions": self.expiry_sessions, "adjust": self.adjust}


@dataclass
class Contracts:
    """What the roll reads: every candidate contract's bars and what is known of each contract.

    ``bars``: columns ``ts`` (UTC bar start), ``session`` (trading date, datetime64[D]),
    ``contract``, ``open/high/low/close/volume``. ``rank``: contract -> expiry order (larger =
    later). ``expiration``: contract -> expiration time (UTC), where definition records give
    it. ``last_month_day``: contract -> the last day of its contract month (an upper bound of
    the expiry without definitions). ``open_interest``: columns ``contract``, ``published``
    (UTC), ``value``, or None.
    """

    bars: pd.DataFrame
    rank: dict[Any, float]
    expiration: dict[Any, pd.Timestamp]
    last_month_day: dict[Any, pd.Timestamp]
    open_interest: pd.DataFrame | None = None


def roll_schedule(contracts: Contracts, rule: RollRule, sessions_until) -> pd.DataFrame:
    """The contract held in each session of ``contracts.bars``, and why.

    ``sessions_until(session, day)``: sessions from ``session`` (inclusive) to ``day``
    (inclusive) by the asset's calendar. Returns one row per session: ``session``,
    ``contract``, ``rolled`` (bool: a different contract than the session before) and
    ``reason`` (one sentence).
    """
    bars = contracts.bars
    if rule.expiry_sessions is not None and len(contracts.expiration) < len(contracts.rank):
        missing = sorted(map(str, set(contracts.rank) - set(contracts.expiration)))
        raise BarDataError(
            f"roll.expiry_sessions={rule.expiry_sessions} needs each contract's expiration from Databento "
            f"definition records (data.source.definitions=...): none for {', '.join(missing[:5])}"
        )
    if rule.by == "open_interest" and (contracts.open_interest is None or contracts.open_interest.empty):
        raise BarDataError(
            "roll.by=open_interest needs open interest: Databento statistics records (schema statistics) in data.source.path"
        )
    volume = bars.groupby(["session", "contract"], sort=True)["volume"].sum().unstack(fill_value=0.0)
    first_bar = bars.groupby("session")["ts"].min()
    sessions = list(volume.index)
    rows = []
    held = None
    for i, session in enumerate(sessions):
        trading = set(volume.columns[volume.loc[session].to_numpy() > 0])
        day = pd.Timestamp(session)
        alive = [c for c in contracts.rank if not _expired(contracts, c, day)]
        reason = ""
        if held is None:
            choice = _nearest(contracts, alive, trading)
            reason = "first session: nearest expiry not yet expired"
        else:
            choice = held
            stats, what, when = _stats_before(contracts, rule, volume, sessions, i, first_bar[session])
            leader = _leader(contracts, stats, alive)
            if leader is not None and contracts.rank[leader] > contracts.rank[held]:
                choice = leader
                reason = (f"{leader} {what} {held} {when} "
                          f"({stats[leader]:,.0f} vs {stats.get(held, 0.0):,.0f})")  # fmt: skip
        if rule.expiry_sessions is not None and choice is not None:
            later = [c for c in alive if contracts.rank[c] > contracts.rank[choice]]
            expiry = contracts.expiration[choice]
            left = sessions_until(day, expiry)
            if left <= rule.expiry_sessions and later:
                nxt = _nearest(contracts, later, trading)
                reason = f"{left} session(s) left to {choice}'s expiry {expiry:%Y-%m-%d} (expiry_sessions={rule.expiry_sessions})"
                choice = nxt
        if choice is None or choice not in alive:
            nxt = _nearest(contracts, [c for c in alive if held is None or contracts.rank[c] >= contracts.rank[held]], trading)
            if choice is not None:
                reason = f"{choice} expired before this session"
            choice = nxt
        if choice not in trading:
            later = [c for c in trading if c in alive and contracts.rank[c] >= contracts.rank[choice]]
            if not later:
                raise BarDataError(
                    f"session {day:%Y-%m-%d}: no bar of {choice} nor of a later contract (contracts trading: "
                    f"{', '.join(sorted(map(str, trading)))})"
                )
            nxt = _nearest(contracts, later, trading)
            reason = f"{choice} has no bar in this session"
            choice = nxt
        rolled = held is not None and choice != held
        rows.append({"session": day, "contract": choice, "rolled": rolled,
                     "reason": reason if (rolled or held is None) else ""})  # fmt: skip
        held = choice
    return pd.DataFrame(rows)


def continuous(contracts: Contracts, schedule: pd.DataFrame, adjust: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The continuous frame of ``schedule`` and its rolls.

    Returns ``(frame, rolls)``: ``frame`` is indexed by bar start (UTC) with the adjusted
    ``open/high/low/close`` (raw when ``adjust="none"``), ``volume``, ``raw_close``,
    ``roll_price`` (NaN except on a roll bar) and ``contract``; ``rolls`` has the columns
    :data:`SCHEDULE_COLUMNS`, one row per roll (``gap``: roll_price - from_price).
    """
    if adjust not in ADJUSTMENTS:
        raise ValueError(f"adjust={adjust!r}: must be one of {', '.join(ADJUSTMENTS)}")
    bars = contracts.bars
    held = schedule.set_index("session")["contract"]
    chosen = bars["session"].map(held).to_numpy()
    picked = bars.loc[bars["contract"].to_numpy() == chosen].sort_values("ts", kind="stable").reset_index(drop=True)
    if picked["ts"].duplicated().any():
        ts = picked.loc[picked["ts"].duplicated(), "ts"].iloc[0]
        both = picked.loc[picked["ts"] == ts].head(2)
        named = [" ".join(f"{key} {row[key]}" if key != "file" else str(row[key]) for key in ("file", "line", "record") if key in both)
                 for _, row in both.iterrows()]  # fmt: skip  # which files: neither was named (found by a helper)
        where = f" ({' and '.join(named)})" if all(named) else ""
        raise BarDataError(f"two bars of the held contract at {ts}{where}: the files overlap")
    contract = picked["contract"].to_numpy()
    close = picked["close"].to_numpy(np.float64)
    roll_at = np.flatnonzero(contract[1:] != contract[:-1]) + 1
    roll_price = np.full(len(picked), np.nan)
    reasons = schedule.set_index("session")["reason"]
    by_contract = {c: g for c, g in bars.groupby("contract", sort=False)}
    rolls = []
    for t in roll_at:
        new = by_contract[contract[t]]
        before = new.loc[new["ts"] <= picked["ts"].iloc[t - 1]]
        entry = float(before.sort_values("ts")["close"].iloc[-1]) if len(before) else float(picked["open"].iloc[t])
        roll_price[t] = entry
        session = pd.Timestamp(picked["session"].iloc[t])
        rolls.append({
            "session": session, "first_bar": picked["ts"].iloc[t], "from_contract": contract[t - 1],
            "to_contract": contract[t], "reason": str(reasons.get(session, "")), "from_price": close[t - 1],
            "roll_price": entry, "gap": entry - close[t - 1],
        })  # fmt: skip
    offset, scale = _adjustment(close, roll_at, roll_price, adjust)
    out = pd.DataFrame(index=pd.DatetimeIndex(picked["ts"]).rename("ts"))
    for column in PRICE_COLUMNS:
        out[column] = picked[column].to_numpy(np.float64) * scale + offset
    out["volume"] = picked["volume"].to_numpy(np.float64)
    out[RAW_CLOSE] = close
    out[ROLL_PRICE] = roll_price
    out[CONTRACT] = contract
    if adjust == "difference" and not (out["low"].to_numpy() > 0).all():
        first = out.index[int(np.argmax(out["low"].to_numpy() <= 0))]
        raise BarDataError(
            f"adjust=difference makes the price at {first} <= 0 (the gaps of later rolls add up past the "
            "price level): use adjust=ratio"
        )
    return out, pd.DataFrame(rolls, columns=list(SCHEDULE_COLUMNS))


def schedule_rows(rolls: pd.DataFrame) -> list[dict[str, Any]]:
    """The rolls as JSON-ready rows (ISO dates, plain floats)."""
    out = []
    for row in rolls.itertuples(index=False):
        out.append({
            "session": f"{pd.Timestamp(row.session):%Y-%m-%d}",
            "first_bar": pd.Timestamp(row.first_bar).isoformat(),
            "from_contract": str(row.from_contract), "to_contract": str(row.to_contract),
            "reason": str(row.reason), "from_price": float(row.from_price),
            "roll_price": float(row.roll_price), "gap": float(row.gap),
        })  # fmt: skip
    return out


@dataclass
class ContinuousSeries:
    """A rolled series: ``frame`` (see :func:`continuous`), ``schedule`` (the contract of
    every session, :func:`roll_schedule`) and ``rolls`` (one row per roll)."""

    frame: pd.DataFrame
    schedule: pd.DataFrame
    rolls: pd.DataFrame

    def bars(self) -> pd.DataFrame:
        """The bars frame a source's ``load`` returns: ``open/high/low/close/volume`` (adjusted),
        ``raw_close``, ``roll_price``, ``contract``; ``attrs["rolls"]`` the rolls as JSON rows."""
        frame = self.frame.rename_axis(INDEX_NAME)
        frame.attrs["rolls"] = schedule_rows(self.rolls)
        return frame

    def front_months(self) -> pd.Series:
        """The contract held in each session (index: trading date)."""
        held = self.schedule.set_index("session")["contract"]
        return held.rename_axis("trade_date").rename("contract")


def single_contract(contract_bars: pd.DataFrame, asset: AssetSpec, origin: str) -> ContinuousSeries:
    """One contract's bars as a series that never rolls (``symbol=`` given, or a file of one
    instrument id)."""
    bars = contract_bars.sort_values("ts", kind="stable")
    index = pd.DatetimeIndex(bars["ts"]).rename(INDEX_NAME)
    frame = validate_bars(pd.DataFrame({c: bars[c].to_numpy() for c in BAR_COLUMNS}, index=index), asset.tick_size, origin=origin)
    frame[RAW_CLOSE] = frame["close"].to_numpy(np.float64)
    frame[ROLL_PRICE] = np.nan
    frame[CONTRACT] = bars["contract"].to_numpy()
    sessions = pd.unique(calendar_for(asset).trading_dates(frame.index))
    schedule = pd.DataFrame({"session": pd.DatetimeIndex(sessions), "contract": bars["contract"].iloc[0],
                             "rolled": False, "reason": ""})  # fmt: skip
    schedule.loc[:0, "reason"] = "a single contract: no roll"
    return ContinuousSeries(frame=frame, schedule=schedule, rolls=pd.DataFrame(columns=list(SCHEDULE_COLUMNS)))


def build_continuous(contract_bars: pd.DataFrame, asset: AssetSpec, rule: RollRule,
                     expiration: Mapping[Any, pd.Timestamp] | None = None,
                     open_interest: pd.DataFrame | None = None) -> ContinuousSeries:  # fmt: skip
    """Roll ``contract_bars`` (columns ``ts``, ``contract``, ``rank`` (expiry order), ``month``
    (contract month as year * 12 + month - 1), ``open/high/low/close/volume``) by ``rule``.

    Sessions are the trading dates of the asset's exchange calendar
    (:meth:`foxhunt.data.calendar.SessionCalendar.trading_dates`), and so are the sessions
    counted to an expiration;
    ``expiration``: contract -> UTC expiration (definition contract_bars); ``open_interest``:
    columns ``contract``, ``published``, ``value``.
    """
    calendar = calendar_for(asset)
    bars = contract_bars.copy()
    bars["session"] = calendar.trading_dates(pd.DatetimeIndex(bars["ts"]))
    ranks = bars.groupby("contract", sort=False)["rank"].first()
    months = bars.groupby("contract", sort=False)["month"].first()
    contracts = Contracts(
        bars=bars,
        rank={c: float(r) for c, r in ranks.items()},
        expiration={c: pd.Timestamp(e) for c, e in (expiration or {}).items() if c in ranks.index},
        last_month_day={c: _month_end(m) for c, m in months.items() if not pd.isna(m)},
        open_interest=open_interest,
    )

    def sessions_until(session: pd.Timestamp, expiry: pd.Timestamp) -> int:
        last = calendar.trading_dates(pd.DatetimeIndex([expiry]))[0]
        return len(calendar.sessions(session, last)) if last >= np.datetime64(session.date(), "D") else 0

    schedule = roll_schedule(contracts, rule, sessions_until)
    frame, rolls = continuous(contracts, schedule, rule.adjust)
    return ContinuousSeries(frame=frame, schedule=schedule, rolls=rolls)


def write_schedule(rolls: list[dict[str, Any]], path: Path) -> Path:
    """``rolls`` (:func:`schedule_rows` rows) as a CSV with the columns
    :data:`SCHEDULE_COLUMNS` (a header only when the data never rolled)."""
    pd.DataFrame(rolls, columns=list(SCHEDULE_COLUMNS)).to_csv(path, index=False)
    return path


# ----------------------------------------------------------------------------- internals
def _month_end(month: float) -> pd.Timestamp:
    year, index = divmod(int(month), 12)
    return pd.Timestamp(year=year, month=index + 1, day=1) + pd.offsets.MonthEnd(0)


def _adjustment(close: np.ndarray, roll_at: np.ndarray, roll_price: np.ndarray, adjust: str):
    """(offset, scale) arrays: adjusted = raw * scale + offset, the last contract unchanged."""
    n = len(close)
    offset, scale = np.zeros(n), np.ones(n)
    for t in roll_at[::-1]:  # each roll shifts every bar before it
        if adjust == "difference":
            offset[:t] += roll_price[t] - close[t - 1]
        elif adjust == "ratio":
            scale[:t] *= roll_price[t] / close[t - 1]
    return offset, scale


def _expired(contracts: Contracts, contract, day: pd.Timestamp) -> bool:
    """Past its expiration before ``day``'s session (a day after the contract month without
    definitions: the expiry falls inside the month)."""
    expiry = contracts.expiration.get(contract)
    if expiry is not None:
        return expiry.tz_convert(None).normalize() < day
    last = contracts.last_month_day.get(contract)
    return last is not None and last < day


def _nearest(contracts: Contracts, candidates, trading):
    """The nearest expiry among ``candidates``, preferring those with bars in the session."""
    pool = [c for c in candidates if c in trading] or list(candidates)
    return min(pool, key=lambda c: contracts.rank[c]) if pool else None


def _stats_before(contracts: Contracts, rule: RollRule, volume: pd.DataFrame, sessions, i: int, opens):
    """(contract -> figure, verb, when) known before session ``i`` opens."""
    if rule.by == "volume":
        previous = sessions[i - 1]
        row = volume.loc[previous]
        return ({c: float(v) for c, v in row.items() if v > 0}, "outtraded",
                f"in session {pd.Timestamp(previous):%Y-%m-%d}")  # fmt: skip
    oi = contracts.open_interest
    assert oi is not None  # by open_interest: checked present before the roll is built
    known = oi.loc[oi["published"] < opens].sort_values("published")
    latest = known.groupby("contract")["value"].last()
    return {c: float(v) for c, v in latest.items()}, "had more open interest than", f"published before {opens:%Y-%m-%d %H:%M} UTC"


def _leader(contracts: Contracts, stats: dict, alive) -> Any:
    """The contract with the largest figure among the unexpired ones (ties: earlier expiry)."""
    pool = [c for c in alive if c in stats and stats[c] > 0 and not math.isnan(stats[c])]
    if not pool:
        return None
    return min(pool, key=lambda c: (-stats[c], contracts.rank[c]))
