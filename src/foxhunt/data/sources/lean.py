"""QuantConnect Lean futures minute data (one zip per day) as a bars source.

Lean stores futures minute trade bars as one zip per day (``YYYYMMDD_trade.zip``; the
samples here are named ``minute_es_YYYYMMDD_trade.zip``) holding one CSV per contract,
``YYYYMMDD_<root>_minute_trade_<YYYYMM>.csv`` (``..._201312.csv`` = the December 2013
contract, ESZ13), with rows ``ms_since_midnight,open,high,low,close,volume``: no header,
decimal prices, the bar labelled at its START.

Time zone, verified on the ES sample data rather than assumed: the first column counts
milliseconds from midnight UTC of the file's date. The daily breaks prove it: in October
2013 (US daylight time) the ES bars stop at 20:15 and 21:15 and resume at 20:30 and 22:00,
in November/December (standard time) at 21:15/22:15 and 21:30/23:00 - the CME halt
16:15-16:30 and maintenance 17:15-18:00 New York time, moving with daylight saving as only
UTC stamps do; the Sunday session starts at 22:00 (2013-10-06) and 23:00 (2020-01-05),
18:00 New York time both. ``timezone`` is kept as an argument for Lean data stored in
exchange time.

Several contracts trade each day; :mod:`foxhunt.data.roll` picks the contract of each CME
trading date from the previous session's volume (Lean has no definition or open interest
records here, so ``roll.by`` is volume and ``roll.expiry_sessions`` is refused), records the
roll schedule and back-adjusts (``adjust``). Zips whose CSVs are not minute trade bars (Lean's
``daily``/``hour`` files, quote files) are skipped when ``path`` is a directory or glob,
and rejected when named directly. Each contract's CSV is checked with
:func:`~foxhunt.data.bars.validate_bars` (origin ``<zip>:<csv>``, line numbers from 1).
"""

from __future__ import annotations

import re
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from foxhunt.assets import AssetSpec
from foxhunt.data.bars import (
    BAR_COLUMNS,
    INDEX_NAME,
    check_path_setting,
    resolve_files,
    source_fingerprint,
    unreadable,
    validate_bars,
)
from foxhunt.data.errors import BarDataError
from foxhunt.data.roll import ContinuousSeries, RollRule, build_continuous
from foxhunt.data.sources.databento import MONTH_CODES

LEAN_COLUMNS = ("ms", "open", "high", "low", "close", "volume")
MS_PER_MINUTE, MS_PER_DAY = 60_000, 86_400_000
MAX_MEMBER_BYTES = 64 << 20  # far above a day of minute bars (about 100 KB): a zip bomb is refused unread
_MEMBER = re.compile(r"^(?P<date>\d{8})_(?P<root>[a-z0-9]+)_minute_trade_(?P<contract>\d{6})(?:_\d{8})?\.csv$", re.IGNORECASE)


def lean_contract_symbol(root: str, contract_month: str) -> str:
    """CME symbol with a two-digit year for a Lean contract month: ("es", "201312") -> "ESZ13"."""
    year, month = int(contract_month[:4]), int(contract_month[4:])
    return f"{root.upper()}{MONTH_CODES[month - 1]}{year % 100:02d}"


class LeanMinuteSource:
    """Front-month 1-minute bars from Lean futures minute zips.

    Every setting comes from the config (conf/data/lean.yaml holds the defaults: UTC, rolled by volume, not adjusted).

    Args:
        path: a zip, a directory of zips or a glob.
        timezone: the zone in which the first column counts from midnight of the file's
            date ("UTC" for Lean futures data, verified on the ES samples).
        roll: the roll rule (:class:`foxhunt.data.roll.RollRule`); ``by: volume`` only.
        adjust: back-adjustment of the continuous prices: none, difference or ratio.
    """

    def __init__(self, path: str, timezone: str, roll: Any, adjust: str) -> None:
        check_path_setting(path, "a Lean minute zip")
        self.rule = RollRule.from_config(roll, adjust)
        if self.rule.by != "volume" or self.rule.expiry_sessions is not None:
            raise ValueError(
                f"roll={self.rule.params()}: Lean minute data rolls by volume only (no open interest "
                "or expiration records): set roll.by=volume, roll.expiry_sessions=null"
            )
        try:
            pd.Timestamp("2024-01-01").tz_localize(timezone)
        except Exception as exc:  # noqa: BLE001 - any failure means an unusable zone
            raise ValueError(f"timezone={timezone!r}: not a known time zone ({exc})") from None
        self.path = str(path)
        self.timezone = timezone

    # ------------------------------------------------------------------ public API
    def files(self) -> list[Path]:
        return resolve_files(self.path, (".zip",), "Lean minute zips")

    def load(self, asset: AssetSpec) -> pd.DataFrame:
        """The continuous 1-minute bars, start-labelled in UTC (columns as
        :meth:`foxhunt.data.roll.ContinuousSeries.bars`)."""
        return self.continuous(asset).bars()

    def continuous(self, asset: AssetSpec) -> ContinuousSeries:
        """The rolled series with its schedule and rolls (:mod:`foxhunt.data.roll`)."""
        return build_continuous(self.read_contracts(asset), asset, self.rule)

    def front_months(self, asset: AssetSpec) -> pd.Series:
        """The contract used on each CME trading date (values like "ESZ13")."""
        return self.continuous(asset).front_months()

    def read_contracts(self, asset: AssetSpec) -> pd.DataFrame:
        """Every contract's bars for the asset's root: columns ts, open..volume, contract
        ("ESZ13"), rank (expiry year*12+month-1), file, line."""
        files = self.files()
        named_directly = Path(self.path).expanduser().is_file()
        root = asset.root.lower()
        frames = []
        found_roots: set[str] = set()
        for file in files:
            try:
                with zipfile.ZipFile(file) as archive:
                    members = archive.namelist()
                    usable = [(m, match) for m in members if (match := _MEMBER.match(Path(m).name)) is not None]
                    if not usable:
                        if named_directly:
                            raise BarDataError(
                                f"{file}: no Lean minute trade CSV (YYYYMMDD_<root>_minute_trade_YYYYMM.csv) "
                                f"among {', '.join(members) or 'no members'}"
                            )
                        continue
                    found_roots.update(match["root"].lower() for _, match in usable)
                    for member, match in usable:
                        if match["root"].lower() != root:
                            continue
                        size = archive.getinfo(member).file_size
                        if size > MAX_MEMBER_BYTES:  # a 349 KB zip of one 150 MB member took 1 GB before a line was
                            # refused (found by a helper): a day of one contract's minute bars is about 100 KB
                            raise BarDataError(f"{file}:{member}: {size:,} bytes uncompressed, more than the "
                                               f"{MAX_MEMBER_BYTES:,} a day of minute bars could hold: not read")  # fmt: skip
                        with archive.open(member) as handle:
                            frames.append(self._read_member(file, member, match, handle, asset))
            except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
                raise unreadable(file, exc, "zip") from None
        if not frames:
            roots = sorted(found_roots - {root})
            other = f" (the zips hold root {', '.join(roots)}: is asset={asset.key} the right asset?)" if roots else ""
            raise BarDataError(f"{self.path}: no Lean minute trade bars for root {root}{other}")
        return pd.concat(frames, ignore_index=True)

    def fingerprint(self, asset: AssetSpec) -> str:
        params = {"path": self.path, "timezone": self.timezone, "roll": self.rule.params()}
        return source_fingerprint("lean", params, asset, self.files())

    # ------------------------------------------------------------------ internals
    def _read_member(self, file: Path, member: str, match: re.Match, handle, asset: AssetSpec) -> pd.DataFrame:
        origin = f"{file}:{member}"
        if not 1 <= int(match["contract"][4:]) <= 12:  # 13 was an IndexError traceback, 00 read as December (found by a helper)
            raise BarDataError(f"{origin}: contract month {match['contract']} is not a month (YYYYMM, MM 01..12)")
        try:
            raw = pd.read_csv(handle, header=None)
        except (zipfile.BadZipFile, EOFError, zlib.error) as exc:  # a damaged member
            raise unreadable(origin, exc, "zip member") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise BarDataError(f"{origin}: cannot read as CSV ({' '.join(str(exc).split())})") from None
        if raw.shape[1] != len(LEAN_COLUMNS):
            raise BarDataError(f"{origin}: {raw.shape[1]} columns, expected {len(LEAN_COLUMNS)} ({','.join(LEAN_COLUMNS)})")
        raw.columns = list(LEAN_COLUMNS)
        lines = np.arange(len(raw), dtype=np.int64) + 1  # no header: the first row is line 1
        ms = pd.to_numeric(raw["ms"], errors="coerce")
        bad = np.flatnonzero(ms.isna().to_numpy())
        if bad.size:
            i = int(bad[0])
            raise BarDataError(f"{origin}: line {lines[i]}: field 'ms'={raw['ms'].iloc[i]!r} is not milliseconds")
        values = ms.to_numpy(dtype=np.float64)
        bad = np.flatnonzero((values < 0) | (values >= MS_PER_DAY) | (values % MS_PER_MINUTE != 0))
        if bad.size:  # a time before or after the day, or not a bar's whole minute: read as another day's bar
            i = int(bad[0])
            shown = raw["ms"].iloc[i]
            shown = shown.item() if isinstance(shown, np.generic) else shown  # -60000, not np.int64(-60000)
            raise BarDataError(f"{origin}: line {lines[i]}: field 'ms'={shown!r} is not the start of a minute of "
                               f"the day (0..{MS_PER_DAY - MS_PER_MINUTE:,} in steps of {MS_PER_MINUTE:,})")  # fmt: skip
        wall = pd.DatetimeIndex(pd.Timestamp(match["date"]) + pd.to_timedelta(ms.to_numpy(dtype=np.int64), unit="ms"))
        try:  # the count is wall-clock time of day in `timezone`
            index = wall.tz_localize(self.timezone, ambiguous="raise", nonexistent="raise").tz_convert("UTC")
        except Exception as exc:  # noqa: BLE001 - pandas raises several types here
            raise BarDataError(
                f"{origin}: times do not exist or are ambiguous in {self.timezone} ({' '.join(str(exc).split())})"
            ) from None
        frame = pd.DataFrame({c: raw[c].to_numpy() for c in BAR_COLUMNS}, index=index)
        bars = validate_bars(frame, asset.tick_size, origin=origin, rows=lines, row_name="line")
        contract = match["contract"]
        out = bars.reset_index().rename(columns={INDEX_NAME: "ts"})
        out["contract"] = lean_contract_symbol(match["root"], contract)
        out["rank"] = float(int(contract[:4]) * 12 + int(contract[4:]) - 1)
        out["month"] = out["rank"]
        out["file"] = origin
        out["line"] = lines
        return out
