"""The bars frame every data source returns, and the checks that enforce it.

A bars frame is a ``pd.DataFrame`` with exactly the columns :data:`BAR_COLUMNS` (float64),
indexed by a UTC ``pd.DatetimeIndex`` named ``"ts"`` that labels each bar's START, strictly
increasing; prices sit on the asset's tick grid; missing minutes are simply absent rows.

:func:`validate_bars` checks a frame against that contract and returns it normalized
(column order, dtypes, nanosecond UTC index, prices snapped from float noise onto the exact
grid). Each failure raises :class:`~foxhunt.data.errors.BarDataError` with one line that
names the origin (file path or source name), the first offending row and the field.

The module also holds what every file source shares on the input side: turning a path, a
directory or a glob into a file list, the trading date of a bar (CME sessions open on the
evening before their trading date), and a stable fingerprint of a source's inputs. These
few helpers are written here by hand because they encode foxhunt's own conventions.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import math
import zipfile
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from foxhunt.data.errors import BarDataError

if TYPE_CHECKING:
    from foxhunt.assets import AssetSpec

#: The bar times foxhunt reads, from a file or a stream: 1970-01-01 .. 2200-01-01 UTC (within int64
#: nanoseconds, and the exchange calendars' range).
MIN_TS_NS, MAX_TS_NS = 0, 7_258_118_400 * 1_000_000_000
MINUTE_NS = 60 * 1_000_000_000  # a bar's length: every bar starts on a whole minute
BAR_COLUMNS: tuple[str, ...] = ("open", "high", "low", "close", "volume")
PRICE_COLUMNS: tuple[str, ...] = ("open", "high", "low", "close")
INDEX_NAME = "ts"

# A price counts as on the tick grid when it is within this many ticks of a grid point; the
# slack only absorbs float noise from decimal parsing and fixed-point conversion.
TICK_TOLERANCE = 1e-6
MAX_PRICE_TICKS = 2**53  # a price is an exact count of ticks in float64 below this
MAX_VOLUME = 1e15  # contracts in one bar: far past any exchange's minute, below float64's exact integers (2**53)

_UTC_NAMES = {"UTC", "ETC/UTC", "Z", "UTC+00:00", "ZULU", "UNIVERSAL", "GMT", "ETC/GMT"}
_GLOB_CHARS = set("*?[")


# ----------------------------------------------------------------------------- tick grid
def _tick_divisor(tick_size: float) -> float | None:
    """1/tick when it is a whole number (0.25 -> 4, 0.00005 -> 20000), else None."""
    inverse = 1.0 / tick_size
    whole = round(inverse)
    if whole >= 1 and abs(inverse - whole) <= 1e-9 * inverse:
        return float(whole)
    return None


def snap_to_tick(prices: Any, tick_size: float) -> np.ndarray:
    """Nearest grid prices, computed as ``k / (1/tick)`` where 1/tick is whole.

    Dividing the integer tick count by an integer rounds once, so the result is the double
    nearest to the decimal price (``snap_to_tick(1.10760000001, 0.00005) == 1.1076`` exactly,
    the same double a CSV parser gives for "1.1076"); ``k * tick`` would not always be.
    """
    if not (isinstance(tick_size, (int, float)) and math.isfinite(tick_size) and tick_size > 0):
        raise ValueError(f"tick_size={tick_size!r}: must be a positive number")
    values = np.asarray(prices, dtype=np.float64)
    ticks = np.rint(values / tick_size)
    divisor = _tick_divisor(tick_size)
    return ticks / divisor if divisor is not None else ticks * tick_size


def off_tick_mask(prices: np.ndarray, tick_size: float, tolerance: float = TICK_TOLERANCE):
    """True where a price is more than ``tolerance`` ticks away from the grid (NaN: False)."""
    ticks = np.asarray(prices, dtype=np.float64) / tick_size
    with np.errstate(invalid="ignore"):
        return np.abs(ticks - np.rint(ticks)) > tolerance


# ----------------------------------------------------------------------------- the price rule
def price_problem(value: float, tick_size: float, tolerance: float = TICK_TOLERANCE, grid: str | None = None) -> str | None:
    """Why ``value`` cannot be a price of a bar on the ``tick_size`` grid (the words after
    ``<field>=<value>``), or None when it can.

    The one price rule, for a training load (:func:`validate_bars`, vectorized there as
    :func:`bad_price_mask`) and for each bar of a stream (the server, paper trading:
    :meth:`foxhunt.data.streaming.StreamingFeatures.check`): a price is finite, at least one
    tick (a positive price within the float-noise ``tolerance`` of tick 0, such as 1e-9 on a
    0.25 grid, would otherwise pass as "on the grid" and snap to 0.0), on the grid (within
    ``tolerance`` ticks of a grid point) and below :data:`MAX_PRICE_TICKS` ticks (where float64
    still counts ticks exactly). ``grid`` names the grid in the words (default ``the <tick> tick grid``).
    """
    if not math.isfinite(value):
        return "is not a finite price"
    if value <= 0:
        return "is not a positive price"
    ticks = value / tick_size
    if not ticks < MAX_PRICE_TICKS:
        return f"is above {tick_size * MAX_PRICE_TICKS:g}, the largest price the {tick_size:g} tick grid counts exactly"
    if ticks < 1 - tolerance:
        return f"is below one tick ({tick_size:g}): a price is at least one tick"
    if abs(ticks - round(ticks)) > tolerance:
        return f"is off {grid or f'the {tick_size:g} tick grid'} ({ticks:.6f} ticks)"
    return None


def bad_price_mask(prices: Any, tick_size: float, tolerance: float = TICK_TOLERANCE) -> np.ndarray:
    """True where :func:`price_problem` has a problem with the price (the same rule, vectorized)."""
    values = np.asarray(prices, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        ticks = values / tick_size
        good = np.isfinite(values) & (values > 0) & (ticks < MAX_PRICE_TICKS) & (ticks >= 1 - tolerance)
        good &= np.abs(ticks - np.rint(ticks)) <= tolerance
    return ~good


# ----------------------------------------------------------------------------- validation
def volume_problem(value: float) -> str | None:
    """Why ``value`` cannot be a bar's volume (the words after ``volume=<value>``), or None.

    The one volume rule, for a training load (:func:`validate_bars`, vectorized there as
    :func:`bad_volume_mask`) and for each bar of a stream (:meth:`foxhunt.data.streaming.StreamingFeatures.check`):
    a count of contracts, so finite, >= 0, whole, and below :data:`MAX_VOLUME`. A stream refused
    1e16 that a training file passed, and neither refused a fractional count or DBN's u64 maximum
    (a column mapped wrong reads as such numbers)."""
    if not math.isfinite(value):
        return "is not a finite count of contracts"
    if value < 0:
        return "is negative"
    if not value < MAX_VOLUME:
        return f"is past {MAX_VOLUME:g}, the most contracts a bar may hold"
    if value != math.floor(value):
        return "is not a whole number of contracts"
    return None


def bad_volume_mask(volumes: np.ndarray) -> np.ndarray:
    """:func:`volume_problem` over an array: True where a volume is refused."""
    with np.errstate(invalid="ignore"):
        return ~(np.isfinite(volumes) & (volumes >= 0) & (volumes < MAX_VOLUME) & (volumes == np.floor(volumes)))


def _is_utc(tz: Any) -> bool:
    if tz is None:
        return False
    return str(tz).upper() in _UTC_NAMES


def _utc_iso(ts_ns: int) -> str:
    return pd.Timestamp(ts_ns, tz="UTC").isoformat()


def validate_bars(
    df: pd.DataFrame,
    tick_size: float,
    origin: str,
    *,
    rows: Sequence[int] | np.ndarray | Callable[[int], str] | None = None,
    row_name: str = "row",
    tick_tolerance: float = TICK_TOLERANCE,
) -> pd.DataFrame:
    """Check ``df`` against the bars-frame contract; return it normalized.

    ``origin`` names where the bars came from (a file path or a source name); ``rows`` gives
    each row's number in that origin (e.g. the CSV line or the DBN record index, with
    ``row_name`` "line" or "record"), or a function of the row's position making its label (only
    for the row an error names); without it rows are counted from 0. The first failed
    check raises BarDataError ``"<origin>: <row_name> <n> (<timestamp>): <problem>"``.

    Checks, in order: required columns present and numeric (not booleans); UTC DatetimeIndex
    without NaT; times within :data:`MIN_TS_NS` .. :data:`MAX_TS_NS` (a stream's range), each
    on a whole minute;
    timestamps strictly increasing (no duplicates); no NaN or infinite value; volume by
    :func:`volume_problem` (a whole count of contracts below :data:`MAX_VOLUME`);
    prices by :func:`price_problem` (positive, at least one tick, on the tick grid within
    ``tick_tolerance`` ticks, below :data:`MAX_PRICE_TICKS` ticks; float noise is snapped onto the
    exact grid); high >= low; high >= max(open, close); low <= min(open, close).
    """
    if not isinstance(df, pd.DataFrame):
        raise BarDataError(f"{origin}: expected a pandas DataFrame of bars, got {type(df).__name__}")
    missing = [c for c in BAR_COLUMNS if c not in df.columns]
    if missing:
        found = ", ".join(map(str, df.columns)) or "none"
        raise BarDataError(f"{origin}: missing column(s) {', '.join(missing)} (columns found: {found})")
    if callable(rows):  # a label made only for the row an error names (a folder of files: its file and line)
        row_id = rows
    else:
        row_ids = np.arange(len(df)) if rows is None else np.asarray(rows)
        if len(row_ids) != len(df):
            raise ValueError(f"rows has {len(row_ids)} entries for {len(df)} bars of {origin}")
        row_id = row_ids.__getitem__

    index = df.index
    if not isinstance(index, pd.DatetimeIndex):
        raise BarDataError(f"{origin}: index is a {type(index).__name__}, expected a UTC DatetimeIndex of bar starts")
    if index.tz is None:
        raise BarDataError(f"{origin}: timestamps have no time zone, expected UTC")
    if not _is_utc(index.tz):
        raise BarDataError(f"{origin}: timestamps are in time zone {index.tz}, expected UTC")
    try:
        index = index.tz_convert("UTC").as_unit("ns")
    except (OverflowError, ValueError):  # pandas' OutOfBoundsDatetime: a time nanoseconds since 1970 cannot hold
        outside = int(
            np.flatnonzero((index < pd.Timestamp.min.tz_localize("UTC")) | (index > pd.Timestamp.max.tz_localize("UTC")))[0]
        )
        raise BarDataError(f"{origin}: {row_name} {row_id(outside)} ({index[outside].isoformat()}): a bar time outside "
                           f"{pd.Timestamp.min.year + 1}..{pd.Timestamp.max.year - 1}") from None  # fmt: skip

    def where(i: int) -> str:
        stamp = index[i]
        when = "NaT" if pd.isna(stamp) else stamp.isoformat()
        return f"{origin}: {row_name} {row_id(i)} ({when})"

    nat = np.flatnonzero(index.isna())
    if nat.size:
        raise BarDataError(f"{where(nat[0])}: field 'ts' is missing (NaT)")
    stamps = index.asi8
    beyond = np.flatnonzero((stamps < MIN_TS_NS) | (stamps > MAX_TS_NS))
    if beyond.size:  # Databento's null time (2**64-1) read as -1, a negative one: bars of 1969 (found by a helper)
        raise BarDataError(f"{where(int(beyond[0]))}: a bar time outside the times foxhunt reads "
                           f"({_utc_iso(MIN_TS_NS)} .. {_utc_iso(MAX_TS_NS)}, as a stream)")  # fmt: skip
    off = np.flatnonzero(stamps % MINUTE_NS != 0)
    if off.size:  # 30-second bars, or stamps in seconds read as nanoseconds, loaded as minute bars (found by a helper)
        raise BarDataError(f"{where(int(off[0]))}: not the start of a whole minute (foxhunt reads 1-minute bars, each "
                           "labelled by its start)")  # fmt: skip
    steps = np.diff(stamps)
    bad = np.flatnonzero(steps <= 0)
    if bad.size:
        i = int(bad[0]) + 1
        previous = f"{row_name} {row_id(i - 1)} ({index[i - 1].isoformat()})"
        if steps[i - 1] == 0:
            raise BarDataError(f"{where(i)}: duplicated timestamp, same as {previous}")
        raise BarDataError(f"{where(i)}: timestamps not in increasing order, earlier than {previous}")

    values: dict[str, np.ndarray] = {}
    for column in BAR_COLUMNS:
        series = df[column]
        if pd.api.types.is_bool_dtype(series):  # 'True' in a CSV: pandas reads a column of them as bools, 1.0
            raise BarDataError(f"{where(0)}: field '{column}'={series.iloc[0]!r} is not a number (a column of booleans)")
        if not pd.api.types.is_numeric_dtype(series):
            numeric = pd.to_numeric(series, errors="coerce")
            bad_text = np.flatnonzero(numeric.isna().to_numpy() & series.notna().to_numpy())
            if bad_text.size:
                i = int(bad_text[0])
                raise BarDataError(f"{where(i)}: field '{column}'={series.iloc[i]!r} is not a number")
            series = numeric
        values[column] = series.to_numpy(dtype=np.float64, na_value=np.nan)

    for column in BAR_COLUMNS:
        bad = np.flatnonzero(~np.isfinite(values[column]))
        if bad.size:
            i = int(bad[0])
            raise BarDataError(f"{where(i)}: field '{column}' is {float(values[column][i])} (missing price or volume)")
    bad = np.flatnonzero(bad_volume_mask(values["volume"]))
    if bad.size:
        i = int(bad[0])
        volume = float(values["volume"][i])
        raise BarDataError(f"{where(i)}: field 'volume'={volume!r} {volume_problem(volume)}")

    off = np.zeros(len(df), dtype=bool)
    for column in PRICE_COLUMNS:
        off |= bad_price_mask(values[column], tick_size, tick_tolerance)
    bad = np.flatnonzero(off)
    if bad.size:
        i = int(bad[0])
        for column in PRICE_COLUMNS:  # the first of the row's prices the rule refuses
            value = float(values[column][i])
            problem = price_problem(value, tick_size, tick_tolerance)
            if problem is not None:
                raise BarDataError(f"{where(i)}: field '{column}'={value!r} {problem}")
    for column in PRICE_COLUMNS:
        values[column] = snap_to_tick(values[column], tick_size)

    o, h, lo, c = (values[k] for k in PRICE_COLUMNS)
    checks = (
        (h < lo, lambda i: f"high={float(h[i])!r} < low={float(lo[i])!r}"),
        (
            h < np.maximum(o, c),
            lambda i: f"high={float(h[i])!r} < max(open={float(o[i])!r}, close={float(c[i])!r})",
        ),
        (
            lo > np.minimum(o, c),
            lambda i: f"low={float(lo[i])!r} > min(open={float(o[i])!r}, close={float(c[i])!r})",
        ),
    )
    for mask, describe in checks:
        bad = np.flatnonzero(mask)
        if bad.size:
            i = int(bad[0])
            raise BarDataError(f"{where(i)}: {describe(i)}")

    out = pd.DataFrame({c: values[c] for c in BAR_COLUMNS}, index=index.rename(INDEX_NAME))
    return out


# ----------------------------------------------------------------------------- file inputs
def resolve_files(path: str | Path, suffixes: Iterable[str], what: str) -> list[Path]:
    """Files named by ``path``: one file, a directory (files ending in ``suffixes``, searched
    recursively, sorted) or a glob pattern (matching files, sorted).

    Raises BarDataError naming ``path`` when nothing matches.
    """
    text = str(path)
    if not text or text == "???":
        raise BarDataError(f"data path {text!r} is not set: give the file, directory or glob of the {what}")
    expanded = Path(text).expanduser()
    if any(ch in text for ch in _GLOB_CHARS):
        files = sorted(Path(p) for p in glob.glob(str(expanded), recursive=True) if Path(p).is_file())
        if not files:
            raise BarDataError(f"{text}: no file matches this pattern ({what})")
        return files
    if expanded.is_dir():
        ends = tuple(s.lower() for s in suffixes)
        files = sorted(p for p in expanded.rglob("*") if p.is_file() and p.name.lower().endswith(ends))
        if not files:
            raise BarDataError(f"{text}: directory holds no {what} (files ending in {', '.join(ends)})")
        return files
    if expanded.is_file():
        return [expanded]
    if expanded.exists() or expanded.is_symlink():  # a pipe, a device, a link to nothing: named as what it is
        raise BarDataError(f"{text}: not a regular file or a directory ({what}): a pipe, a device or a broken link")
    raise BarDataError(f"{text}: file not found ({what})")


def check_path_setting(path: Any, what: str) -> None:
    """A source's ``path`` setting names something (ValueError ``path=...``, the settings' form): ''
    was a data error once the run was made (found by a helper probing the data)."""
    if path is None or not str(path).strip():
        raise ValueError(f"path={path!r}: must name {what}, a folder of them or a glob")


def unreadable(file: str | Path, exc: BaseException, what: str) -> BarDataError:
    """The one-line error for a file that cannot be read as ``what`` ("CSV", "zip"): a compressed
    file cut short is named truncated, damaged compressed data corrupt, anything else unreadable."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    name = str(file)
    if isinstance(exc, EOFError) or "ended before the end-of-stream" in text:
        return BarDataError(
            f"{name}: truncated: the compressed data ends before its end-of-stream marker "
            f"(the file was cut short; download or copy it again)"
        )
    if (
        isinstance(exc, zlib.error)
        or type(exc).__name__ == "ZstdError"
        or "CRC check failed" in text
        or "Not a gzipped file" in text
        or "Bad CRC-32" in text
    ):
        return BarDataError(f"{name}: corrupt compressed data ({text}); download or copy the file again")
    if isinstance(exc, zipfile.BadZipFile):
        try:
            with open(file, "rb") as handle:
                cut = handle.read(2) == b"PK"
        except OSError:  # a member of an archive: the archive is what is damaged
            cut = True
        if cut:
            return BarDataError(
                f"{name}: truncated or damaged zip archive ({text}: no end-of-archive record; the file was cut short)"
            )
        return BarDataError(f"{name}: not a zip archive ({text})")
    return BarDataError(f"{name}: cannot read as {what} ({text})")


def source_fingerprint(kind: str, params: dict[str, Any], asset: AssetSpec, files: Sequence[Path] = ()) -> str:
    """``"<kind>:<sha256>"`` of the source's parameters, the asset and each file's
    resolved path, size and modification time: equal fingerprints, equal bars."""
    stats = []
    for file in files:
        st = file.stat()
        stats.append([str(file.resolve()), st.st_size, st.st_mtime_ns])
    payload = {
        "kind": kind,
        "params": params,
        "asset": dataclasses.asdict(asset),
        "files": stats,
    }
    text = json.dumps(payload, sort_keys=True, default=str)
    return f"{kind}:{hashlib.sha256(text.encode()).hexdigest()}"
