"""SyntheticBarSource: determinism, calendar, tick grid and the stylized facts it promises."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from configs import synthetic_source
from foxhunt.assets import AssetSpec
from foxhunt.data.bars import BAR_COLUMNS, validate_bars
from foxhunt.data.calendar import MINUTE_NS, calendar_for
from foxhunt.data.errors import BarDataError
from foxhunt.data.sources.synthetic import SyntheticBarSource, ar1_filter

REPO = Path(__file__).resolve().parents[2]
KEYS = ("es", "nq", "6e", "zn")


def asset(key: str) -> AssetSpec:
    cfg = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "asset" / f"{key}.yaml"))
    return AssetSpec(**{k: v for k, v in cfg.items() if k != "_target_"})


ASSETS = {key: asset(key) for key in KEYS}
ES = ASSETS["es"]


def intraday_returns(bars: pd.DataFrame, spec: AssetSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """1-minute log returns within one trading date, their trading dates, and the bar index."""
    log_close = np.log(bars["close"].to_numpy())
    days = calendar_for(spec).trading_dates(bars.index)
    same = days[1:] == days[:-1]
    return np.diff(log_close)[same], days[1:][same], np.flatnonzero(same) + 1


def lag1(x: np.ndarray) -> float:
    return float(np.corrcoef(x[:-1], x[1:])[0, 1])


@pytest.fixture(scope="module")
def es_60() -> pd.DataFrame:
    return synthetic_source(days=60, seed=7).load(ES)


@pytest.fixture(scope="module")
def years() -> dict[str, pd.DataFrame]:
    """A 365-day year per asset; the generation time is printed (not asserted)."""
    out = {}
    for key, spec in ASSETS.items():
        started = time.perf_counter()
        out[key] = synthetic_source(days=365, seed=11).load(spec)
        elapsed = time.perf_counter() - started
        print(f"\nsynthetic {key}: 365 days = {len(out[key]):,} bars in {elapsed:.3f} s")
    return out


# ----------------------------------------------------------------------------- contract
def test_determinism_same_seed_identical_other_seed_different():
    first = synthetic_source(days=10, seed=3).load(ES)
    again = synthetic_source(days=10, seed=3).load(ES)
    other = synthetic_source(days=10, seed=4).load(ES)
    pd.testing.assert_frame_equal(first, again, check_exact=True)
    assert first.index.equals(other.index)
    assert not np.array_equal(first["close"].to_numpy(), other["close"].to_numpy())
    assert synthetic_source(days=10, seed=3).fingerprint(ES) == synthetic_source(days=10, seed=3).fingerprint(ES)
    assert synthetic_source(days=10, seed=3).fingerprint(ES) != synthetic_source(days=10, seed=4).fingerprint(ES)
    # the asset's key is mixed into the seed: ES and NQ do not move in lockstep
    nq = synthetic_source(days=10, seed=3).load(ASSETS["nq"])
    same_direction = np.sign(np.diff(first["close"].to_numpy())) == np.sign(np.diff(nq["close"].to_numpy()))
    assert same_direction.mean() < 0.6


def test_frame_contract_and_exact_calendar():
    bars = synthetic_source(days=14, seed=1, start="2024-01-01").load(ES)
    assert list(bars.columns) == list(BAR_COLUMNS)
    assert bars.index.name == "ts" and bars.index.dtype == "datetime64[ns, UTC]"
    # trading dates Jan 2-5 and 8-12 (Mon-Fri; Jan 1 is a CME holiday), 23 h = 1380 bars each
    assert len(bars) == 9 * 1380
    # Tuesday Jan 2's session opens on the holiday's evening at 18:00 New York (23:00 UTC)
    assert bars.index[0] == pd.Timestamp("2024-01-01 23:00", tz="UTC")
    # Friday Jan 12's session closes at 17:00 New York: last bar starts 16:59 EST = 21:59 UTC
    assert bars.index[-1] == pd.Timestamp("2024-01-12 21:59", tz="UTC")
    assert bars["open"].iloc[0] == ES.price_level
    assert (bars["volume"] >= 1).all()


@pytest.mark.parametrize("key", KEYS)
def test_sessions_weekends_and_daily_break(key):
    spec = ASSETS[key]
    bars = synthetic_source(days=21, seed=2, start="2024-03-01").load(spec)  # spans the US DST change
    local = bars.index.tz_convert(spec.session_tz)
    minutes = local.hour * 60 + local.minute
    open_min = spec.open_time.hour * 60 + spec.open_time.minute
    close_min = spec.close_time.hour * 60 + spec.close_time.minute
    assert not (local.day_of_week == 5).any()  # Saturday
    assert not ((local.day_of_week == 6) & (minutes < open_min)).any()  # Sunday before the open
    assert not ((local.day_of_week == 4) & (minutes >= close_min)).any()  # Friday after the close
    assert not ((minutes >= close_min) & (minutes < open_min)).any()  # the daily break
    per_day = pd.Series(1, index=calendar_for(spec).trading_dates(bars.index)).groupby(level=0).size()
    assert (per_day == spec.session_minutes).all()


@pytest.mark.parametrize("key", KEYS)
def test_prices_sit_exactly_on_the_tick_grid(key):
    spec = ASSETS[key]
    bars = synthetic_source(days=7, seed=5).load(spec)
    prices = bars[["open", "high", "low", "close"]].to_numpy()
    per_unit = round(1 / spec.tick_size)
    assert np.array_equal(prices, np.rint(prices * per_unit) / per_unit)
    assert (bars["high"] >= bars[["open", "close"]].max(axis=1)).all()
    assert (bars["low"] <= bars[["open", "close"]].min(axis=1)).all()


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    days=st.integers(min_value=1, max_value=5),
    key=st.sampled_from(KEYS),
    autocorrelation=st.floats(min_value=-0.6, max_value=0.6),
    vol_of_vol=st.floats(min_value=0.0, max_value=1.0),
)
def test_output_always_passes_validation(seed, days, key, autocorrelation, vol_of_vol):
    spec = ASSETS[key]
    bars = synthetic_source(
        days=days, seed=seed, start="2024-01-08", autocorrelation=autocorrelation, vol_of_vol=vol_of_vol
    ).load(spec)
    checked = validate_bars(bars, spec.tick_size, origin="property")
    pd.testing.assert_frame_equal(checked, bars, check_exact=True)
    # 2024-01-08 is a Monday of a week without holiday: days <= 5 are all full trading dates
    assert len(bars) == days * spec.session_minutes


# ----------------------------------------------------------------------------- stylized facts
@pytest.mark.parametrize("key", KEYS)
def test_daily_volatility_matches_the_asset(years, key):
    spec = ASSETS[key]
    bars = years[key]
    returns, days, _ = intraday_returns(bars, spec)
    realized = np.sqrt(pd.Series(returns**2).groupby(days).sum().mean())
    close_to_close = (
        pd.Series(np.log(bars["close"].to_numpy())).groupby(calendar_for(spec).trading_dates(bars.index)).last().diff().std()
    )
    assert realized == pytest.approx(spec.daily_vol, rel=0.25)
    assert close_to_close == pytest.approx(spec.daily_vol, rel=0.25)


def test_heavy_tails(es_60):
    returns, _, _ = intraday_returns(es_60, ES)
    centered = returns - returns.mean()
    kurtosis = np.mean(centered**4) / np.mean(centered**2) ** 2
    assert kurtosis > 6.0  # normal returns give 3


def test_volatility_clustering(es_60):
    returns, _, _ = intraday_returns(es_60, ES)
    assert lag1(np.abs(returns)) > 0.1
    calm = synthetic_source(days=60, seed=7, vol_of_vol=0.0, intraday_u_depth=1.0).load(ES)
    calm_returns, _, _ = intraday_returns(calm, ES)
    assert abs(lag1(np.abs(calm_returns))) < 0.05  # without clustering or U shape: none


def test_intraday_u_shape(es_60):
    returns, _, position = intraday_returns(es_60, ES)
    session = calendar_for(ES).session_of(es_60.index[position])
    stamps = es_60.index[position].asi8
    since, to_close = (stamps - session["open"]) // MINUTE_NS, (session["close"] - stamps) // MINUTE_NS
    full = (session["close"] - session["open"]) // MINUTE_NS == ES.session_minutes  # not the early closes
    first = returns[full & (since < 60)].std()
    last = returns[full & (to_close <= 60)].std()
    middle = returns[full & (np.abs(since - ES.session_minutes // 2) < 30)].std()
    assert first > 1.5 * middle and last > 1.5 * middle


def test_volume_rises_with_the_move(es_60):
    returns, _, position = intraday_returns(es_60, ES)
    volume = es_60["volume"].to_numpy()[position]
    assert np.corrcoef(volume, np.abs(returns))[0, 1] > 0.3


@pytest.mark.parametrize("target", [0.3, 0.0, -0.2])
def test_autocorrelation_parameter_is_realized(target):
    bars = synthetic_source(days=120, seed=9, autocorrelation=target).load(ES)
    returns, _, _ = intraday_returns(bars, ES)
    assert lag1(returns) == pytest.approx(target, abs=0.04)


# ----------------------------------------------------------------------------- internals
def test_ar1_filter_matches_the_recursion():
    assert ar1_filter(np.array([1.0, 0.0, 0.0, 2.0]), 0.5).tolist() == [1.0, 0.5, 0.25, 2.125]
    assert ar1_filter(np.array([0.0, 0.0]), -0.5, initial=4.0).tolist() == [-2.0, 1.0]
    rng = np.random.default_rng(0)
    e = rng.standard_normal(5000)
    for phi in (0.3, -0.7, 0.999):
        reference = np.empty_like(e)
        x = 0.25
        for i, value in enumerate(e):
            x = phi * x + value
            reference[i] = x
        np.testing.assert_allclose(ar1_filter(e, phi, initial=0.25), reference, rtol=1e-10, atol=1e-10)


def test_invalid_arguments_name_the_key():
    with pytest.raises(ValueError, match="autocorrelation=1.0"):
        synthetic_source(seed=0, autocorrelation=1.0)
    with pytest.raises(ValueError, match="tail_dof=2.0"):
        synthetic_source(seed=0, tail_dof=2.0)
    with pytest.raises(ValueError, match="start='2024-13-01'"):
        synthetic_source(seed=0, start="2024-13-01")
    with pytest.raises(ValueError, match="seed=-1"):
        synthetic_source(seed=-1)
    with pytest.raises(BarDataError, match="no trading session of the CME_Equity calendar"):
        synthetic_source(seed=0, days=2, start="2024-01-06").load(ES)  # Saturday and Sunday


def test_hydra_config_builds_the_source():
    cfg = OmegaConf.merge({"seed": 5}, OmegaConf.load(REPO / "conf" / "data" / "synthetic.yaml"))
    source = instantiate(cfg.source)
    assert isinstance(source, SyntheticBarSource)
    assert source.seed == 5 and source.days == 60 and source.autocorrelation == 0.0
