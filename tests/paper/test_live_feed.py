"""The Databento live adapter on recorded DBN records, through the client's callback."""

from __future__ import annotations

import databento_dbn as dbn
import numpy as np

from foxhunt.paper.feeds import DatabentoLiveFeed


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


def _asset():
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    return instantiate(OmegaConf.load("conf/asset/es.yaml"))


def _bar(iid, ts, price, volume):
    p = int(round(price * 1e9))
    return dbn.OHLCVMsg(dbn.RType.OHLCV_1M, 1, iid, ts, p, p + 250_000_000, p - 250_000_000, p, volume)


def test_recorded_records_through_the_callback_follow_the_volume_leader_and_roll():
    asset = _asset()
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
