"""Generic OHLCV CSV files (plain, gzip or zstd) as a bars source.

Column names, the time zone of naive timestamps, the timestamp format (or the epoch unit of
numeric timestamps) and the bar-label convention are all arguments, so the same class reads
most vendors' minute files. Bars labelled at their CLOSE (the real 6E file's convention)
are shifted back by one bar so the output is labelled at the bar START, like every source.

``path`` may be one file, a directory (every ``*.csv``, ``*.csv.gz``, ``*.csv.zst``, ``*.txt``... in it) or a glob;
files are read in name order and must not overlap. Each file is checked with
:func:`~foxhunt.data.bars.validate_bars` with the file path as origin and CSV line numbers
(the header is line 1), then the concatenation is checked once more.
"""

from __future__ import annotations

import zlib
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
from zstandard import ZstdError

from foxhunt.assets import AssetSpec
from foxhunt.data.bars import (
    BAR_COLUMNS,
    check_path_setting,
    resolve_files,
    source_fingerprint,
    unreadable,
    validate_bars,
)
from foxhunt.data.errors import BarDataError
from foxhunt.data.zstd import ZSTD_SUFFIX, check_zstd_file
from foxhunt.errors import one_line

#: A time of day followed by its zone (Z, +hh, +hhmm, +hh:mm): a timestamp that carries its own offset.
_ZONED = r"\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?\s*(?:Z|[+-]\d{2}(?::?\d{2})?)$"

CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.zst", ".txt", ".txt.gz", ".txt.zst")
BAR_LABELS = ("start", "close")
EPOCH_UNITS = ("s", "ms", "us", "ns")
MAX_BAR_MINUTES = 1440  # a day: the longest bar whose close label is shifted back to its start


class CsvBarSource:
    """Bars from OHLCV CSV files with configurable columns, time zone and label convention.

    Every setting comes from the config (conf/data/csv.yaml holds the defaults: the 6E files' format).

    Args:
        path: a CSV file (``.gz`` or ``.zst`` allowed), a directory of them or a glob.
        timestamp_column, open_column, high_column, low_column, close_column, volume_column:
            the header names of the six fields.
        timezone: IANA zone of naive (offset-less) timestamps; timestamps that carry an
            offset, and numeric epoch timestamps, are converted from their own zone.
        bar_label: "start" when a row's timestamp is the bar's open time, "close" when it is
            the bar's end (the row is then moved back by ``bar_minutes``).
        timestamp_format: strftime format of the timestamp text; None parses ISO-8601.
        timestamp_unit: "s", "ms", "us" or "ns" when timestamps are numbers since the UNIX
            epoch (UTC); None when they are text.
        bar_minutes: the bar length in minutes (the label shift for close-labelled bars).
        delimiter: the field separator.
    """

    def __init__(
        self,
        path: str,
        timestamp_column: str,
        open_column: str,
        high_column: str,
        low_column: str,
        close_column: str,
        volume_column: str,
        timezone: str,
        bar_label: str,
        timestamp_format: str | None,
        timestamp_unit: str | None,
        bar_minutes: int,
        delimiter: str,
    ) -> None:
        check_path_setting(path, "a CSV file")
        if not (isinstance(delimiter, str) and len(delimiter) == 1):  # '' was a data error once the run was made (a helper)
            raise ValueError(f"delimiter={delimiter!r}: must be one character (',', ';', a tab)")
        if bar_label not in BAR_LABELS:
            raise ValueError(f"bar_label={bar_label!r}: must be one of {', '.join(BAR_LABELS)}")
        if timestamp_unit is not None and timestamp_unit not in EPOCH_UNITS:
            raise ValueError(f"timestamp_unit={timestamp_unit!r}: must be one of {', '.join(EPOCH_UNITS)} or null")
        if not (isinstance(bar_minutes, int) and not isinstance(bar_minutes, bool) and 1 <= bar_minutes <= MAX_BAR_MINUTES):
            raise ValueError(f"bar_minutes={bar_minutes!r}: must be a whole number of minutes in [1, {MAX_BAR_MINUTES}]")
        try:
            pd.Timestamp("2024-01-01").tz_localize(timezone)
        except Exception as exc:  # noqa: BLE001 - any failure means an unusable zone
            raise ValueError(f"timezone={timezone!r}: not a known time zone ({one_line(str(exc))})") from None
        self.path = str(path)
        self.columns = {
            "ts": timestamp_column,
            "open": open_column,
            "high": high_column,
            "low": low_column,
            "close": close_column,
            "volume": volume_column,
        }
        self.timezone = timezone
        self.bar_label = bar_label
        self.timestamp_format = timestamp_format
        self.timestamp_unit = timestamp_unit
        self.bar_minutes = bar_minutes
        self.delimiter = delimiter

    # ------------------------------------------------------------------ public API
    def files(self) -> list[Path]:
        return resolve_files(self.path, CSV_SUFFIXES, "OHLCV CSV files")

    def load(self, asset: AssetSpec) -> pd.DataFrame:
        """All bars of the files, start-labelled in UTC, checked against the contract."""
        files = self.files()
        frames = [self._read_file(file, asset) for file in files]
        if len(frames) == 1:
            return frames[0]
        # each row named by its file and line (a row of the files joined, counted from 0, named none of them),
        # the label made for the row an error names only
        names = [_relative(file, self.path) for file in files]
        starts = np.cumsum([0, *(len(frame) for frame in frames)])

        def label(i: int) -> str:
            which = int(np.searchsorted(starts, i, side="right")) - 1
            return f"{names[which]}, line {i - starts[which] + 2}"  # line 1 is the header

        return validate_bars(pd.concat(frames), asset.tick_size, origin=self.path, rows=label, row_name="file")

    def fingerprint(self, asset: AssetSpec) -> str:
        return source_fingerprint("csv", self._params(), asset, self.files())

    # ------------------------------------------------------------------ internals
    def _params(self) -> dict:
        return {
            "path": self.path,
            "columns": self.columns,
            "timezone": self.timezone,
            "bar_label": self.bar_label,
            "timestamp_format": self.timestamp_format,
            "timestamp_unit": self.timestamp_unit,
            "bar_minutes": self.bar_minutes,
            "delimiter": self.delimiter,
        }

    def _read_file(self, file: Path, asset: AssetSpec) -> pd.DataFrame:
        origin = str(file)
        ts_name = self.columns["ts"]
        if file.name.lower().endswith(ZSTD_SUFFIX):  # cut short, it read as fewer rows: refused whole
            check_zstd_file(file)
        try:
            raw = pd.read_csv(
                file,
                sep=self.delimiter,
                dtype={ts_name: str} if self.timestamp_unit is None else None,
                skipinitialspace=True,
            )
        except (OSError, ValueError, UnicodeDecodeError, EOFError, zlib.error, ZstdError) as exc:
            raise unreadable(file, exc, "CSV") from None
        raw = self._one_field_per_column(raw, file)
        missing = [name for name in self.columns.values() if name not in raw.columns]
        if missing:
            found = ", ".join(map(str, raw.columns)) or "none"
            raise BarDataError(f"{origin}: missing column(s) {', '.join(missing)} (columns found: {found})")
        if raw.empty:
            raise BarDataError(f"{origin}: no bars (the file has a header but no rows)")
        lines = np.arange(len(raw)) + 2  # line 1 is the header
        index = self._timestamps(raw[ts_name], origin, lines)
        frame = pd.DataFrame({column: raw[self.columns[column]].to_numpy() for column in BAR_COLUMNS}, index=index)
        return validate_bars(frame, asset.tick_size, origin=origin, rows=lines, row_name="line")

    def _one_field_per_column(self, raw: pd.DataFrame, file: Path) -> pd.DataFrame:
        """Every row one field per header column (found by a helper probing the data): rows of one
        field more than the header made pandas take the first field as the index and shift every
        column ("field 'timestamp_utc'='1.1' is not a timestamp"); those fields are read as the
        header says when they are all empty (a delimiter ending each line), else refused. A column
        named twice in the header (pandas reads the second as '<name>.1') is refused: the first
        was read and the second dropped, unsaid."""
        twice = [name for name in self.columns.values() if f"{name}.1" in raw.columns]
        if twice:
            raise BarDataError(f"{file}: column '{twice[0]}' is named twice in the header (which one holds the {twice[0]}?)")
        if isinstance(raw.index, pd.RangeIndex):
            return raw
        filled = np.flatnonzero(raw[raw.columns[-1]].notna().to_numpy())
        if filled.size:
            raise BarDataError(f"{file}: line {int(filled[0]) + 2} has {len(raw.columns) + 1} fields, the header "
                               f"{len(raw.columns)} (a field too many)")  # fmt: skip
        shifted = raw.reset_index()  # the index was the first column: each name one place left, the empty last field gone
        shifted = shifted.iloc[:, : len(raw.columns)]
        shifted.columns = list(raw.columns)
        return shifted

    def _timestamps(self, column: pd.Series, origin: str, lines: np.ndarray) -> pd.DatetimeIndex:
        name = self.columns["ts"]
        if self.timestamp_unit is not None:
            numbers = pd.to_numeric(column, errors="coerce")
            bad = np.flatnonzero(numbers.isna().to_numpy())
            if bad.size:
                i = int(bad[0])
                raise BarDataError(
                    f"{origin}: line {lines[i]}: field '{name}'={column.iloc[i]!r} is not an epoch number "
                    f"in {self.timestamp_unit}"
                )
            try:
                index = pd.DatetimeIndex(pd.to_datetime(numbers.to_numpy(), unit=self.timestamp_unit, utc=True))
            except (OverflowError, ValueError):  # pandas' OutOfBoundsDatetime: past what nanoseconds since 1970 hold
                limit = pd.Timestamp.max.value / pd.Timedelta(1, unit=self.timestamp_unit).value
                i = int(np.flatnonzero(~numbers.abs().le(limit).to_numpy())[0])
                raise BarDataError(
                    f"{origin}: line {lines[i]}: field '{name}'={str(column.iloc[i])!r} is outside the epoch times foxhunt reads "
                    f"(years 1678..2261 in {self.timestamp_unit})"
                ) from None
        else:
            text = column.astype(str).str.strip()
            # every time with its own offset: each converted from it (-05:00, then -04:00 after a DST change, was
            # refused as 'Mixed timezones detected'; found by a helper probing the data); naive and zoned mixed stay refused
            zoned = bool(text.str.contains(_ZONED, regex=True).all())
            try:
                parsed = pd.to_datetime(text, format=self.timestamp_format or "ISO8601", errors="coerce", utc=zoned)
            except (ValueError, TypeError) as exc:  # e.g. naive and offset timestamps mixed
                raise BarDataError(f"{origin}: field '{name}': cannot parse timestamps ({one_line(str(exc))})") from None
            bad = np.flatnonzero(parsed.isna().to_numpy())
            if bad.size:
                i = int(bad[0])
                expected = self.timestamp_format or "ISO-8601"
                raise BarDataError(
                    f"{origin}: line {lines[i]}: field '{name}'={column.iloc[i]!r} is not a timestamp (expected {expected})"
                )
            index = pd.DatetimeIndex(parsed)
            if index.tz is None:
                try:
                    # the hour repeated when summer time ends, told apart by the rows' order ("raise" refused every
                    # file across an autumn change: found by a helper probing the data)
                    index = index.tz_localize(self.timezone, ambiguous="infer", nonexistent="raise")
                except Exception as exc:  # noqa: BLE001 - pandas raises several types here
                    raise BarDataError(
                        f"{origin}: field '{name}': timestamps do not exist or are ambiguous in "
                        f"{self.timezone} ({one_line(str(exc))})"
                    ) from None
        index = index.tz_convert("UTC")
        if self.bar_label == "close":
            index = index - timedelta(minutes=self.bar_minutes)
        return index


def _relative(file: Path, path: str) -> str:
    """``file`` as found under ``path`` (a folder or a pattern): its name below the folder."""
    folder = Path(path)
    try:
        return str(file.relative_to(folder)) if folder.is_dir() else file.name
    except ValueError:
        return str(file)
