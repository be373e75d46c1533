"""foxhunt.paper.feeds: the file feed's bars (raw prices under a back-adjusted series, the traded
window, a resume, the pace), the symbol check, and the Databento live adapter on recorded DBN
records through the client's callback."""

from __future__ import annotations

import math
import os
import signal
import threading
import time

import databento_dbn as dbn
import numpy as np
import pandas as pd
import pytest
from paper_bars import ES

from foxhunt.data.errors import BarDataError
from foxhunt.errors import ConfigError
from foxhunt.paper.feeds import DatabentoLiveFeed, FileFeed, check_symbol


class _Client:
    def __init__(self):
        self.calls = []

    def add_callback(self, record_callback, exception_callback=None):
        self.callback = record_callback

    def subscribe(self, **kwargs):
        self.calls.append(kwargs)

    def start(self):
        pass

    def stop(self):
        pass


def _bar(iid, ts, price, volume):
    p = int(round(price * 1e9))
    return dbn.OHLCVMsg(dbn.RType.OHLCV_1M, 1, iid, ts, p, p + 250_000_000, p - 250_000_000, p, volume)


def test_recorded_records_through_the_callback_follow_the_volume_leader_and_roll():
    asset = ES
    client = _Client()
    feed = DatabentoLiveFeed(asset, "ES.FUT", "GLBX.MDP3", "ohlcv-1m", "DATABENTO_API_KEY", 0.01, client=client)
    feed.start()
    assert client.calls == [{"dataset": "GLBX.MDP3", "schema": "ohlcv-1m", "symbols": ["ES.FUT"], "stype_in": "parent"}]
    for iid, name in ((1, "ESH4"), (2, "ESM4"), (3, "ESH4-ESM4")):
        client.callback(dbn.SymbolMappingMsg(1, iid, 0, dbn.SType.RAW_SYMBOL, "ES.FUT", dbn.SType.RAW_SYMBOL, name, 0, 0))
    day1 = np.datetime64("2024-03-12T15:00", "ns").astype(np.int64)
    day2 = np.datetime64("2024-03-13T15:00", "ns").astype(np.int64)
    minute = 60_000_000_000
    for k in range(3):  # ESM4 leads the volume on day 1; the spread is dropped
        client.callback(_bar(1, int(day1 + k * minute), 5000.0 + k, 10))
        client.callback(_bar(2, int(day1 + k * minute), 5050.0 + k, 900))
        client.callback(_bar(3, int(day1 + k * minute), 50.0, 5))
    for k in range(2):
        client.callback(_bar(1, int(day2 + k * minute), 5010.0, 10))
        client.callback(_bar(2, int(day2 + k * minute), 5060.25 + k, 900))
    feed.end()
    bars = [b for b in feed if b is not None]
    assert [b.contract for b in bars] == ["ESH4"] * 3 + ["ESM4"] * 2
    assert np.isnan(bars[0].roll_price) and bars[3].roll_price == 5052.0  # ESM4's last close seen before the roll
    assert bars[3].raw_close == 5060.25 and np.isnan(bars[4].roll_price)


def test_a_gateway_error_is_kept_and_a_null_price_is_a_data_error():
    client = _Client()
    feed = DatabentoLiveFeed(ES, "ES.FUT", "GLBX.MDP3", "ohlcv-1m", "DATABENTO_API_KEY", 0.01, client=client)
    feed.start()
    client.callback(dbn.ErrorMsg(0, "auth failed"))
    assert feed.errors == ["auth failed"]
    client.callback(dbn.SymbolMappingMsg(1, 1, 0, dbn.SType.RAW_SYMBOL, "ES.FUT", dbn.SType.RAW_SYMBOL, "ESM4", 0, 0))
    ts = int(np.datetime64("2024-03-12T15:00", "ns").astype(np.int64))
    undefined = 2**63 - 1
    with pytest.raises(BarDataError, match="ESM4 bar at 2024-03-12T15:00:00.000000000: a null price"):
        client.callback(dbn.OHLCVMsg(dbn.RType.OHLCV_1M, 1, 1, ts, undefined, undefined, undefined, undefined, 10))
    client.callback(dbn.OHLCVMsg(dbn.RType.OHLCV_1M, 1, 99, ts, 1, 1, 1, 1, 10))  # an instrument never named: dropped
    assert feed.queue.empty()


def test_a_quiet_gateway_is_a_heartbeat_and_no_key_is_one_line(monkeypatch):
    feed = DatabentoLiveFeed(ES, "ES.FUT", "GLBX.MDP3", "ohlcv-1m", "DATABENTO_API_KEY", 0.01, client=_Client())
    items = iter(feed)
    assert next(items) is None  # nothing within poll_s
    feed.end()
    assert list(items) == []
    monkeypatch.delenv("FOXHUNT_TEST_NO_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"^paper.feed=live: no API key in \$FOXHUNT_TEST_NO_KEY \(paper.live.key_env\)$"):
        DatabentoLiveFeed(ES, "ES.FUT", "GLBX.MDP3", "ohlcv-1m", "FOXHUNT_TEST_NO_KEY", 0.01)  # refused when made, not at start


@pytest.mark.parametrize("symbol", ["ES.FUT", "ES.c.0", "ESM4", "ESZ24"])
def test_a_symbol_of_the_assets_root_is_accepted(symbol):
    assert check_symbol(symbol, ES) == symbol


@pytest.mark.parametrize("symbol", ["NQ.FUT", "NQM4", "ESM4-ESU4", "MESM4", "ES"])
def test_a_symbol_of_another_root_is_one_line(symbol):
    with pytest.raises(ConfigError) as error:
        check_symbol(symbol, ES)
    assert str(error.value).startswith(
        f"paper.symbol={symbol}: the ensemble was trained on es (ES.FUT, contracts ES<month><year>)"
    )


def _continuous(n: int = 8) -> pd.DataFrame:
    """A back-adjusted series (difference): bars 0-3 in the old contract, shifted by -10 points
    against its own prices; a roll on bar 4, the new contract's own prices from there."""
    index = pd.date_range("2024-03-12 15:00", periods=n, freq="1min", tz="UTC")
    close = 4800.0 + 0.25 * np.arange(n)
    shift = np.where(np.arange(n) < 4, -10.0, 0.0)
    return pd.DataFrame({"open": close - 0.25, "high": close + 0.5, "low": close - 0.5, "close": close, "volume": 5.0,
                         "raw_close": close - shift, "roll_price": np.where(np.arange(n) == 4, 4801.0, np.nan)},
                        index=index)  # fmt: skip


def test_a_file_feed_gives_the_raw_prices_the_traded_window_and_resumes_after_a_bar():
    frame = _continuous()
    feed = FileFeed(frame, "ES.FUT", start=3, stop=7, speed=0.0, description="test")
    feed.tick = ES.tick_size
    bars = list(feed)
    assert len(bars) == len(feed) == 7  # the stop bar and after are not read
    assert [b.trade for b in bars] == [False] * 3 + [True] * 4
    assert [b.ts_ns for b in bars] == list(frame.index.as_unit("ns").asi8[:7])
    for b, (_, row) in zip(bars, frame.iterrows()):
        assert (b.open, b.close, b.raw_close) == (row["open"], row["close"], row["raw_close"])
        assert b.raw_open == row["open"] + (row["raw_close"] - row["close"])  # the bar's shift undone
        assert b.raw_open == ES.round_to_tick(b.raw_open)
    assert math.isnan(bars[3].roll_price) and bars[4].roll_price == 4801.0
    feed.after_ns = bars[4].ts_ns
    assert [b.ts_ns for b in feed] == [bars[5].ts_ns, bars[6].ts_ns]


def test_a_file_feed_is_paced_from_its_first_traded_bar():
    feed = FileFeed(_continuous(), "ES.FUT", start=4, stop=8, speed=600.0, description="test")  # a minute in 0.1 s
    started = time.monotonic()
    stamps = []
    for b in feed:
        stamps.append((b.trade, time.monotonic() - started))
    primed = [t for trade, t in stamps if not trade]
    traded = [t for trade, t in stamps if trade]
    assert max(primed) < 0.15  # priming bars are not paced (paced, their 3 minutes would take 0.3 s)
    assert traded[-1] - traded[0] >= 0.3 - 0.01 and traded[-1] < 2.0  # 3 minutes at 600 x


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_paced_feed_stops_within_a_second_of_a_signal(sig):
    """At speed 10 the next bar is 6 s away: SIGTERM or SIGINT while the feed waits for it ends
    the feed within a second, no bar more."""
    from foxhunt.paper.run import _Signals

    feed = FileFeed(_continuous(), "ES.FUT", start=0, stop=8, speed=10.0, description="test")
    signals = _Signals()
    timer = threading.Timer(0.3, os.kill, (os.getpid(), sig))
    try:
        feed.should_stop = signals.requested
        items = iter(feed)
        assert next(items).trade  # the pace starts at the first traded bar
        timer.start()
        started = time.monotonic()
        after = next(items, None)
        waited = time.monotonic() - started
    finally:
        timer.cancel()
        signals.restore()
    assert signals.seen == sig and after is None
    assert waited < 0.3 + 1.0, waited


def test_a_quiet_live_feed_stops_within_a_second_of_a_signal():
    feed = DatabentoLiveFeed(ES, "ES.FUT", "GLBX.MDP3", "ohlcv-1m", "DATABENTO_API_KEY", 5.0, client=_Client())
    stop = threading.Event()
    feed.should_stop = stop.is_set
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    items = []
    for item in feed:  # (a feed that ignores the stop yields a heartbeat after 5 s, and goes on)
        items.append(item)
        break
    assert items == []  # no heartbeat either: the poll interval (5 s) never passed
    assert time.monotonic() - started < 0.3 + 1.0


def test_a_file_feeds_digest_is_its_bars_and_window():
    frame = _continuous()
    digest = FileFeed(frame, "ES.FUT", 3, 7, 0.0, "a").digest()
    assert digest.startswith("sha256:") and FileFeed(frame.copy(), "ES.FUT", 3, 7, 1.0, "b").digest() == digest
    moved = frame.copy()
    moved.iloc[5, moved.columns.get_loc("close")] += 0.25
    assert FileFeed(moved, "ES.FUT", 3, 7, 0.0, "a").digest() != digest  # one price
    assert FileFeed(frame, "ES.FUT", 2, 7, 0.0, "a").digest() != digest  # the window
    assert [b.ts_ns for b in FileFeed(frame, "ES.FUT", 3, 7, 600.0, "a").history(5)] == list(frame.index.as_unit("ns").asi8[:5])
