"""Bar feeds of a paper session, behind one interface: bars in time order, or a heartbeat.

A feed is an iterator of :class:`FeedBar` (one closed 1-minute bar of one symbol) and ``None``
(a heartbeat: no bar arrived within the feed's poll interval; the loop watches the feed's
staleness and its stop signal on it). Every bar carries the prices the features read
(``open .. close``, back-adjusted when the data source adjusts) and the raw prices of the
contract held (``raw_open``, ``raw_close``, ``roll_price`` on a roll bar), which orders fill at.

* :class:`FileFeed`: the bars of the config's ``data`` group (DBN, Databento CSV, foxhunt CSV,
  the synthetic source: the readers of :mod:`foxhunt.data.sources`, so a missing, truncated or
  out-of-order file or a bar off the tick grid is the reader's one-line ``BarDataError``, raised
  before anything is written), paced by ``paper.speed`` (1: the bars' own times, 0: as fast as
  possible, N: N x). Bars before the traded window only prime the features. Its identity in a
  ledger is :meth:`FileFeed.digest`, the sha256 of the bars it holds and of its traded window;
  a resume replays :meth:`FileFeed.history`, its first bars, against the ledger.
* :class:`DatabentoLiveFeed`: Databento's live gateway (the ``databento`` package's ``Live``,
  imported only here and only when used), ``ohlcv-1m`` of the asset's parent symbol. The
  gateway sends every contract and spread of the parent; the feed keeps the asset's outright
  contracts and follows one, chosen as :mod:`foxhunt.data.roll` chooses (the volume leader of
  the previous trading date; before one full trading date, the nearest expiry seen), and marks
  the first bar after a change as a roll bar (``roll_price``: the new contract's last close
  seen, else its first open). :meth:`DatabentoLiveFeed.on_record` is the client's callback;
  tests feed it recorded DBN records (no network here).

Written by hand: the ``databento`` client delivers records, not bars of a continuous contract
chosen without look-ahead, and the file readers give whole frames, not a paced stream.

Both feeds look at ``should_stop`` (the loop's SIGINT/SIGTERM flag) at least every
:data:`WAIT_SLICE_S` while they wait (a paced bar, a quiet gateway) and end when it is set.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import os
import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import databento_dbn as dbn
import numpy as np

from foxhunt.data.calendar import calendar_for
from foxhunt.data.errors import BarDataError
from foxhunt.data.roll import RAW_CLOSE, ROLL_PRICE
from foxhunt.data.sources.databento import outright_expiry_rank
from foxhunt.errors import ConfigError

# Lazy imports: (b) databento, the live client: an optional extra (foxhunt[databento]), missing is one line

log = logging.getLogger(__name__)

NAN = float("nan")
FIXED_PRICE_SCALE = 1e-9  # Databento prices are integers of 1e-9 units
UNDEF_PRICE = 2**63 - 1
WAIT_SLICE_S = 0.25  # the longest a feed waits without looking at its stop flag (a signal is answered within it)


def _never() -> bool:
    return False


@dataclass(frozen=True)
class FeedBar:
    """One closed bar of ``symbol``, starting at ``ts_ns`` (UTC ns). ``trade``: False for a
    bar that only primes the features (before the traded window)."""

    symbol: str
    ts_ns: int
    open: float
    high: float
    low: float
    close: float
    volume: float
    raw_open: float
    raw_close: float
    roll_price: float = NAN
    trade: bool = True
    contract: str = ""

    @property
    def values(self) -> tuple[int, float, float, float, float, float]:
        return (self.ts_ns, self.open, self.high, self.low, self.close, self.volume)


def check_symbol(symbol: str, asset) -> str:
    """``symbol`` when it is the asset's (its parent, one of its contracts, a continuous
    symbol of its root), else a one-line ConfigError: the ensemble was trained on that asset only."""
    root = str(asset.root)
    if symbol == str(asset.symbol) or symbol.startswith(f"{root}.") or outright_expiry_rank(symbol, root, 2000) is not None:
        return symbol
    raise ConfigError(f"paper.symbol={symbol}: the ensemble was trained on {asset.key} ({asset.symbol}, contracts {root}<month><year>); "
                      f"trade a symbol of that root, or load an ensemble of that asset (asset=...)")  # fmt: skip


class FileFeed:
    """The bars of a loaded bars frame from ``first`` on, ``trade`` from ``start`` (index),
    paced by ``speed`` (module doc); ``after_ns``: bars at or before it are skipped (a resume)."""

    def __init__(self, bars, symbol: str, start: int, stop: int, speed: float, description: str) -> None:
        self.symbol = symbol
        self.description = description
        self.speed = float(speed)
        self.stamps = bars.index.as_unit("ns").asi8
        self.values = bars[["open", "high", "low", "close", "volume"]].to_numpy(np.float64)
        raw_close = bars[RAW_CLOSE].to_numpy(np.float64) if RAW_CLOSE in bars else self.values[:, 3]
        # a back-adjusted series is shifted by one constant per contract (difference, none):
        # the raw open is the adjusted open less the bar's shift (ratio is refused upstream)
        shift = self.values[:, 3] - raw_close
        self.raw = np.stack([self.values[:, 0] - shift, raw_close], axis=1)
        self.roll = bars[ROLL_PRICE].to_numpy(np.float64) if ROLL_PRICE in bars else np.full(len(bars), np.nan)
        self.first_traded, self.end_index = int(start), int(stop)
        self.after_ns: int | None = None
        self.tick: float | None = None
        self.identity = description  # what the session's identity names the feed by (run.file_feed: source and split)
        self.should_stop: Callable[[], bool] = _never

    def __len__(self) -> int:
        return self.end_index

    def __iter__(self) -> Iterator[FeedBar | None]:
        first = 0 if self.after_ns is None else int(np.searchsorted(self.stamps[: self.end_index], self.after_ns, side="right"))
        return self._bars(first, self.speed)

    def history(self, count: int) -> list[FeedBar]:
        """The feed's first ``count`` bars, unpaced (what a ledger of this feed must hold)."""
        return list(itertools.islice(self._bars(0, 0.0), count))

    def digest(self) -> str:
        """``sha256:<hex>`` of every bar held (times, prices, volumes, raw and roll prices) and
        of the traded window: equal digests, equal bars traded."""
        sha = hashlib.sha256()
        for array in (self.stamps, self.values, self.raw, self.roll, np.array([self.first_traded, self.end_index], np.int64)):
            sha.update(np.ascontiguousarray(array).tobytes())
        return f"sha256:{sha.hexdigest()}"

    def _bars(self, first: int, speed: float) -> Iterator[FeedBar]:
        paced_from: tuple[float, int] | None = None
        stamps, values, raw, roll = self.stamps.tolist(), self.values.tolist(), self.raw.tolist(), self.roll.tolist()
        for i in range(first, self.end_index):
            trade = i >= self.first_traded
            if trade and speed > 0:
                if paced_from is None:
                    paced_from = (time.monotonic(), stamps[i])
                due = paced_from[0] + (stamps[i] - paced_from[1]) / 1e9 / speed
                while (wait := due - time.monotonic()) > 0:
                    if self.should_stop():
                        return
                    time.sleep(min(wait, WAIT_SLICE_S))
            o, h, lo, c, v = values[i]
            yield FeedBar(self.symbol, stamps[i], o, h, lo, c, v, _tick(raw[i][0], self.tick), raw[i][1], roll[i], trade)


def _tick(price: float, tick: float | None) -> float:
    return price if tick is None else round(price / tick) * tick


class DatabentoLiveFeed:
    """Databento's live ``ohlcv-1m`` bars of a parent symbol (module doc).

    ``client``: anything with ``add_callback``, ``subscribe``, ``start`` and ``stop`` (the
    ``databento.Live`` client; None: made from the key in ``key_env``)."""

    def __init__(self, asset, symbol: str, dataset: str, schema: str, key_env: str, poll_s: float,
                 client=None) -> None:  # fmt: skip

        self.asset = asset
        self.symbol = symbol
        self.dataset, self.schema, self.key_env = dataset, schema, key_env
        self.poll_s = float(poll_s)
        self.calendar = calendar_for(asset)
        self.description = f"Databento live {dataset} {schema} {symbol}"
        self.identity = f"live:{dataset}:{schema}"
        self.client = client
        self._connect: Callable[[], Any] | None = None if client is not None else self._gateway()
        self.should_stop: Callable[[], bool] = _never
        self.after_ns: int | None = None
        self.queue: queue.Queue = queue.Queue()
        self.errors: list[str] = []
        self._names: dict[int, str] = {}  # instrument id -> raw symbol (symbol mapping records)
        self._volume: dict[str, dict[str, float]] = {}  # trading date -> contract -> volume
        self._last_close: dict[str, float] = {}
        self._first_year: int | None = None
        self._held: str | None = None
        self._date: str | None = None
        self._roll_price: float | None = None  # set at a roll, until the new contract's first bar
        self._emitted = False

    # -- the client ------------------------------------------------------------------------
    def _gateway(self) -> Callable[[], Any]:
        """What connects the official client, checked here, when the feed is made: no API key in
        ``key_env`` or no ``databento`` package is one line before the session writes anything (a
        refused attempt wrote a ledger stamped live, which then refused the default file session)."""
        key = os.environ.get(self.key_env)
        if not key:
            raise ConfigError(f"paper.feed=live: no API key in ${self.key_env} (paper.live.key_env)")
        try:
            import databento
        except ImportError:
            raise ConfigError(
                "paper.feed=live: the databento package is not installed (pip install 'foxhunt[databento]')"
            ) from None
        return lambda: databento.Live(key=key)

    def start(self) -> None:
        if self.client is None:
            assert self._connect is not None  # made without a client: __init__ checked the gateway
            self.client = self._connect()
        self.client.add_callback(self.on_record, self._on_callback_error)
        self.client.subscribe(dataset=self.dataset, schema=self.schema, symbols=[self.symbol], stype_in="parent")
        self.client.start()

    def stop(self) -> None:
        if self.client is not None:
            with _quiet():
                self.client.stop()

    def _on_callback_error(self, exc: Exception) -> None:
        self.errors.append(f"{type(exc).__name__}: {exc}")

    def __iter__(self) -> Iterator[FeedBar | None]:
        quiet_until = time.monotonic() + self.poll_s
        while not self.should_stop():
            left = quiet_until - time.monotonic()
            if left <= 0:
                quiet_until = time.monotonic() + self.poll_s
                yield None  # a heartbeat: nothing for poll_s
                continue
            try:
                item = self.queue.get(timeout=min(left, WAIT_SLICE_S))
            except queue.Empty:
                continue
            if item is _END:
                return
            quiet_until = time.monotonic() + self.poll_s
            yield item

    def end(self) -> None:
        """The stream is over (the gateway closed it, or a test's records are all in)."""
        self.queue.put(_END)

    # -- records ---------------------------------------------------------------------------
    def on_record(self, record) -> None:
        """The live client's callback: a symbol mapping names an instrument; an OHLCV bar of
        an outright contract of the root updates the contract choice and, when it is of the
        contract held, is queued as a bar; gateway errors and notices are logged."""
        if isinstance(record, dbn.SymbolMappingMsg):
            self._names[int(record.instrument_id)] = str(record.stype_out_symbol)
        elif isinstance(record, dbn.OHLCVMsg):
            bar = self._bar(record)
            if bar is not None:
                self.queue.put(bar)
        elif isinstance(record, dbn.ErrorMsg):
            self.errors.append(str(record.err))
            log.error("Databento gateway: %s", record.err)
        elif isinstance(record, dbn.SystemMsg):
            log.info("Databento gateway: %s", record.msg)

    def _bar(self, record) -> FeedBar | None:
        name = self._names.get(int(record.instrument_id))
        if name is None:
            return None
        ts = int(record.ts_event)
        if self._first_year is None:
            self._first_year = int(np.datetime64(ts, "ns").astype("datetime64[Y]").astype(int) + 1970)
        if outright_expiry_rank(name, str(self.asset.root), self._first_year) is None:
            return None  # a spread, an option, another root
        prices = [int(record.open), int(record.high), int(record.low), int(record.close)]
        if any(p == UNDEF_PRICE for p in prices):
            raise BarDataError(f"{self.description}: {name} bar at {np.datetime64(ts, 'ns')}: a null price")
        o, h, lo, c = (p * FIXED_PRICE_SCALE for p in prices)
        date = str(self.calendar.trading_dates(np.array([ts], "datetime64[ns]"))[0])
        if date != self._date:
            previous = self._volume.get(self._date) if self._date is not None else None
            self._date = date
            leader = max(previous, key=previous.__getitem__) if previous else None
            if (
                leader is not None
                and self._held is not None
                and leader != self._held
                and self._rank(leader) > self._rank(self._held)
            ):
                self._held = leader  # never back to an earlier expiry
                self._roll_price = self._last_close.get(leader, NAN)
        if self._held is None or (not self._emitted and self._rank(name) < self._rank(self._held)):
            self._held = name  # before a bar is sent: the nearest expiry seen
        day = self._volume.setdefault(date, {})
        day[name] = day.get(name, 0.0) + float(record.volume)
        roll_from = self._last_close.get(name, NAN)
        self._last_close[name] = c
        if name != self._held:
            return None
        roll = NAN
        if self._roll_price is not None:  # the first bar in the new contract: the roll bar
            roll = self._roll_price if not math.isnan(self._roll_price) else (roll_from if not math.isnan(roll_from) else o)
            self._roll_price = None
        self._emitted = True
        return FeedBar(self.symbol, ts, o, h, lo, c, float(record.volume), o, c, roll, True, name)

    def _rank(self, name: str) -> int:
        rank = outright_expiry_rank(name, str(self.asset.root), self._first_year or 2000)
        assert rank is not None, name  # only outrights are held or lead: _bar drops the rest
        return rank


class _End:
    pass


_END = _End()


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return True
