"""Databento OHLCV data (DBN files and CSV exports) as a bars source, rolled by volume.

Inputs. ``path`` is a file, a directory or a glob of:

* DBN files (``.dbn``, ``.dbn.zst``; DBN versions 1-3), decoded with ``databento_dbn``
  (the ``databento`` client is not needed). OHLCV records give the bars; definition
  records (schema ``definition``, in the same path or in ``definitions``) give symbols and
  expirations; a file of any other schema (trades, mbp-1, ...) is an error.
* Databento CSV exports (``.csv``, ``.csv.gz``, ``.csv.zst``): columns ``ts_event, rtype, publisher_id,
  instrument_id, open, high, low, close, volume`` and optionally ``symbol``; prices either
  raw fixed-point integers (1 unit = 1e-9) or decimals, timestamps either integer
  nanoseconds or ISO-8601 (what ``databento_dbn.Transcoder`` / ``DBNStore.to_csv`` write).

Conventions (Databento's): ``ts_event`` is the inclusive START of the bar, in UTC; no bar is
written for an interval without trades, and gaps stay gaps here. Symbols come from the DBN
metadata's symbol mappings (an instrument id maps to a raw symbol over UTC date intervals,
resolved the way the ``databento`` client does), from the CSV ``symbol`` column, else from
definition records; without any of them a contract is known only by its instrument id, so
``load`` then needs a single-instrument file (or ``symbol=<instrument id>``).

Null prices: OHLCV bars always carry prices, so a null price (2**63-1 raw, an empty field
in a decimal CSV) means a damaged file: reading stops with a BarDataError naming the file,
the record (DBN record index from 0, or CSV line) and the field.

Continuous series (:meth:`DatabentoBarSource.load`). Only 1-minute bars (``ohlcv-1m``) make
the training series; other OHLCV schemas can be read with :func:`read_databento_ohlcv`
but ``load`` rejects them naming the schema found. For a parent-symbol request (``ES.FUT``:
every contract plus calendar spreads such as ``ESM5-ESU5``) only the outright futures of the
asset's root are kept (``ES`` + month code + year: spreads, options and other roots are
dropped), then :mod:`foxhunt.data.roll` picks the contract of each CME trading date from what
was known before it opened (the previous session's volume, or the open interest of
statistics files in ``path``; optionally N sessions before expiry), records the roll
schedule and back-adjusts (``adjust``). Definition records (in ``path`` or ``definitions``)
name the contracts, give their expirations, and their tick size and contract size are
checked against the asset config.

Reading the files into records, with their integrity checks, is
:mod:`foxhunt.data.sources.databento_records`; this module turns the records into the series.

:func:`write_ohlcv_1m` writes bars in Databento's format through ``databento_dbn``'s own
encoder, for tests and smoke runs (see its docstring for the exact format).
"""

from __future__ import annotations

import gzip
import io
import re
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import databento_dbn as dbn
import numpy as np
import pandas as pd

from foxhunt.assets import AssetSpec
from foxhunt.data.bars import (
    BAR_COLUMNS,
    check_path_setting,
    resolve_files,
    source_fingerprint,
    validate_bars,
)
from foxhunt.data.errors import BarDataError
from foxhunt.data.roll import (
    ContinuousSeries,
    RollRule,
    build_continuous,
    single_contract,
)
from foxhunt.data.sources.databento_records import (
    CSV_PRICE_FORMATS,
    DATABENTO_CSV_SUFFIXES,
    DBN_SUFFIXES,
    FIXED_PRICE_SCALE,
    MONTH_CODES,
    OHLCV_SCHEMAS,
    RAW_COLUMNS,
    TRAINING_SCHEMA,
    _dbn_metadata,
    _Definitions,
    _read_all,
    read_databento_ohlcv,
)

__all__ = ["MONTH_CODES", "RAW_COLUMNS", "DatabentoBarSource", "outright_expiry_rank", "read_databento_ohlcv", "write_ohlcv_1m"]

#: roll.expiry_sessions at most: two years of sessions, longer than any quarterly contract is the front month
MAX_EXPIRY_SESSIONS = 500

# ============================================================================ roll
_OUTRIGHT = "^{root}(?P<month>[FGHJKMNQUVXZ])(?P<year>[0-9]{{1,2}})$"


def outright_expiry_rank(symbol: str, root: str, first_year: int) -> int | None:
    """``year * 12 + month - 1`` of an outright future symbol such as ``ESU4`` or ``ESZ13``
    (None for spreads, options, other roots). A one-digit year is the first year ending in
    that digit from ``first_year`` (the year the contract is first seen trading) on."""
    match = re.match(_OUTRIGHT.format(root=re.escape(root)), symbol)
    if match is None:
        return None
    month = MONTH_CODES.index(match["month"])
    digits = match["year"]
    modulus = 10 ** len(digits)
    year = first_year + (int(digits) - first_year) % modulus
    return year * 12 + month


# ============================================================================ source
class DatabentoBarSource:
    """Continuous 1-minute front-month bars from Databento OHLCV files.

    Every setting comes from the config (conf/data/databento.yaml holds the defaults: CME Globex's
    dataset, rolled by volume, not adjusted, CSV prices told apart by their type).

    Args:
        path: a DBN (``.dbn``/``.dbn.zst``) or Databento CSV (``.csv``/``.csv.gz``/``.csv.zst``) file, a
            directory of them, or a glob. Definition files among them are used for symbols.
        definitions: extra definition DBN files (file, directory or glob) naming
            instrument ids when the data files carry no symbol mappings; None for none.
        symbol: take exactly this contract (raw symbol such as ``ESU4``, a continuous symbol
            such as ``ES.c.0``, or an instrument id) instead of rolling; None to roll
            the asset's outrights.
        roll: the roll rule (:class:`foxhunt.data.roll.RollRule`): ``by`` volume or
            open_interest (of the session before), ``expiry_sessions`` (roll at the latest
            this many sessions before expiry; needs definitions), or a plain "volume".
        adjust: back-adjustment of the continuous prices: none, difference or ratio.
        csv_prices: "auto" (integer columns are fixed-point 1e-9, others decimal), "fixed"
            or "decimal".
        dataset: the Databento dataset the DBN files' metadata must name (``GLBX.MDP3``);
            None accepts any.
    """

    def __init__(
        self,
        path: str,
        definitions: str | None,
        symbol: str | None,
        roll: Any,
        adjust: str,
        csv_prices: str,
        dataset: str | None,
    ) -> None:
        check_path_setting(path, "a Databento DBN or CSV file")
        self.rule = RollRule.from_config(roll, adjust)
        if self.rule.expiry_sessions is not None and self.rule.expiry_sessions > MAX_EXPIRY_SESSIONS:
            raise ValueError(
                f"roll.expiry_sessions={self.rule.expiry_sessions!r}: must be null or an integer in [0, {MAX_EXPIRY_SESSIONS}]"
            )
        if csv_prices not in CSV_PRICE_FORMATS:
            raise ValueError(f"csv_prices={csv_prices!r}: must be one of {', '.join(CSV_PRICE_FORMATS)}")
        self.path = str(path)
        self.dataset = None if dataset is None else str(dataset)
        self.definitions = None if definitions is None else str(definitions)
        self.symbol = None if symbol is None else str(symbol)
        self.csv_prices = csv_prices

    # ------------------------------------------------------------------ public API
    def load(self, asset: AssetSpec) -> pd.DataFrame:
        """The continuous 1-minute bars frame of ``asset`` (see the module docstring and
        :func:`foxhunt.data.roll.continuous` for the extra columns; ``attrs["rolls"]``)."""
        return self.continuous(asset).bars()

    def continuous(self, asset: AssetSpec) -> ContinuousSeries:
        """The rolled series with its schedule and rolls (:mod:`foxhunt.data.roll`)."""
        return self._continuous(asset)

    def front_months(self, asset: AssetSpec) -> pd.Series:
        """The contract used on each trading date (index: trading date; values: symbol)."""
        return self._continuous(asset).front_months()

    def files(self) -> list[Path]:
        """The files this source reads: its bars, then its definition files (``data show`` lists
        them, as it does the CSV and Lean sources': it listed none of a Databento source's)."""
        files = resolve_files(self.path, DBN_SUFFIXES + DATABENTO_CSV_SUFFIXES, "Databento DBN or CSV files")
        if self.definitions:
            files += resolve_files(self.definitions, DBN_SUFFIXES, "Databento definition files")
        return files

    def fingerprint(self, asset: AssetSpec) -> str:
        files = self.files()
        params = {
            "path": self.path,
            "definitions": self.definitions,
            "symbol": self.symbol,
            "roll": self.rule.params(),
            "csv_prices": self.csv_prices,
            "dataset": self.dataset,
        }
        return source_fingerprint("databento", params, asset, files)

    # ------------------------------------------------------------------ internals
    def _continuous(self, asset: AssetSpec) -> ContinuousSeries:
        records, definitions, files = _read_all(self.path, self.definitions, self.csv_prices)
        for file in files:
            if file.name.lower().endswith(DBN_SUFFIXES):
                self._check_metadata(file, asset)
        wrong = records["schema"].to_numpy() != TRAINING_SCHEMA
        if wrong.any():
            i = int(np.flatnonzero(wrong)[0])
            row = records.iloc[i]
            raise _other_schema(row["file"], row["schema"])
        contracts = self._contracts(records, asset, definitions)
        self._validate_contracts(contracts, asset)
        definitions.check(asset, set(contracts["contract"].astype(str)))
        one_unnamed = contracts["contract"].nunique() == 1 and contracts["month"].isna().all()  # an instrument id only
        if self.symbol is not None or one_unnamed:
            return single_contract(contracts, asset, self.path)
        expiration = {}
        for iid, symbol in definitions.symbol.items():
            if iid in definitions.expiration:
                expiration[symbol] = pd.Timestamp(definitions.expiration[iid], unit="ns", tz="UTC")
        oi = pd.DataFrame(definitions.open_interest, columns=["instrument_id", "symbol", "published", "value"])
        oi = oi.assign(contract=oi["symbol"].fillna(oi["instrument_id"].map(definitions.symbol)))
        return build_continuous(contracts, asset, self.rule, expiration, oi[["contract", "published", "value"]])

    def _contracts(self, records: pd.DataFrame, asset: AssetSpec, definitions: _Definitions) -> pd.DataFrame:
        """The candidate records with columns ts/contract/rank, before the roll."""
        symbols = records["symbol"]
        iids = records["instrument_id"]
        if self.symbol is not None:
            mask = (symbols == self.symbol).to_numpy()
            if self.symbol.isdigit():
                mask = mask | (iids == int(self.symbol)).to_numpy()
            if not mask.any():
                found = sorted(set(symbols.dropna())) or sorted(set(iids.astype(str)))
                raise BarDataError(f"{self.path}: symbol {self.symbol!r} not found (contracts found: {', '.join(found)})")
            picked = records.loc[mask].copy()
            # the contract's own root must be the asset's, as without symbol=: ESU4 read as asset=nq was trained and
            # scored with NQ's multiplier on ES prices (found by a helper probing the data)
            for symbol, year in picked.groupby("symbol")["ts_event"].min().dt.year.items():
                if _continuous_of(str(symbol), asset.root):  # ES.c.0: Databento's own continuous series of the root
                    continue
                if outright_expiry_rank(str(symbol), asset.root, int(year)) is None:
                    raise BarDataError(f"{self.path}: symbol={self.symbol!r} names {symbol}, not an outright {asset.root} "
                                       f"futures contract nor a continuous one ({asset.root}.c.0) (asset={asset.key})")  # fmt: skip
            picked["contract"] = self.symbol
            picked["rank"] = 0.0
            picked["month"] = np.nan
            return self._with_ts(picked)
        if symbols.notna().any():
            first_year = records.groupby("symbol")["ts_event"].min().dt.year
            rank_of = {}
            for symbol, year in first_year.items():
                rank = outright_expiry_rank(str(symbol), asset.root, int(year))
                if rank is not None:
                    rank_of[symbol] = rank
            if not rank_of:
                seen = ", ".join(sorted(map(str, first_year.index)))
                raise BarDataError(
                    f"{self.path}: no outright {asset.root} futures contract among the symbols found "
                    f"({seen}); spreads, options and other roots are dropped"
                )
            picked = records.loc[symbols.isin(list(rank_of)).to_numpy()].copy()
            expirations = picked["instrument_id"].map(definitions.expiration)
            if expirations.notna().all():
                picked["rank"] = expirations.astype(np.float64)
            else:
                picked["rank"] = picked["symbol"].map(rank_of).astype(np.float64)
            picked["month"] = picked["symbol"].map(rank_of).astype(np.float64)
            picked["contract"] = picked["symbol"].astype(object)
            return self._with_ts(picked)
        ids = sorted(set(iids.tolist()))
        if len(ids) > 1:
            raise BarDataError(
                f"{self.path}: {len(ids)} instrument ids ({', '.join(map(str, ids[:10]))}) and no symbols: "
                "the file has no symbol mappings or symbol column, so contracts and roots cannot be told "
                "apart; "
                "pass definitions= (definition DBN files) or symbol=<instrument id>"
            )
        picked = records.copy()
        picked["contract"] = f"instrument_id={ids[0]}"
        picked["rank"] = 0.0
        picked["month"] = np.nan
        return self._with_ts(picked)

    def _check_metadata(self, file: Path, asset: AssetSpec) -> None:
        """The schema and dataset a DBN file's metadata names: another bar schema than the
        training one is refused (as on the records, which are checked too), the dataset against
        ``dataset`` (the symbols are checked on the records: no outright of the asset's root)."""
        metadata = _dbn_metadata(file)
        schema = str(metadata.schema) if metadata.schema is not None else None  # None: a file of several schemas
        if (
            schema is not None and schema in OHLCV_SCHEMAS.values() and schema != TRAINING_SCHEMA
        ):  # ohlcv-1s metadata over 1-minute records
            raise _other_schema(file, schema)  # loaded as 1-minute bars (found by a helper): the two disagree
        found = str(metadata.dataset or "")
        if self.dataset and found and found != self.dataset:
            raise BarDataError(
                f"{file}: metadata dataset {found}, but data.source.dataset={self.dataset} "
                "(set data.source.dataset to the file's dataset, or null for any)"
            )

    @staticmethod
    def _with_ts(frame: pd.DataFrame) -> pd.DataFrame:
        frame["ts"] = frame["ts_event"]
        return frame

    @staticmethod
    def _validate_contracts(contracts: pd.DataFrame, asset: AssetSpec) -> None:
        """Each contract's bars of each file must be a valid bars frame on their own."""
        for (file, contract), group in contracts.groupby(["file", "contract"], sort=False):
            row_name = "record" if str(file).lower().endswith(DBN_SUFFIXES) else "line"
            frame = pd.DataFrame(
                {c: group[c].to_numpy() for c in BAR_COLUMNS},
                index=pd.DatetimeIndex(group["ts"]),
            )
            validate_bars(
                frame,
                asset.tick_size,
                origin=f"{file} [{contract}]",
                rows=group["record"].to_numpy(),
                row_name=row_name,
            )


# ============================================================================ writing
def write_ohlcv_1m(
    bars: pd.DataFrame,
    path: str | Path,
    symbol: str,
    instrument_id: int,
    dataset: str = "GLBX.MDP3",
    publisher_id: int = 1,
) -> Path:
    """Write a bars frame as Databento ``ohlcv-1m`` data for one instrument; returns the path.

    The format follows the suffix of ``path``:

    * ``.dbn`` / ``.dbn.zst``: DBN version 3 (zstd-compressed for ``.zst``), written by
      ``databento_dbn``: metadata with dataset ``dataset``, schema ``ohlcv-1m``, stype_in
      ``raw_symbol``, stype_out ``instrument_id``, ``symbols=[symbol]``, start = the first
      bar, end = one minute after the last, and one symbol mapping ``symbol ->
      instrument_id`` over the UTC dates of the bars; then one ``OhlcvMsg`` per bar
      (rtype 33, ``ts_event`` = bar start in ns, prices fixed-point 1e-9, volume integer).
    * ``.csv`` / ``.csv.gz``: the same records as ``databento_dbn.Transcoder`` writes CSV:
      header ``ts_event,rtype,publisher_id,instrument_id,open,high,low,close,volume,symbol``,
      ISO-8601 nanosecond timestamps with ``Z``, decimal prices with 9 decimals, the symbol
      in the last column (gzip-compressed for ``.gz``).
    """
    target = Path(path)
    name = target.name.lower()
    if not name.endswith(DBN_SUFFIXES + DATABENTO_CSV_SUFFIXES):
        raise ValueError(f"{target}: unsupported suffix; use one of {', '.join(DBN_SUFFIXES + DATABENTO_CSV_SUFFIXES)}")
    missing = [c for c in BAR_COLUMNS if c not in bars.columns]
    if missing or not isinstance(bars.index, pd.DatetimeIndex) or bars.index.tz is None:
        raise ValueError("bars must be a bars frame: columns open/high/low/close/volume and a UTC DatetimeIndex")
    if bars.empty:
        raise ValueError("bars is empty: nothing to write")
    stamps = bars.index.tz_convert("UTC").as_unit("ns").asi8
    prices = {
        c: np.rint(bars[c].to_numpy(dtype=np.float64) * FIXED_PRICE_SCALE).astype(np.int64)
        for c in ("open", "high", "low", "close")
    }
    volume = np.rint(bars["volume"].to_numpy(dtype=np.float64)).astype(np.uint64)
    first_day = np.datetime64(int(stamps[0]), "ns").astype("datetime64[D]").item()
    last_day = np.datetime64(int(stamps[-1]), "ns").astype("datetime64[D]").item()
    interval = SimpleNamespace(start_date=first_day, end_date=last_day + timedelta(days=1), symbol=str(instrument_id))
    metadata = dbn.Metadata(
        dataset=dataset,
        start=int(stamps[0]),
        end=int(stamps[-1]) + 60 * 1_000_000_000,
        stype_in=dbn.SType.RAW_SYMBOL,  # type: ignore[arg-type]  # databento_dbn's stubs type the enum members as str/int
        stype_out=dbn.SType.INSTRUMENT_ID,  # type: ignore[arg-type]  # databento_dbn's stubs type the enum members as str/int
        schema=dbn.Schema.OHLCV_1M,  # type: ignore[arg-type]  # databento_dbn's stubs type the enum members as str/int
        symbols=[symbol],
        mappings=[SimpleNamespace(raw_symbol=symbol, intervals=[interval])],
    )
    rtype = dbn.RType.OHLCV_1M
    body = b"".join(
        bytes(dbn.OHLCVMsg(rtype, publisher_id, instrument_id, int(t), int(o), int(h), int(lo), int(c), int(v)))
        for t, o, h, lo, c, v in zip(stamps, prices["open"], prices["high"], prices["low"], prices["close"], volume, strict=True)
    )
    raw = metadata.encode() + body
    target.parent.mkdir(parents=True, exist_ok=True)
    if name.endswith(".dbn"):
        target.write_bytes(raw)
        return target
    buffer = io.BytesIO()
    if name.endswith(".dbn.zst"):
        transcoder = dbn.Transcoder(buffer, dbn.Encoding.DBN, dbn.Compression.ZSTD)  # type: ignore[arg-type]  # databento_dbn's stubs type the enum members as str/int
    else:
        transcoder = dbn.Transcoder(
            buffer,
            dbn.Encoding.CSV,  # type: ignore[arg-type]  # as above
            dbn.Compression.NONE,  # type: ignore[arg-type]  # as above
            pretty_px=True,
            pretty_ts=True,
            map_symbols=True,
        )
    transcoder.write(raw)
    transcoder.finish()
    data = buffer.getvalue()
    if name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    target.write_bytes(data)
    return target


_CONTINUOUS = re.compile(r"^(?P<root>[A-Z0-9]+)\.[cnv]\.\d+$")  # Databento's continuous symbology: ES.c.0, ES.n.1, ES.v.0


def _continuous_of(symbol: str, root: str) -> bool:
    """Whether ``symbol`` is a continuous contract of ``root`` in Databento's symbology (calendar
    ``c``, open interest ``n`` or volume ``v`` rank): the series Databento rolled, read as it is."""
    found = _CONTINUOUS.match(symbol)
    return found is not None and found.group("root") == root


def _other_schema(file, schema: str) -> BarDataError:
    """A file of another bar schema than the one foxhunt trains on (its metadata's, or its records')."""
    return BarDataError(f"{file}: schema {schema} found; DatabentoBarSource.load needs {TRAINING_SCHEMA} bars "
                        "(read other OHLCV schemas with read_databento_ohlcv)")  # fmt: skip
