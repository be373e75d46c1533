"""foxhunt.paper.run, its parts before and after the loop (the whole command is test_paper.py):
the feed built from the config (the traded window is the split's, the bars before it prime),
refused settings in one line, the latency figures, the signals that end the loop, the view mode."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import numpy as np
import pytest
from hydra.utils import instantiate

from foxhunt.errors import ConfigError
from foxhunt.paper.run import _Signals, _stats, _view, build_feed
from foxhunt.paper.view import PaperView
from foxhunt.training.parts import build_dataset, compose_config


def ensemble_cfg(tmp_path, *overrides: str):
    days = [] if any(o.startswith("data=") for o in overrides) else ["data.source.days=4"]
    return compose_config([*days, "logger=none", *overrides], root_dir=tmp_path, config_name="ensemble")


def test_a_file_feed_trades_the_split_and_primes_on_the_bars_before(tmp_path):
    cfg = ensemble_cfg(tmp_path, "paper.split=val", "paper.speed=0")
    asset = instantiate(cfg.asset)
    feed = build_feed(cfg, asset, "ES.FUT")
    val = build_dataset(cfg, asset).splits["val"].timestamps.astype("datetime64[ns]").astype(np.int64)
    bars = [b for b in feed]
    traded = [b.ts_ns for b in bars if b.trade]
    assert traded == list(val)  # every bar of the split, and nothing after it
    assert all(not b.trade for b in bars[: len(bars) - len(traded)]) and bars[0].ts_ns < val[0]
    assert feed.identity == "SyntheticBarSource:val" and feed.tick == asset.tick_size
    assert feed.description.startswith(f"SyntheticBarSource the val split ({len(val)} bars;")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data=databento", "data.source.path=/nowhere.dbn", "data.source.adjust=ratio"],
         "data.source.adjust=ratio: paper orders fill at raw prices on the tick grid; use adjust=difference or none"),
        (["paper.feed=live", "paper.live.key_env=FOXHUNT_TEST_NO_KEY"],
         "paper.feed=live: no API key in $FOXHUNT_TEST_NO_KEY (paper.live.key_env)"),
        (["paper.feed=live", "paper.live.key_env=FOXHUNT_TEST_KEY"],
         "paper.feed=live: the databento package is not installed (pip install 'foxhunt[databento]')"),
    ],
)  # fmt: skip
def test_a_feed_that_cannot_trade_is_one_line_before_anything_is_read(tmp_path, monkeypatch, overrides, message):
    import sys

    monkeypatch.delenv("FOXHUNT_TEST_NO_KEY", raising=False)
    monkeypatch.setenv("FOXHUNT_TEST_KEY", "db-test")
    monkeypatch.setitem(sys.modules, "databento", None)  # not installed: its import raises ImportError
    cfg = ensemble_cfg(tmp_path, *overrides)
    with pytest.raises(ConfigError) as error:
        build_feed(cfg, instantiate(cfg.asset), "ES.FUT")
    assert str(error.value) == message


def test_latency_figures_in_microseconds():
    stats = _stats([1_000, 2_000, 3_000, 4_000, 100_000])
    assert stats["p50"] == 3.0 and stats["mean"] == pytest.approx(22.0)
    assert stats["p99"] == pytest.approx(np.percentile([1, 2, 3, 4, 100], 99))
    assert all(np.isnan(v) for v in _stats([]).values())


def test_sigterm_ends_the_loop_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    signals = _Signals()
    assert not signals.requested()
    assert signal.getsignal(signal.SIGTERM) == signals._on  # installed (else the kill below would end pytest)
    os.kill(os.getpid(), signal.SIGTERM)
    assert signals.requested() and signals.seen == signal.SIGTERM
    signals.restore()
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_view_mode():
    def paper(view: str) -> SimpleNamespace:
        return SimpleNamespace(view=view, view_refresh_hz=4.0)

    assert _view(paper("never"), "t", None) is None
    assert _view(paper("auto"), "t", None) is None  # pytest's stdout is not a terminal
    assert isinstance(_view(paper("always"), "t", None), PaperView)
