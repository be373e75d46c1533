"""The streaming feature pipeline equals the batch one bar for bar, and refuses bad bars."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from market_bars import load_asset, make_bars

from foxhunt.data.errors import BarDataError
from foxhunt.data.features import (
    FEATURE_GROUPS,
    FeatureConfig,
    compute_features,
    future_known_features,
)
from foxhunt.data.streaming import StreamingFeatures, normalize, normalizer

FEATURES = FeatureConfig(momentum_bars=5, volatility_bars=7, volume_bars=11)


def _stream(bars: pd.DataFrame, asset, cfg=FEATURES) -> list[np.ndarray | None]:
    stream = StreamingFeatures(asset, cfg)
    stamps = bars.index.as_unit("ns").asi8
    rows = bars[["open", "high", "low", "close", "volume"]].to_numpy()
    return [stream.update(int(ts), *row) for ts, row in zip(stamps, rows)]


@pytest.mark.parametrize("key", ["es", "6e", "zn"])
def test_every_bar_equals_the_batch_pipeline_across_session_breaks_and_weekends(key):
    asset = load_asset(key)
    bars = make_bars(asset, 3000, seed=3, start="2024-03-07 20:00")  # spans a weekend and daily breaks
    batch = compute_features(bars, asset, FEATURES).to_numpy()
    streamed = _stream(bars, asset)
    warmup = FEATURES.warmup_bars
    assert all(row is None for row in streamed[:warmup])
    assert all(row is not None for row in streamed[warmup:])
    np.testing.assert_allclose(np.stack(streamed[warmup:]), batch[warmup:], rtol=1e-9, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), momentum=st.integers(1, 20), vol=st.integers(1, 20), volume=st.integers(1, 30),
       n=st.integers(40, 200))  # fmt: skip
def test_streaming_equals_batch_for_any_windows(seed, momentum, vol, volume, n):
    asset = load_asset("nq")
    cfg = FeatureConfig(momentum_bars=momentum, volatility_bars=vol, volume_bars=volume)
    bars = make_bars(asset, n, seed=seed)
    batch = compute_features(bars, asset, cfg).to_numpy()
    streamed = _stream(bars, asset, cfg)
    first = cfg.warmup_bars
    if first >= n:
        assert all(row is None for row in streamed)
        return
    assert streamed[first - 1] is None if first else True
    # running sums leave ~1e-12 where a window of squared returns sums to exactly 0 (returns are
    # ~1e-4, their squares ~1e-8: still 1e-4 of the smallest real value)
    np.testing.assert_allclose(np.stack(streamed[first:]), batch[first:], rtol=1e-9, atol=1e-11)


def test_the_future_calendar_of_the_stream_equals_the_batch_one():
    asset = load_asset("es")
    bars = make_bars(asset, 50, seed=1)
    stream = StreamingFeatures(asset, FEATURES)
    stamps = bars.index.as_unit("ns").asi8
    batch = future_known_features(bars.index.tz_localize(None).to_numpy(), 10, asset, FEATURES)
    for i, ts in enumerate(stamps):
        np.testing.assert_allclose(stream.calendar.future(int(ts), 10), batch[i], rtol=0, atol=1e-6)


def test_normalize_applies_the_train_statistics():
    asset = load_asset("es")
    bars = make_bars(asset, 80, seed=2)
    row = [r for r in _stream(bars, asset) if r is not None][0]
    observed = [12, 13, 14, 15]
    mean, std = np.array([1.0, 2.0, 3.0, 4.0]), np.array([2.0, 2.0, 4.0, 8.0])
    out = normalize(row, *normalizer(16, observed, mean, std))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[observed], ((row[observed] - mean) / std).astype(np.float32))
    np.testing.assert_array_equal(out[:12], row[:12].astype(np.float32))
    assert len(FEATURE_GROUPS["observed"]) == len(observed)


def _bar(stream, ts, **over):
    values = {"open_": 5000.0, "high": 5000.5, "low": 4999.75, "close": 5000.25, "volume": 10.0, **over}
    return stream.update(int(pd.Timestamp(ts).value), values["open_"], values["high"], values["low"],
                         values["close"], values["volume"])  # fmt: skip


@pytest.mark.parametrize(
    ("second", "message"),
    [
        ({"ts": "2024-03-07 20:00"}, "out of order, not after the previous bar"),
        ({"ts": "2024-03-07 19:59"}, "out of order"),
        ({"ts": "2024-03-07 20:01", "close": 5000.1}, "close=5000.1 is off the tick grid of es, tick 0.25 (20000.400000 ticks)"),
        ({"ts": "2024-03-07 20:01", "close": float("nan")}, "close=nan is not a finite price"),
        ({"ts": "2024-03-07 20:01", "volume": -1.0}, "volume=-1.0 is negative"),
        # a fractional count passed, and a training file's 1e16 passed where a stream refused it (one rule now)
        ({"ts": "2024-03-07 20:01", "volume": 812.5}, "volume=812.5 is not a whole number of contracts"),
        ({"ts": "2024-03-07 20:01", "volume": 2.0**64 - 1}, "volume=1.8446744073709552e+19 is past 1e+15"),
        ({"ts": "2024-03-07 20:01", "high": 4999.0}, "do not bound"),
        # 4e-9 ticks: within the grid's float-noise tolerance of tick 0, so it passed as on the grid
        ({"ts": "2024-03-07 20:01", "low": 1e-9}, "low=1e-09 is below one tick (0.25): a price is at least one tick"),
        ({"ts": "2024-03-07 20:01", "open_": 1e-9, "high": 1e-9, "low": 1e-9, "close": 1e-9}, "open=1e-09 is below one tick"),
    ],
)
def test_a_bad_bar_gets_one_line_naming_it_and_changes_nothing(second, message):
    asset = load_asset("es")
    stream = StreamingFeatures(asset, FEATURES, origin="live ES")
    _bar(stream, "2024-03-07 20:00")
    ts = second.pop("ts")
    with pytest.raises(BarDataError, match="live ES: bar 1 \\(2024-03-07T") as caught:
        _bar(stream, ts, **second)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert stream.bars == 1 and stream.last_ts == pd.Timestamp("2024-03-07 20:00").value
