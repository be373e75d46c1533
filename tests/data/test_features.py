"""Features: layout, exact static / calendar / market values, gaps, no look-ahead, config errors."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from market_bars import load_asset, make_bars, replace_after
from omegaconf import OmegaConf

from foxhunt.data.features import (
    FEATURE_GROUPS,
    FEATURE_NAMES,
    FeatureConfig,
    compute_features,
)

CFG = {
    "momentum_bars": 5,
    "volatility_bars": 10,
    "volume_bars": 20,
    "rth_open": "09:30",
    "rth_close": "16:00",
    "rth_tz": "America/New_York",
}
ES = load_asset("es")
BARS = make_bars(ES, 300, seed=3)
FEATURES = compute_features(BARS, ES, CFG)


def _one_bar(ts: str) -> pd.DataFrame:
    index = pd.DatetimeIndex([pd.Timestamp(ts, tz="UTC")], name="ts")
    return pd.DataFrame(
        {"open": [1.0], "high": [1.0], "low": [1.0], "close": [1.0], "volume": [1.0]},
        index=index,
    )


def test_layout_sixteen_columns_in_group_order():
    assert [len(FEATURE_GROUPS[g]) for g in ("static", "known", "observed")] == [4, 8, 4]
    expected = [*FEATURE_GROUPS["static"], *FEATURE_GROUPS["known"], *FEATURE_GROUPS["observed"]]
    assert list(FEATURE_NAMES) == expected
    assert list(FEATURES.columns) == expected
    assert FEATURES.index.equals(BARS.index)
    assert (FEATURES.dtypes == np.float64).all()
    assert "log_return" in FEATURE_GROUPS["observed"]


def test_static_features_exact_for_es():
    static = FEATURES[list(FEATURE_GROUPS["static"])]
    assert static.nunique().tolist() == [1, 1, 1, 1]
    row = static.iloc[0]
    assert row["tick_size_bps"] == pytest.approx(0.25 / 4800.0 * 1e4)  # 0.5208 bp
    assert row["log10_tick_value"] == pytest.approx(math.log10(12.5))
    assert row["daily_vol_pct"] == pytest.approx(1.0)
    assert row["session_hours_frac"] == pytest.approx(23.0 / 24.0)


def _known(asset_key: str, ts: str) -> pd.Series:
    asset = load_asset(asset_key)
    return compute_features(_one_bar(ts), asset, CFG)[list(FEATURE_GROUPS["known"])].iloc[0]


def test_calendar_features_at_es_cash_open():
    # 2024-01-02 14:30 UTC is Tuesday 09:30 ET: minute 570, 930 min after the 18:00 open of
    # a 1380-minute session, in regular hours, trade date Tuesday (weekday 1).
    row = _known("es", "2024-01-02 14:30")
    angle = 2 * math.pi * 570 / 1440
    expected = {
        "minute_of_day_sin": math.sin(angle),
        "minute_of_day_cos": math.cos(angle),
        "day_of_week_sin": math.sin(2 * math.pi / 7),
        "day_of_week_cos": math.cos(2 * math.pi / 7),
        "session_elapsed": 930 / 1380,
        "session_remaining": 450 / 1380,
        "regular_hours": 1.0,
        "week_elapsed": (1 + 930 / 1380) / 5,
    }
    assert row.to_dict() == pytest.approx(expected, abs=1e-12)
    assert row["minute_of_day_sin"] == pytest.approx(0.6087614290087207)
    assert row["session_elapsed"] == pytest.approx(0.6739130434782609)


def test_calendar_follows_daylight_saving_time():
    # 13:30 UTC in July is 09:30 EDT: same local features as the winter 14:30 UTC bar
    # except the weekday (2024-07-02 is also a Tuesday).
    summer = _known("es", "2024-07-02 13:30")
    winter = _known("es", "2024-01-02 14:30")
    assert summer.to_dict() == pytest.approx(winter.to_dict(), abs=1e-12)


def test_sunday_evening_open_starts_the_trade_week():
    # 2024-01-07 23:00 UTC = Sunday 18:00 ET, the Globex open of Monday's trade date.
    row = _known("es", "2024-01-07 23:00")
    assert row["session_elapsed"] == 0.0
    assert row["session_remaining"] == 1.0
    assert row["week_elapsed"] == 0.0
    assert row["regular_hours"] == 0.0
    assert row["minute_of_day_sin"] == pytest.approx(-1.0)  # 18:00 = 3/4 of the day
    assert row["day_of_week_sin"] == pytest.approx(math.sin(2 * math.pi * 6 / 7))
    # Friday 16:59 ET, the last bar of the week: 1379 of 1380 minutes elapsed.
    row = _known("es", "2024-01-05 21:59")
    assert row["session_remaining"] == pytest.approx(1 / 1380)
    assert row["week_elapsed"] == pytest.approx((4 + 1379 / 1380) / 5)


def test_calendar_in_chicago_zone_for_6e():
    # 14:30 UTC = 08:30 CT: 930 minutes after the 17:00 CT open; regular hours use New York.
    row = _known("6e", "2024-01-02 14:30")
    assert row["session_elapsed"] == pytest.approx(930 / 1380)
    assert row["minute_of_day_cos"] == pytest.approx(math.cos(2 * math.pi * 510 / 1440))
    assert row["regular_hours"] == 1.0
    assert _known("6e", "2024-01-02 14:29")["regular_hours"] == 0.0
    assert _known("6e", "2024-01-02 20:59")["regular_hours"] == 1.0  # 15:59 ET
    assert _known("6e", "2024-01-02 21:00")["regular_hours"] == 0.0  # 16:00 ET, close
    assert _known("es", "2024-01-06 15:00")["regular_hours"] == 0.0  # Saturday


def test_known_features_bounded():
    known = FEATURES[list(FEATURE_GROUPS["known"])].to_numpy()
    assert np.isfinite(known).all()
    assert known.min() >= -1.0 and known.max() <= 1.0


def test_observed_features_hand_computed():
    close = [100.0, 101.0, 99.0, 102.0, 103.0, 101.0]
    volume = [10.0, 30.0, 20.0, 0.0, 40.0, 10.0]
    index = pd.date_range("2024-01-02 15:00", periods=6, freq="1min", tz="UTC", name="ts")
    # A gap of 2 hours before the 4th bar: the return is still taken from the 3rd bar.
    index = index.where(np.arange(6) < 3, index + pd.Timedelta(hours=2))
    bars = pd.DataFrame(
        {"open": close, "high": close, "low": close, "close": close, "volume": volume},
        index=index,
    )
    cfg = {**CFG, "momentum_bars": 2, "volatility_bars": 3, "volume_bars": 2}
    obs = compute_features(bars, ES, cfg)[list(FEATURE_GROUPS["observed"])]
    c, v = np.array(close), np.array(volume)
    r = np.log(c[1:] / c[:-1])
    np.testing.assert_allclose(obs["log_return"].to_numpy()[1:], r, rtol=1e-12)
    assert obs["log_return"].to_numpy()[3] == pytest.approx(math.log(102.0 / 99.0))
    np.testing.assert_allclose(obs["momentum"].to_numpy()[2:], np.log(c[2:] / c[:-2]))
    rv = [math.sqrt(np.mean(r[t - 3 : t] ** 2)) for t in range(3, 6)]
    np.testing.assert_allclose(obs["realized_vol"].to_numpy()[3:], rv, rtol=1e-12)
    ratio = [math.log1p(v[t]) - math.log1p((v[t - 1] + v[t]) / 2) for t in range(1, 6)]
    np.testing.assert_allclose(obs["log_volume_ratio"].to_numpy()[1:], ratio, rtol=1e-12)
    # warm-up: exactly the rows whose trailing windows are not full are NaN
    assert obs.isna().to_numpy().tolist() == [
        [True, True, True, True],
        [False, True, True, False],
        [False, False, True, False],
        [False, False, False, False],
        [False, False, False, False],
        [False, False, False, False],
    ]
    assert FeatureConfig.from_config(cfg).warmup_bars == 3


def test_flat_prices_give_zero_volatility_not_nan():
    bars = make_bars(ES, 60, seed=1)
    bars["close"] = 4800.0
    obs = compute_features(bars, ES, CFG)
    assert (obs["realized_vol"].iloc[10:] == 0.0).all()


@settings(max_examples=25, deadline=None)
@given(k=st.integers(min_value=0, max_value=len(BARS) - 2), seed=st.integers(0, 2**16))
def test_no_look_ahead(k, seed):
    changed = replace_after(BARS, k, seed)
    assert not changed.iloc[k + 1 :].equals(BARS.iloc[k + 1 :])
    after = compute_features(changed, ES, CFG)
    np.testing.assert_array_equal(after.iloc[: k + 1].to_numpy(), FEATURES.iloc[: k + 1].to_numpy())
    assert not np.array_equal(after.iloc[k + 1 :].to_numpy(), FEATURES.iloc[k + 1 :].to_numpy())


def test_config_accepts_dictconfig_and_dataclass():
    from_dict = FeatureConfig.from_config(CFG)
    assert FeatureConfig.from_config(OmegaConf.create(CFG)) == from_dict
    assert FeatureConfig.from_config(from_dict) == from_dict


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"momentum_bars": 0}, r"features\.momentum_bars=0: must be an integer >= 1"),
        ({"volume_bars": 2.5}, r"features\.volume_bars=2\.5"),
        ({"rth_open": "9h30"}, r"features\.rth_open='9h30'"),
        ({"rth_tz": "Mars/Olympus"}, r"features\.rth_tz='Mars/Olympus'"),
        ({"extra": 1}, r"features\.extra: unknown key"),
    ],
)
def test_config_errors_name_the_key(change, message):
    with pytest.raises(ValueError, match=message):
        FeatureConfig.from_config({**CFG, **change})


def test_missing_key_and_bad_bars_errors():
    cfg = dict(CFG)
    del cfg["volatility_bars"]
    with pytest.raises(ValueError, match=r"features\.volatility_bars: missing key"):
        compute_features(BARS, ES, cfg)
    with pytest.raises(ValueError, match=r"missing columns \['volume'\]"):
        compute_features(BARS.drop(columns="volume"), ES, CFG)
    with pytest.raises(ValueError, match="time-zone aware"):
        compute_features(BARS.tz_localize(None), ES, CFG)
    bad = BARS.copy()
    bad.iloc[7, bad.columns.get_loc("volume")] = np.nan
    with pytest.raises(ValueError, match=r"bars frame: volume=nan at .* \(row 7\): must be"):
        compute_features(bad, ES, CFG)
    with pytest.raises(ValueError, match="strictly increasing"):
        compute_features(BARS.iloc[::-1], ES, CFG)
