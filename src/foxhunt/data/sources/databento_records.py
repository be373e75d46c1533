"""Databento files as raw records: DBN (v1-v3, zstd or not) and CSV exports, checked whole.

:func:`read_databento_ohlcv` reads every OHLCV record of a file, directory or glob into one
frame (:data:`RAW_COLUMNS`), with the symbols resolved from the DBN symbol mappings, the CSV
``symbol`` column or definition records; :class:`_Definitions` collects what definition
records say of each instrument (symbol, expiration, tick, contract size) and the open interest
of statistics records. Integrity is checked before anything is decoded into a shorter series:
a zstd stream is walked frame by frame (:mod:`foxhunt.data.zstd`) so a cut download is an error, a DBN file
whose last record is incomplete is an error, a null price (2**63-1, an empty decimal field)
names its record. :mod:`foxhunt.data.sources.databento` builds the continuous series from
these records.

Written by hand around ``databento_dbn``'s decoder (the ``databento`` client is not needed):
the decoder stops quietly where a cut stream ends, and neither library checks the fields a
training series needs.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import databento_dbn as dbn
import numpy as np
import pandas as pd
from zstandard import ZstdError

from foxhunt.assets import AssetSpec
from foxhunt.data.bars import (
    resolve_files,
    unreadable,
)
from foxhunt.data.errors import BarDataError
from foxhunt.data.zstd import ZSTD_SUFFIX, check_zstd_file, is_zstd_start, zstd_problem
from foxhunt.errors import one_line

FIXED_PRICE_SCALE = dbn.FIXED_PRICE_SCALE  # 1e9 raw units per 1.0 of price
UNDEF_PRICE = dbn.UNDEF_PRICE  # 2**63 - 1, Databento's null price
OHLCV_SCHEMAS = {32: "ohlcv-1s", 33: "ohlcv-1m", 34: "ohlcv-1h", 35: "ohlcv-1d", 36: "ohlcv-eod"}
TRAINING_SCHEMA = "ohlcv-1m"
DBN_SUFFIXES = (".dbn", ".dbn.zst")
DATABENTO_CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.zst")  # .zst: a batch download's default compression
MONTH_CODES = "FGHJKMNQUVXZ"  # CME futures month codes, January..December
RAW_COLUMNS = (
    "ts_event", "rtype", "schema", "publisher_id", "instrument_id", "symbol",
    "open", "high", "low", "close", "volume", "file", "record",
)  # fmt: skip
CSV_REQUIRED = ("ts_event", "instrument_id", "open", "high", "low", "close", "volume")
CSV_PRICE_FORMATS = ("auto", "fixed", "decimal")
MAX_INSTRUMENT_ID = 2**32 - 1  # a DBN record's instrument_id is a u32

_DECODE_CHUNK = 1 << 23
_BAR_SPACINGS = {1: "ohlcv-1s", 60: "ohlcv-1m", 3600: "ohlcv-1h", 86400: "ohlcv-1d"}
_OHLCV_DTYPE = np.dtype(
    [
        ("length", "u1"),
        ("rtype", "u1"),
        ("publisher_id", "<u2"),
        ("instrument_id", "<u4"),
        ("ts_event", "<u8"),
        ("open", "<i8"),
        ("high", "<i8"),
        ("low", "<i8"),
        ("close", "<i8"),
        ("volume", "<u8"),
    ]
)  # DBN OhlcvMsg: a 16-byte record header, then the bar; the same in DBN v1-v3


# ============================================================================ definitions
@dataclass
class _Definitions:
    """What definition records say of each instrument id (raw symbol, expiration in ns, tick,
    contract size and its unit, the file), and the open interest statistics records read."""

    symbol: dict[int, str] = field(default_factory=dict)
    expiration: dict[int, int] = field(default_factory=dict)
    tick: dict[int, float] = field(default_factory=dict)
    size: dict[int, tuple[float, str]] = field(default_factory=dict)
    file: dict[int, Path] = field(default_factory=dict)
    open_interest: list[dict] = field(default_factory=list)

    def add(self, record, file: Path | None = None) -> None:
        iid = int(record.instrument_id)
        self.symbol[iid] = str(record.raw_symbol)
        expiration = int(record.expiration)
        if 0 < expiration < dbn.UNDEF_TIMESTAMP:
            self.expiration[iid] = expiration
        if 0 < int(record.min_price_increment) < UNDEF_PRICE:
            self.tick[iid] = int(record.min_price_increment) / FIXED_PRICE_SCALE
        qty = int(getattr(record, "unit_of_measure_qty", UNDEF_PRICE))
        if 0 < qty < UNDEF_PRICE:
            self.size[iid] = (qty / FIXED_PRICE_SCALE, str(getattr(record, "unit_of_measure", "")))
        if file is not None:
            self.file[iid] = file

    def check(self, asset: AssetSpec, symbols: set[str]) -> None:
        """Tick size and contract size of the asset's contracts (``symbols``) against the asset
        config: one line naming the file, the contract and both values on a mismatch. A
        contract sized in a currency (ZN: USD 100,000 face value) is quoted in percent of par,
        so its value per 1.0 of price is the size over 100."""
        for iid, symbol in self.symbol.items():
            if symbol not in symbols:
                continue
            where = f"{self.file.get(iid, 'definitions')}: {symbol}"
            tick = self.tick.get(iid)
            if tick is not None and not math.isclose(tick, asset.tick_size, rel_tol=1e-9):
                raise BarDataError(
                    f"{where}: definition tick size {tick:g}, but asset.tick_size={asset.tick_size:g} "
                    f"(asset={asset.key}: is this the right asset?)"
                )
            size, unit = self.size.get(iid, (None, ""))
            if size is None:
                continue
            per_point = size / 100.0 if unit in _CURRENCY_UNITS else size
            if not math.isclose(per_point, asset.multiplier, rel_tol=1e-9):
                raise BarDataError(
                    f"{where}: definition contract size {size:g} {unit} (= {per_point:g} per 1.0 of price), but "
                    f"asset.multiplier={asset.multiplier:g} (asset={asset.key}: is this the right asset?)"
                )


_CURRENCY_UNITS = ("USD",)  # unit_of_measure of contracts sized in face value, quoted in percent of par


def _is_definition(record) -> bool:
    return hasattr(record, "raw_symbol") and hasattr(record, "expiration") and hasattr(record, "min_price_increment")


# ============================================================================ DBN reading
def _decode_dbn(file: Path) -> tuple[dbn.Metadata, list]:
    """(metadata, records) of a DBN file, zstd-compressed or not."""
    try:
        with open(file, "rb") as handle:
            head = handle.read(4)
            if is_zstd_start(head[:4]):
                compression = dbn.Compression.ZSTD
                problem = zstd_problem(handle)
                if problem is not None:
                    raise BarDataError(f"{file}: {problem}")
                handle.seek(len(head))
            elif head[:3] == b"DBN":
                compression = dbn.Compression.NONE
            else:
                raise BarDataError(f"{file}: not a DBN file (neither a DBN header nor zstd data)")
            decoder = dbn.DBNDecoder(compression=compression, upgrade_policy=dbn.VersionUpgradePolicy.UPGRADE_TO_V3)  # type: ignore[arg-type]  # databento_dbn's stubs type the enum members as str/int
            decoder.write(head)
            out: list = []
            while chunk := handle.read(_DECODE_CHUNK):
                decoder.write(chunk)
                out.extend(decoder.decode())
            out.extend(decoder.decode())
            leftover = len(decoder.buffer())
    except OSError as exc:
        raise BarDataError(f"{file}: cannot read ({one_line(str(exc))})") from None
    except (dbn.DBNError, ValueError, RuntimeError) as exc:  # zstd: "Restored data doesn't match checksum"
        if isinstance(exc, BarDataError):
            raise
        raise BarDataError(f"{file}: corrupt DBN data, cannot decode it ({one_line(str(exc))})") from None
    except BaseException as exc:  # noqa: BLE001 (a decoder panic only: _panic re-raises anything else)
        raise _panic(file, exc) from None
    if not out or not isinstance(out[0], dbn.Metadata):
        if leftover:
            raise BarDataError(f"{file}: truncated: the file ends inside its DBN metadata header ({leftover} bytes)")
        raise BarDataError(f"{file}: DBN data without metadata header")
    if leftover:  # a record cut short: never a silently shorter series
        raise BarDataError(
            f"{file}: truncated: record {len(out) - 1} is incomplete (the file ends {leftover} bytes into it); "
            "download or copy the file again"
        )
    return out[0], out[1:]


def _dbn_metadata(file: Path, chunk_bytes: int = 1 << 16):
    """The metadata header of a DBN file: read and decoded a chunk at a time until the header is
    whole (only the first 64 KiB were read: a header of a few hundred symbol mappings, 95 KB, was
    called missing; found by a helper probing the data)."""
    with open(file, "rb") as handle:
        head = handle.read(chunk_bytes)
        compression = dbn.Compression.ZSTD if is_zstd_start(head[:4]) else dbn.Compression.NONE
        decoder = dbn.DBNDecoder(compression=compression, upgrade_policy=dbn.VersionUpgradePolicy.UPGRADE_TO_V3)  # type: ignore[arg-type]  # databento_dbn's stubs type the enum members as str/int
        try:
            decoder.write(head)
            decoded = decoder.decode()
            while not decoded and (chunk := handle.read(chunk_bytes)):
                decoder.write(chunk)
                decoded = decoder.decode()
        except (dbn.DBNError, ValueError, RuntimeError) as exc:
            raise BarDataError(f"{file}: corrupt DBN data, cannot decode its metadata ({one_line(str(exc))})") from None
        except BaseException as exc:  # noqa: BLE001 (a decoder panic only: _panic re-raises anything else)
            raise _panic(file, exc) from None
    if not decoded or not isinstance(decoded[0], dbn.Metadata):
        raise BarDataError(f"{file}: DBN data without metadata header")
    return decoded[0]


def _panic(file: Path, exc: BaseException) -> BarDataError:
    """The data error for databento-dbn's Rust decoder panicking on a malformed record (pyo3's
    PanicException, a BaseException so that ``except Exception`` does not catch it: a Rust stack
    trace, found by a helper flipping a header flag); any other exception is re-raised as it is."""
    if type(exc).__name__ != "PanicException":
        raise exc
    return BarDataError(f"{file}: corrupt DBN data, its decoder gave up ({one_line(str(exc))[:200]})")


def _mapping_table(metadata) -> pd.DataFrame:
    """Metadata symbol mappings as rows (instrument_id, start, end, symbol); dates are UTC,
    ``end`` exclusive. Resolved like the databento client: the side that is an instrument
    id is the key, the other side the symbol. Parent requests keyed by the parent symbol
    (``ES.FUT``) name no contract and are skipped."""
    rows = []
    stype_in, stype_out = metadata.stype_in, metadata.stype_out
    requested = set(metadata.symbols or ())
    for symbol_in, intervals in (metadata.mappings or {}).items():
        for interval in intervals:
            symbol_out = interval["symbol"]
            if not symbol_out:
                continue
            try:
                if stype_in == dbn.SType.INSTRUMENT_ID:
                    iid, symbol = int(symbol_in), str(symbol_out)
                elif stype_out == dbn.SType.INSTRUMENT_ID:
                    iid, symbol = int(symbol_out), str(symbol_in)
                else:
                    continue
            except ValueError:
                continue
            if stype_in == dbn.SType.PARENT and symbol in requested:
                continue  # keyed by the parent symbol itself: names no contract
            rows.append(
                (
                    iid,
                    np.datetime64(interval["start_date"], "D"),
                    np.datetime64(interval["end_date"], "D"),
                    symbol,
                )
            )
    return pd.DataFrame(rows, columns=["instrument_id", "start", "end", "symbol"])


def _resolve_symbols(iids: np.ndarray, ts_ns: np.ndarray, table: pd.DataFrame) -> np.ndarray:
    """Symbol of each record from the mapping table (None where no interval covers it)."""
    symbols = np.full(iids.size, None, dtype=object)
    if table.empty or iids.size == 0:
        return symbols
    days = ts_ns.astype("datetime64[ns]").astype("datetime64[D]").astype(np.int64)
    span = int(days.max() - days.min()) + 1
    keys, inverse = np.unique(iids.astype(np.int64) * span + (days - days.min()), return_inverse=True)
    pairs = pd.DataFrame(
        {
            "instrument_id": keys // span,
            "day": (keys % span + days.min()).astype("datetime64[D]"),
            "pair": np.arange(keys.size),
        }
    )
    merged = pairs.merge(table.astype({"instrument_id": np.int64}), on="instrument_id", how="inner")
    merged = merged[(merged["day"] >= merged["start"]) & (merged["day"] < merged["end"])]
    merged = merged.drop_duplicates("pair")
    per_pair = np.full(keys.size, None, dtype=object)
    per_pair[merged["pair"].to_numpy()] = merged["symbol"].to_numpy()
    return per_pair[inverse.ravel()]


def _ohlcv_arrays(records: list) -> np.ndarray:
    """OHLCV records as a structured array (fast path through the records' bytes)."""
    if not records:
        return np.empty(0, dtype=_OHLCV_DTYPE)
    blob = b"".join(bytes(r) for r in records)
    size = len(blob) // len(records)
    names, fields = _OHLCV_DTYPE.names, _OHLCV_DTYPE.fields
    assert names is not None and fields is not None  # a structured dtype
    if size * len(records) == len(blob) and size >= _OHLCV_DTYPE.itemsize:
        padded = np.dtype(
            {
                "names": names,
                "formats": [fields[n][0] for n in names],
                "offsets": [fields[n][1] for n in names],
                "itemsize": size,
            }
        )
        arr = np.frombuffer(blob, dtype=padded)
        first, last = records[0], records[-1]
        if (
            int(arr["ts_event"][0]) == first.ts_event
            and int(arr["close"][-1]) == last.close
            and int(arr["volume"][-1]) == last.volume
            and int(arr["instrument_id"][-1]) == last.instrument_id
        ):
            return arr.astype(_OHLCV_DTYPE)
    arr = np.empty(len(records), dtype=_OHLCV_DTYPE)
    for name in (
        "rtype",
        "publisher_id",
        "instrument_id",
        "ts_event",
        "open",
        "high",
        "low",
        "close",
        "volume",
    ):
        arr[name] = [int(getattr(r, name)) for r in records]
    return arr


def _read_dbn(file: Path, definitions: _Definitions) -> pd.DataFrame | None:
    """Raw OHLCV records of one DBN file; None for a definition file (whose records are
    added to ``definitions``)."""
    metadata, records = _decode_dbn(file)
    schema = str(metadata.schema) if metadata.schema is not None else None
    if schema == "definition" or (schema is None and records and all(_is_definition(r) for r in records)):
        for record in records:
            if _is_definition(record):
                definitions.add(record, file)
        return None
    if schema == "statistics":
        _read_open_interest(file, metadata, records, definitions)
        return None
    if schema is not None and not schema.startswith("ohlcv"):
        raise BarDataError(f"{file}: schema {schema} is not an OHLCV schema (ohlcv-1s/1m/1h/1d), nor definition or statistics")
    bars, kept = [], []
    for number, record in enumerate(records):
        if isinstance(record, dbn.OHLCVMsg):
            bars.append(record)
            kept.append(number)
        elif _is_definition(record):
            definitions.add(record, file)
    numbers = np.asarray(kept, dtype=np.int64)
    if not bars:
        raise BarDataError(f"{file}: no OHLCV records in this DBN file (schema {schema})")
    arr = _ohlcv_arrays(bars)
    table = _mapping_table(metadata)
    symbols = _resolve_symbols(arr["instrument_id"], arr["ts_event"], table)
    unmapped = np.flatnonzero(pd.isna(symbols)) if not table.empty else np.empty(0, np.int64)
    if unmapped.size:  # the file's mappings name every instrument of its records: damaged metadata or records
        i = int(unmapped[0])
        ts = int(arr["ts_event"][i])
        when = pd.Timestamp(ts, tz="UTC").date().isoformat() if 0 <= ts <= pd.Timestamp.max.value else f"ts_event {ts}"
        raise BarDataError(f"{file}: record {int(numbers[i])}: instrument_id {int(arr['instrument_id'][i])} has no symbol in "
                           f"the file's mappings on {when} ({unmapped.size} such record(s)): a damaged file, refused "
                           "rather than read shorter")  # fmt: skip
    frame = _records_frame(
        file,
        ts=arr["ts_event"].astype(np.int64),
        rtype=arr["rtype"].astype(np.int64),
        publisher_id=arr["publisher_id"].astype(np.int64),
        instrument_id=arr["instrument_id"].astype(np.int64),
        symbol=symbols,
        prices={k: arr[k].astype(np.int64) for k in ("open", "high", "low", "close")},
        fixed=True,
        volume=arr["volume"].astype(np.float64),
        numbers=numbers,
        row_name="record",
    )
    return frame


def _read_open_interest(file: Path, metadata, records: list, definitions: _Definitions) -> None:
    """Open interest records of a statistics file (stat_type OPEN_INTEREST): instrument,
    symbol, when Databento received it (``ts_recv``: when it was known) and the quantity."""
    stats = [r for r in records if isinstance(r, dbn.StatMsg) and r.stat_type == dbn.StatType.OPEN_INTEREST]
    if not stats:
        return
    iids = np.array([int(r.instrument_id) for r in stats], dtype=np.int64)
    recv = np.array([int(r.ts_recv) for r in stats], dtype=np.int64)
    symbols = _resolve_symbols(iids, recv, _mapping_table(metadata))
    for record, symbol in zip(stats, symbols, strict=True):
        definitions.open_interest.append({
            "instrument_id": int(record.instrument_id), "symbol": symbol,
            "published": pd.Timestamp(int(record.ts_recv), unit="ns", tz="UTC"), "value": float(record.quantity),
        })  # fmt: skip


def _records_frame(file, *, ts, rtype, publisher_id, instrument_id, symbol, prices, fixed, volume, numbers, row_name):
    """Assemble the raw-records frame; null prices raise, fixed-point prices become decimals."""
    out = {}
    for name, values in prices.items():
        null = values == UNDEF_PRICE if fixed else np.isnan(values)
        if null.any():
            i = int(np.flatnonzero(null)[0])
            raise BarDataError(
                f"{file}: {row_name} {numbers[i]}: field '{name}' is the null price (2^63-1 / empty); "
                "OHLCV bars always have prices, so the file is damaged"
            )
        out[name] = values / FIXED_PRICE_SCALE if fixed else values.astype(np.float64)
    kinds, which = np.unique(np.asarray(rtype), return_inverse=True)
    schema = np.array([OHLCV_SCHEMAS.get(int(r), f"rtype {int(r)}") for r in kinds], dtype=object)[which]
    return pd.DataFrame(
        {
            "ts_event": pd.DatetimeIndex(np.asarray(ts, dtype="datetime64[ns]"), tz="UTC"),
            "rtype": rtype,
            "schema": schema,
            "publisher_id": publisher_id,
            "instrument_id": instrument_id,
            "symbol": pd.Series(symbol, dtype=object),
            **out,
            "volume": volume,
            "file": str(file),
            "record": numbers,
        }
    )[list(RAW_COLUMNS)]


# ============================================================================ CSV reading
def _schema_from_name(file: Path) -> str | None:
    for schema in OHLCV_SCHEMAS.values():
        if schema in file.name.lower():
            return schema
    return None


def _read_csv(file: Path, csv_prices: str) -> pd.DataFrame:
    if file.name.lower().endswith(ZSTD_SUFFIX):  # cut short, it read as fewer rows: refused whole
        check_zstd_file(file)
    try:
        raw = pd.read_csv(file, dtype={"symbol": object})
    except (OSError, ValueError, UnicodeDecodeError, EOFError, zlib.error, ZstdError) as exc:
        raise unreadable(file, exc, "CSV") from None
    missing = [c for c in CSV_REQUIRED if c not in raw.columns]
    if missing:
        found = ", ".join(map(str, raw.columns)) or "none"
        raise BarDataError(f"{file}: missing column(s) {', '.join(missing)} (columns found: {found})")
    if raw.empty:
        raise BarDataError(f"{file}: no records (the file has a header but no rows)")
    lines = np.arange(len(raw), dtype=np.int64) + 2  # line 1 is the header

    ts_column = raw["ts_event"]
    if pd.api.types.is_integer_dtype(ts_column):
        ts = ts_column.to_numpy(dtype=np.int64)
    else:
        parsed = pd.to_datetime(ts_column.astype(str), utc=True, format="ISO8601", errors="coerce")
        bad = np.flatnonzero(parsed.isna().to_numpy())
        if bad.size:
            i = int(bad[0])
            raise BarDataError(
                f"{file}: line {lines[i]}: field 'ts_event'={_shown(ts_column.iloc[i])} is neither integer "
                "nanoseconds nor an ISO-8601 timestamp"
            )
        ts = pd.DatetimeIndex(parsed).as_unit("ns").asi8

    integer_prices = all(pd.api.types.is_integer_dtype(raw[c]) for c in ("open", "high", "low", "close"))
    fixed = integer_prices if csv_prices == "auto" else csv_prices == "fixed"
    prices = {}
    for name in ("open", "high", "low", "close"):
        column = raw[name]
        if fixed:
            if not pd.api.types.is_integer_dtype(column):
                numeric = pd.to_numeric(column, errors="coerce")
                bad = np.flatnonzero(numeric.isna().to_numpy() | (numeric % 1 != 0).to_numpy())
                i = int(bad[0]) if bad.size else 0
                raise BarDataError(
                    f"{file}: line {lines[i]}: field '{name}'={_shown(column.iloc[i])} is not a fixed-point "
                    "integer price (csv_prices='fixed')"
                )
            prices[name] = column.to_numpy(dtype=np.int64)
        else:
            numeric = pd.to_numeric(column, errors="coerce")
            bad = np.flatnonzero(numeric.isna().to_numpy() & column.notna().to_numpy())
            if bad.size:
                i = int(bad[0])
                raise BarDataError(f"{file}: line {lines[i]}: field '{name}'={_shown(column.iloc[i])} is not a number")
            scaled = np.flatnonzero((numeric.abs() >= FIXED_PRICE_SCALE).to_numpy())
            if scaled.size:  # a fixed-point price read as a decimal one: 1e9 too large, and on the tick grid
                i = int(scaled[0])
                why = "csv_prices='decimal'" if csv_prices == "decimal" else "the column holds decimal prices too"
                raise BarDataError(f"{file}: line {lines[i]}: field '{name}'={_shown(column.iloc[i])} is a fixed-point price "
                                   f"(units of 1e-9) in a column read as decimal prices ({why}); no futures price is 1e9 "
                                   "or more")  # fmt: skip
            prices[name] = numeric.to_numpy(dtype=np.float64)

    for name in ("instrument_id", "volume"):
        numeric = pd.to_numeric(raw[name], errors="coerce")
        bad = np.flatnonzero(numeric.isna().to_numpy())
        if bad.size:
            i = int(bad[0])
            raise BarDataError(f"{file}: line {lines[i]}: field '{name}'={_shown(raw[name].iloc[i])} is not a number")
    numeric = pd.to_numeric(raw["instrument_id"], errors="coerce")
    bad = np.flatnonzero(~((numeric >= 0) & (numeric <= MAX_INSTRUMENT_ID) & (numeric % 1 == 0)).to_numpy())
    if bad.size:  # 1e20 was an OverflowError traceback (found by a helper): DBN's ids are u32
        i = int(bad[0])
        raise BarDataError(f"{file}: line {lines[i]}: field 'instrument_id'={_shown(raw['instrument_id'].iloc[i])} is not an "
                           f"instrument id (a whole number 0..{MAX_INSTRUMENT_ID})")  # fmt: skip
    instrument_id = numeric.to_numpy(dtype=np.int64)
    if "rtype" in raw.columns:
        rtype = pd.to_numeric(raw["rtype"], errors="coerce").fillna(-1).to_numpy(dtype=np.int64)
    else:
        rtype = np.full(len(raw), _infer_rtype(file, ts, instrument_id), dtype=np.int64)
    publisher = (
        pd.to_numeric(raw["publisher_id"], errors="coerce").fillna(0).to_numpy(dtype=np.int64)
        if "publisher_id" in raw.columns
        else np.zeros(len(raw), dtype=np.int64)
    )
    symbol = np.full(len(raw), None, dtype=object)
    if "symbol" in raw.columns:
        present = raw["symbol"].notna().to_numpy()
        if present.any() and not present.all():  # rows of a mapped file without their symbol were dropped unsaid, as
            # unmapped DBN records were (found by a helper): a damaged file, refused rather than read shorter
            i = int(np.flatnonzero(~present)[0])
            raise BarDataError(f"{file}: line {lines[i]}: field 'symbol' is empty (instrument_id {instrument_id[i]}) while "
                               "other rows have theirs: a damaged export, refused rather than read shorter")  # fmt: skip
        symbol[present] = raw["symbol"].to_numpy(dtype=object)[present]
    return _records_frame(
        file,
        ts=ts,
        rtype=rtype,
        publisher_id=publisher,
        instrument_id=instrument_id,
        symbol=symbol,
        prices=prices,
        fixed=fixed,
        volume=pd.to_numeric(raw["volume"]).to_numpy(dtype=np.float64),
        numbers=lines,
        row_name="line",
    )


def _infer_rtype(file: Path, ts: np.ndarray, instrument_id: np.ndarray) -> int:
    """The OHLCV rtype of a CSV without an ``rtype`` column: from the file name
    (``...ohlcv-1m...``), else from the smallest spacing of one instrument's bars."""
    by_name = _schema_from_name(file)
    rtypes = {schema: rtype for rtype, schema in OHLCV_SCHEMAS.items()}
    if by_name is not None:
        return rtypes[by_name]
    order = np.lexsort((ts, instrument_id))
    same = instrument_id[order][1:] == instrument_id[order][:-1]
    steps = np.diff(ts[order])[same]
    steps = steps[steps > 0]
    if steps.size:
        seconds = int(steps.min() // 1_000_000_000)
        if seconds in _BAR_SPACINGS:
            return rtypes[_BAR_SPACINGS[seconds]]
    return -1


# ============================================================================ public reading
def _read_all(path: str | Path, definitions_path: str | None, csv_prices: str) -> tuple[pd.DataFrame, _Definitions, list[Path]]:
    if csv_prices not in CSV_PRICE_FORMATS:
        raise ValueError(f"csv_prices={csv_prices!r}: must be one of {', '.join(CSV_PRICE_FORMATS)}")
    definitions = _Definitions()
    files = resolve_files(path, DBN_SUFFIXES + DATABENTO_CSV_SUFFIXES, "Databento DBN or CSV files")
    extra = resolve_files(definitions_path, DBN_SUFFIXES, "Databento definition files") if definitions_path else []
    for file in extra:
        metadata, records = _decode_dbn(file)
        found = [r for r in records if _is_definition(r)]
        if not found:
            raise BarDataError(f"{file}: no definition records (schema {metadata.schema}); definitions= needs definition files")
        for record in found:
            definitions.add(record, file)
    frames = []
    for file in files:
        name = file.name.lower()
        if name.endswith(DBN_SUFFIXES):
            frame = _read_dbn(file, definitions)
        elif name.endswith(DATABENTO_CSV_SUFFIXES):
            frame = _read_csv(file, csv_prices)
        else:
            raise BarDataError(f"{file}: not a Databento file (expected {', '.join(DBN_SUFFIXES + DATABENTO_CSV_SUFFIXES)})")
        if frame is not None:
            frames.append(frame)
    if not frames:
        raise BarDataError(f"{path}: no OHLCV records (only definition files found)")
    records = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    unresolved = records["symbol"].isna().to_numpy()
    if unresolved.any() and definitions.symbol:
        filled = records.loc[unresolved, "instrument_id"].map(definitions.symbol)
        records.loc[unresolved, "symbol"] = filled.where(filled.notna(), None).astype(object)
    return records, definitions, files + extra


def read_databento_ohlcv(path: str | Path, definitions: str | None = None, csv_prices: str = "auto") -> pd.DataFrame:
    """Every OHLCV record of the Databento files at ``path`` (any of ohlcv-1s/1m/1h/1d/eod).

    Returns one row per record, in file order, with columns :data:`RAW_COLUMNS`:
    ``ts_event`` (bar start, UTC), ``rtype``, ``schema`` ("ohlcv-1m", ...),
    ``publisher_id``, ``instrument_id``, ``symbol`` (None where unknown), decimal
    ``open/high/low/close``, ``volume``, and the ``file`` and ``record`` (DBN record index
    from 0, or CSV line) it came from. ``definitions``: extra definition DBN files
    (file, directory or glob) that name instrument ids the files do not map.
    """
    records, _, _ = _read_all(path, definitions, csv_prices)
    return records


def _shown(value) -> str:
    """A CSV field as the user wrote it: ``5527.25``, not numpy's ``np.float64(5527.25)``."""
    return repr(value.item() if isinstance(value, np.generic) else value)
