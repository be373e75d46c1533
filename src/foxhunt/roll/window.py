"""The bars of a roll step: the last bar the champions have seen, the bars after it, the newest
block champion and challenger are scored on, and the challenger's training window.

**Seen.** A champion has seen every bar of its training run's data (its version's
``dataset.json``: the last bar of its last split) and every block a roll scored it on; a roll
records the latter on the champion's run as the tag :data:`SEEN_TAG` (ISO UTC). The ensemble has
seen up to the latest of its champions' (:func:`ensemble_seen`): every bar after that is new to
each of them.

**Layout** (:func:`plan`; ``roll.*``), over the bars of the ``data`` source::

    ... [window: the challenger's train / val / test, at most window_bars][purge][newest block]
                                                                  new bars: ^^^^^^^^^^^^^^^^^^^^^^^

The newest block is the last ``eval_bars`` new bars (all of them when fewer); the challenger
trains on the ``window_bars`` bars that end ``purge_bars`` before it, so it is selected on its own
validation block, which lies before the purge and the newest block; the champion has seen none
of the newest block. With fewer than ``min_new_bars`` new bars a step has nothing to do. A source
whose last bar is before what the champions have seen shrank (or is another one): one line.

**The window's snapshot** (:func:`write_window`): the challenger trains through
:mod:`foxhunt.training` like any run, on a CSV file of the window's bars (foxhunt's
``CsvBarSource``, bars labelled at their start), written beside the roll's outputs and kept
there: its run's provenance records the file's digest, so the run reproduces. A source that
rolls contracts (``raw_close``, ``roll_price``: the roll bars' prices) cannot be written as plain
OHLCV without losing them, so it is refused in one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from foxhunt.data.roll import RAW_CLOSE, ROLL_PRICE
from foxhunt.errors import UserError

SEEN_TAG = "roll.seen_until"  # run tag of a champion: the last bar (ISO UTC) it trained on or was scored on by a roll
WINDOW_FILE = "window.csv"
CSV_COLUMNS = ("timestamp_utc", "open", "high", "low", "close", "volume")


class RollError(UserError):
    """Bars a roll step cannot use (a source that shrank, one that rolls contracts, too few bars
    before the newest block): one line naming the key or the source."""

    kind = "roll"


def iso(ns: int) -> str:
    return f"{np.datetime_as_string(np.datetime64(int(ns), 'ns'), unit='s')}Z"


def parse_iso(text: str, origin: str) -> int:
    try:
        stamp = pd.Timestamp(text)
        if stamp.tzinfo is None:
            raise ValueError("no zone")
        return int(stamp.tz_convert("UTC").as_unit("ns").value)
    except (ValueError, TypeError):
        raise RollError(f"{origin}: {text!r} is not a UTC time (ISO-8601 with Z); the tag was edited") from None


def trained_until(manifest: dict, origin: str) -> int:
    """The last bar of a version's training data (its ``dataset.json`` splits)."""
    lasts = [extent.get("last_bar") for extent in (manifest.get("splits") or {}).values() if extent.get("last_bar")]
    if not lasts:
        raise RollError(f"{origin}: its dataset.json names no split's last bar; register it again (foxhunt ensemble register)")
    return max(parse_iso(str(last), f"{origin}: dataset.json") for last in lasts)


def ensemble_seen(seen: dict[str, int]) -> int:
    """The last bar every champion has seen: the latest of theirs (each family's)."""
    return max(seen.values())


@dataclass(frozen=True)
class Plan:
    """One step's bars, as row indices of the source's bars (stops exclusive)."""

    seen_ns: int
    new_bars: int
    window_start: int
    window_stop: int
    eval_start: int
    eval_stop: int

    def describe(self, stamps: np.ndarray) -> str:
        return (f"window {iso(stamps[self.window_start])} .. {iso(stamps[self.window_stop - 1])} "
                f"({self.window_stop - self.window_start:,} bars), newest block {iso(stamps[self.eval_start])} .. "
                f"{iso(stamps[self.eval_stop - 1])} ({self.eval_stop - self.eval_start:,} bars)")  # fmt: skip


@dataclass(frozen=True)
class NothingNew:
    """Too few new bars for a step: the line that says so."""

    line: str


def plan(stamps: np.ndarray, seen_ns: int, roll, origin: str) -> Plan | NothingNew:
    """The step's layout over the bars starting at ``stamps`` (UTC ns, sorted; module doc)."""
    if len(stamps) == 0 or int(stamps[-1]) < seen_ns:
        last = iso(stamps[-1]) if len(stamps) else "none"
        raise RollError(f"{origin}: its last bar ({last}) is before the last bar the champions have seen ({iso(seen_ns)}): the "
                        "source shrank, or is another one; nothing rolled")  # fmt: skip
    first_new = int(np.searchsorted(stamps, seen_ns, side="right"))
    new = len(stamps) - first_new
    if new < int(roll.min_new_bars):
        return NothingNew(f"{new:,} new bar(s) since the last bar the champions have seen ({iso(seen_ns)}); a step needs "
                          f"roll.min_new_bars={int(roll.min_new_bars):,}: nothing to do")  # fmt: skip
    eval_start = len(stamps) - min(new, int(roll.eval_bars))
    window_stop = eval_start - int(roll.purge_bars)
    window_start = max(0, window_stop - int(roll.window_bars))
    if window_stop - window_start < 2:
        raise RollError(f"{origin}: {max(window_stop, 0):,} bar(s) before the newest block and roll.purge_bars="
                        f"{int(roll.purge_bars)}: no window to train a challenger on")  # fmt: skip
    return Plan(seen_ns, new, window_start, window_stop, eval_start, len(stamps))


def check_windowable(bars: pd.DataFrame, origin: str) -> None:
    """A source whose bars carry contract rolls cannot be written as a plain OHLCV window (module doc)."""
    rolled = [column for column in (RAW_CLOSE, ROLL_PRICE) if column in bars]
    if rolled:
        raise RollError(f"{origin}: its bars roll contracts ({', '.join(rolled)}); a challenger's window is written as plain "
                        "OHLCV bars, which would lose the roll prices: roll one contract (data.source.symbol) or a "
                        "continuous OHLCV series (data=csv)")  # fmt: skip


def write_window(bars: pd.DataFrame, start: int, stop: int, folder: Path) -> Path:
    """Bars ``start:stop`` as a CSV file ``CsvBarSource`` reads (``bar_label=start``, UTC)."""
    folder.mkdir(parents=True, exist_ok=True)
    chosen = bars.iloc[start:stop]
    stamps = np.datetime_as_string(chosen.index.as_unit("ns").asi8.astype("datetime64[ns]"), unit="s")
    frame = pd.DataFrame({"timestamp_utc": [f"{s}Z" for s in stamps]})
    for column in CSV_COLUMNS[1:]:
        values = chosen[column].to_numpy(np.float64)
        if not np.isfinite(values).all():
            raise RollError(f"bars {start}..{stop}: a {column} value is not finite")
        frame[column] = values
    path = folder / WINDOW_FILE
    tmp = path.with_name(path.name + ".tmp")
    frame.to_csv(tmp, index=False, float_format=None)
    tmp.replace(path)
    return path


def seen_from_tag(value: str | None, origin: str) -> int | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else parse_iso(str(value), origin)
