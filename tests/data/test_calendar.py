"""foxhunt.data.calendar: CME sessions from pandas-market-calendars, the synthetic year on them,
open-market gaps told apart from a closed market, session features on early closes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from configs import lean_source, synthetic_source
from foxhunt.assets import AssetSpec
from foxhunt.data.calendar import (
    MINUTE_NS,
    CalendarError,
    SessionCalendar,
    calendar_for,
)
from foxhunt.data.features import FeatureConfig, future_known_features, known_features
from foxhunt.data.streaming import KnownCalendar

REPO = Path(__file__).resolve().parents[2]
REAL = REPO.parent / "shared" / "data" / "real"
KEYS = ("es", "nq", "6e", "zn")
FEATURES = FeatureConfig(momentum_bars=5, volatility_bars=10, volume_bars=10)
KNOWN = ("minute_of_day_sin", "minute_of_day_cos", "day_of_week_sin", "day_of_week_cos",
         "session_elapsed", "session_remaining", "regular_hours", "week_elapsed")  # fmt: skip


def asset(key: str) -> AssetSpec:
    cfg = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "asset" / f"{key}.yaml"))
    return AssetSpec(**{k: v for k, v in cfg.items() if k != "_target_"})


ASSETS = {key: asset(key) for key in KEYS}
ES = ASSETS["es"]


def utc(*stamps: str) -> pd.DatetimeIndex:
    return pd.DatetimeIndex(list(stamps)).tz_localize("UTC")


def minutes(start: str, end: str) -> pd.DatetimeIndex:
    """Every 1-minute bar start in [start, end) (UTC)."""
    return pd.date_range(start, end, freq="min", inclusive="left", tz="UTC").as_unit("ns")


@pytest.fixture(scope="module")
def es_2024() -> pd.DataFrame:
    return synthetic_source(days=366, seed=3, start="2024-01-01").load(ES)


# ----------------------------------------------------------------------------- the calendars
def test_each_asset_names_its_calendar_and_the_hours_agree():
    names = {key: calendar_for(spec).name for key, spec in ASSETS.items()}
    assert names == {"es": "CME_Equity", "nq": "CME_Equity", "6e": "CMEGlobex_FX", "zn": "CME Globex Fixed Income"}
    for key, spec in ASSETS.items():
        sessions = calendar_for(spec).sessions("2024-01-08", "2024-01-12")  # a week without holiday
        local_open = sessions["open"].dt.tz_convert(spec.session_tz).dt.strftime("%H:%M")
        local_close = sessions["close"].dt.tz_convert(spec.session_tz).dt.strftime("%H:%M")
        assert set(local_open) == {spec.session_open} and set(local_close) == {spec.session_close}, key
        assert ((sessions["close"] - sessions["open"]) == pd.Timedelta(minutes=spec.session_minutes)).all()


def test_an_unknown_calendar_is_one_line_naming_the_key():
    with pytest.raises(CalendarError, match=r"^asset.calendar='CME_Nope': unknown exchange calendar") as info:
        calendar_for(dataclasses.replace(ES, calendar="CME_Nope"))
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=r"^asset.calendar='': must name an exchange calendar"):
        dataclasses.replace(ES, calendar="")


def test_a_calendar_with_other_hours_than_the_asset_is_one_line():
    moved = dataclasses.replace(ES, session_open="17:30", session_close="16:30")
    with pytest.raises(
        CalendarError,
        match=r"^asset.calendar='CME_Equity': its regular session is 18:00-17:00 "
        r"America/New_York, but asset.session_open/session_close say 17:30-16:30",
    ):
        calendar_for(moved)


def test_schema_rejects_an_unknown_calendar_naming_the_key():
    from pydantic import ValidationError

    from foxhunt.config.schema import AssetSection

    raw = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "asset" / "es.yaml"))
    AssetSection.model_validate(raw)
    with pytest.raises(ValidationError, match="unknown exchange calendar"):
        AssetSection.model_validate({**raw, "calendar": "NOPE"})


@pytest.mark.parametrize("key", KEYS)
def test_cme_holidays_2024(key):
    cal = calendar_for(ASSETS[key])
    assert [str(d.date()) for d in cal.holidays("2024-01-01", "2024-12-31")] == ["2024-01-01", "2024-03-29", "2024-12-25"]


def test_good_friday_opens_only_on_an_employment_report_day():
    # the library makes every Good Friday from 2023 an early close; CME opened on 2023-04-07 and
    # 2026-04-03 (payrolls released) and was closed on 2024-03-29 and 2025-04-18
    for key in ("es", "6e", "zn"):
        cal = calendar_for(ASSETS[key])
        assert pd.Timestamp("2023-04-07") in cal.sessions("2023-04-03", "2023-04-10").index
        assert pd.Timestamp("2026-04-03") in cal.sessions("2026-03-30", "2026-04-06").index
        assert pd.Timestamp("2025-04-18") in cal.holidays("2025-04-14", "2025-04-21")
    early = calendar_for(ES).early_closes("2023-04-01", "2023-04-30")
    assert early.loc["2023-04-07"].tz_convert("America/Chicago").strftime("%H:%M") == "08:15"


def test_early_closes_2024_for_es():
    early = calendar_for(ES).early_closes("2024-01-01", "2024-12-31")
    local = {str(d.date()): t.tz_convert("America/Chicago").strftime("%H:%M") for d, t in early.items()}
    assert local["2024-11-29"] == "12:00" and local["2024-12-24"] == "12:00"  # the library's CME_Equity times
    assert set(local) == {"2024-01-15", "2024-02-19", "2024-05-27", "2024-06-19", "2024-07-03", "2024-07-04",
                          "2024-09-02", "2024-11-28", "2024-11-29", "2024-12-24"}  # fmt: skip


def test_the_equity_halt_before_2021_is_a_break():
    sessions = calendar_for(ES).sessions("2013-10-07", "2013-10-07")
    row = sessions.iloc[0]
    assert row["break_start"].tz_convert("America/Chicago").strftime("%H:%M") == "15:15"
    assert row["break_end"].tz_convert("America/Chicago").strftime("%H:%M") == "15:30"
    assert calendar_for(ES).sessions("2024-01-01", "2024-12-31")["break_start"].isna().all()  # no halt since 2021


# ----------------------------------------------------------------------------- the synthetic year
def test_the_synthetic_year_has_no_bars_on_cme_holidays(es_2024):
    cal = calendar_for(ES)
    dates = cal.trading_dates(es_2024.index)
    for holiday in ("2024-01-01", "2024-03-29", "2024-12-25"):
        assert not (dates == np.datetime64(holiday)).any(), holiday
    assert cal.open_mask(es_2024.index).all()
    # the UTC calendar days are empty from the close before to the open after (local evening opens)
    local = es_2024.index.tz_convert("America/Chicago")
    assert not ((local >= pd.Timestamp("2024-03-28 16:00", tz="America/Chicago"))
                & (local < pd.Timestamp("2024-03-31 17:00", tz="America/Chicago"))).any()  # fmt: skip
    assert not ((local >= pd.Timestamp("2024-12-24 12:00", tz="America/Chicago"))
                & (local < pd.Timestamp("2024-12-25 17:00", tz="America/Chicago"))).any()  # fmt: skip
    # every session of the calendar is there, in full: 259 sessions, 355,020 minutes
    assert len(np.unique(dates)) == 259 and len(es_2024) == 259 * 1380 - 10 * 240


@pytest.mark.parametrize("day", ["2024-11-29", "2024-12-24"])
def test_the_synthetic_session_ends_at_the_early_close(es_2024, day):
    cal = calendar_for(ES)
    bars = es_2024.index[cal.trading_dates(es_2024.index) == np.datetime64(day)]
    assert bars[0] == pd.Timestamp(f"{pd.Timestamp(day) - pd.Timedelta(days=1):%Y-%m-%d} 17:00", tz="America/Chicago")
    assert bars[-1] == pd.Timestamp(f"{day} 11:59", tz="America/Chicago")  # the 12:00 CT close
    assert len(bars) == 19 * 60


def test_the_synthetic_fingerprint_names_the_calendar():
    source = synthetic_source(days=5, seed=1)
    other = dataclasses.replace(ES, calendar="CME Globex Equity")
    assert source.fingerprint(ES) != source.fingerprint(other)
    assert calendar_for(ES).fingerprint() == {"name": "CME_Equity", "library": "pandas_market_calendars",
                                             "version": calendar_for(ES).version}  # fmt: skip


# ----------------------------------------------------------------------------- gaps
def test_a_missing_hour_in_open_time_is_a_gap():
    # Tuesday 2024-01-09, ES: every minute of the session but 14:00-15:00 UTC
    session = minutes("2024-01-08 23:00", "2024-01-09 22:00")
    bars = session[
        (session < pd.Timestamp("2024-01-09 14:00", tz="UTC")) | (session >= pd.Timestamp("2024-01-09 15:00", tz="UTC"))
    ]
    gaps = calendar_for(ES).gaps(bars)
    assert len(gaps) == 1
    row = gaps.iloc[0]
    assert row["start"] == pd.Timestamp("2024-01-09 14:00", tz="UTC") and row["end"] == pd.Timestamp("2024-01-09 15:00", tz="UTC")
    assert row["open_minutes"] == 60 and row["closed_minutes"] == 0
    assert calendar_for(ES).gaps(bars, min_minutes=61).empty


@pytest.mark.parametrize(
    ("before", "after", "why"),
    [
        ("2024-01-09 21:59", "2024-01-09 23:00", "the daily break 17:00-18:00 ET"),
        ("2024-01-12 21:59", "2024-01-14 23:00", "the weekend"),
        ("2024-12-24 17:59", "2024-12-25 23:00", "Christmas Eve's 12:00 CT close and Christmas"),
        ("2024-03-28 20:59", "2024-03-31 22:00", "Good Friday and the weekend (daylight time)"),
        ("2024-01-15 17:59", "2024-01-15 23:00", "the MLK early close"),
    ],
)
def test_a_closed_market_is_not_a_gap(before, after, why):
    assert calendar_for(ES).gaps(utc(before, after)).empty, why
    assert calendar_for(ES).open_minutes(before, after) == 1  # the first bar's own minute, nothing else


def test_a_gap_across_a_break_counts_only_its_open_minutes():
    # from 16:30 ET to 18:30 ET: 30 open minutes before the break, 30 after, 60 closed between
    gaps = calendar_for(ES).gaps(utc("2024-01-09 21:29", "2024-01-09 23:30"))
    assert gaps["open_minutes"].tolist() == [60] and gaps["closed_minutes"].tolist() == [60]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    keep=st.floats(min_value=0.001, max_value=1.0),
    key=st.sampled_from(KEYS),
    start=st.sampled_from(["2024-03-27", "2024-11-26", "2024-12-20", "2013-10-04"]),
)
def test_bars_gaps_and_closed_time_partition_the_span(seed, keep, key, start):
    """Over [first bar, last bar + 1 min): every minute is a bar, a missing open minute (in
    exactly one gap) or closed time, counted here on the full minute grid with open_mask."""
    cal = calendar_for(ASSETS[key])
    grid = minutes(start, str(pd.Timestamp(start) + pd.Timedelta(days=6)))
    open_grid = grid[cal.open_mask(grid)]
    rng = np.random.default_rng(seed)
    bars = open_grid[rng.random(len(open_grid)) < keep]
    if len(bars) < 2:
        return
    gaps = cal.gaps(bars)
    span = grid[(grid >= bars[0]) & (grid <= bars[-1])]
    open_in_span = int(cal.open_mask(span).sum())
    assert len(bars) + int(gaps["open_minutes"].sum()) == open_in_span
    assert cal.open_minutes(bars[0], bars[-1] + pd.Timedelta(minutes=1)) == open_in_span
    # each gap's minutes are missing open minutes, and none is a bar
    missing = span[cal.open_mask(span)].difference(bars)
    for row in gaps.itertuples():
        inside = missing[(missing >= row.start) & (missing < row.end)]
        assert len(inside) == row.open_minutes and inside[0] == row.start
        assert inside[-1] + pd.Timedelta(minutes=1) == row.end
        assert row.open_minutes + row.closed_minutes == (row.end - row.start) // pd.Timedelta(minutes=1)


# ----------------------------------------------------------------------------- real data
def _lean_front_month() -> pd.DataFrame:
    return lean_source(str(REAL / "es_lean_minute")).load(ES)


@pytest.mark.realdata
def test_real_6e_january_2024_has_only_open_market_gaps():
    path = REAL / "6e_minute" / "6EH4_1min_bars_20240101_20240131.csv.gz"
    if not path.exists():
        pytest.skip(f"{path} absent")
    frame = pd.read_csv(path)
    starts = pd.DatetimeIndex(pd.to_datetime(frame["timestamp_utc"], utc=True)) - pd.Timedelta(minutes=1)  # CLOSE labels
    cal = calendar_for(ASSETS["6e"])
    assert cal.open_mask(starts).all()  # no bar in closed time: the calendar's sessions hold them all
    gaps = cal.gaps(starts)
    # the daily breaks, the weekends and New Year's Day are closed time, never gaps: every gap
    # is a quiet stretch inside a session, short (the longest measured: minutes, not hours)
    assert (gaps["open_minutes"] < 60).all()
    assert (gaps["closed_minutes"] == 0).all()
    # MLK day 2024-01-15: FX traded after 12:00 CT (155 bars 12:00-16:00 CT, thin), as the
    # library's FX calendar says (a full session, no early close), unlike equities and rates
    local = starts.tz_convert("America/Chicago")
    afternoon = (local >= pd.Timestamp("2024-01-15 12:00", tz="America/Chicago")) & (
        local < pd.Timestamp("2024-01-15 16:00", tz="America/Chicago")
    )
    assert afternoon.sum() == 155
    assert pd.Timestamp("2024-01-15") not in cal.early_closes("2024-01-01", "2024-01-31").index
    total = len(starts) + int(gaps["open_minutes"].sum())
    assert total == cal.open_minutes(starts[0], starts[-1] + pd.Timedelta(minutes=1))
    print(f"\n6E Jan 2024: {len(starts):,} bars, {len(gaps)} gaps, {int(gaps['open_minutes'].sum())} open minutes missing")


@pytest.mark.realdata
def test_real_lean_es_has_only_open_market_gaps():
    if not (REAL / "es_lean_minute").exists():
        pytest.skip("Lean ES sample absent")
    bars = _lean_front_month()
    cal = calendar_for(ES)
    gaps = cal.gaps(bars.index, min_minutes=5)
    # the 15:15-15:30 CT halt (a break until 2021-06-25), the daily maintenance and the weekends
    # are closed time, never gaps; the samples are single UTC days (one zip each), so the open
    # time of the days between them is missing: 7 gaps of 5 minutes or more start on a UTC day
    # without a file. The other 6 lie in the 2013-12-18 session, still held in ESZ13 (ESH14
    # outtraded it in that session, so the roll without look-ahead is the session after): the
    # expiring contract trades thinly there, quiet for up to 11 minutes.
    halts = pd.DatetimeIndex([pd.Timestamp(f"{d} 15:20", tz="America/Chicago") for d in ("2013-10-07", "2013-12-18")])
    assert not cal.open_mask(halts).any()
    file_days = {p.name.split("_")[2] for p in (REAL / "es_lean_minute").glob("minute_es_*_trade.zip")}
    thin = gaps["start"].dt.strftime("%Y%m%d") == "20131218"
    assert len(gaps) == 13 and int(thin.sum()) == 6 and int(gaps.loc[thin, "open_minutes"].max()) == 11
    assert all(f"{start:%Y%m%d}" not in file_days for start in gaps.loc[~thin, "start"])
    assert (bars.loc["2013-12-18 00:00":"2013-12-18 22:14", "contract"] == "ESZ13").all()
    # the library closes ES at 16:00 CT in 2013; the exchange traded to 16:15 CT: those bars are
    # outside the calendar's sessions, and belong to the session just closed
    outside = bars.index[~cal.open_mask(bars.index)]
    local = outside.tz_convert("America/Chicago")
    assert ((local.hour == 16) & (local.minute < 15)).all()
    dates = cal.trading_dates(outside)
    assert (dates == local.tz_localize(None).to_numpy().astype("datetime64[D]")).all()


# ----------------------------------------------------------------------------- features
def test_session_remaining_reaches_zero_at_the_early_close():
    stamps = utc("2024-11-28 23:00", "2024-11-29 17:59", "2024-11-29 18:00", "2024-11-29 20:00")  # 12:00 CT = 18:00 UTC
    known = pd.DataFrame(known_features(stamps, ES, FEATURES), columns=KNOWN, index=stamps)
    length = 19 * 60  # Thursday 17:00 CT to Friday 12:00 CT
    assert known["session_elapsed"].tolist() == [0.0, (length - 1) / length, 1.0, 1.0]
    assert known["session_remaining"].tolist() == [1.0, 1 / length, 0.0, 0.0]
    assert known["week_elapsed"].iloc[1] == pytest.approx((4 + (length - 1) / length) / 5)
    # a regular Friday's last bar has 1/1380 left
    regular = known_features(utc("2024-11-22 21:59"), ES, FEATURES)[0]
    assert regular[KNOWN.index("session_remaining")] == pytest.approx(1 / 1380)


def test_a_session_after_a_holiday_starts_the_week_where_its_date_is():
    # Tuesday 2024-01-02 opens on the holiday's evening: its first bar reads Tuesday, elapsed 0
    row = known_features(utc("2024-01-01 23:00"), ES, FEATURES)[0]
    assert row[KNOWN.index("session_elapsed")] == 0.0 and row[KNOWN.index("session_remaining")] == 1.0
    assert row[KNOWN.index("week_elapsed")] == pytest.approx(1 / 5)


@pytest.mark.parametrize("key", KEYS)
def test_streaming_known_features_equal_batch_on_holidays_and_early_closes(key):
    spec = ASSETS[key]
    stamps = minutes("2024-11-26 00:00", "2024-12-03 00:00").append(minutes("2024-12-23 00:00", "2024-12-27 00:00"))
    batch = known_features(stamps, spec, FEATURES)
    stream = KnownCalendar(spec, FEATURES)
    streamed = np.stack([stream.row(int(ts)) for ts in stamps.asi8])
    np.testing.assert_array_equal(streamed, batch)
    future = future_known_features(stamps.asi8[:50].astype("datetime64[ns]"), 30, spec, FEATURES)
    for i, ts in enumerate(stamps.asi8[:50]):
        np.testing.assert_array_equal(stream.future(int(ts), 30), future[i])


def test_a_calendar_object_is_reusable_across_spans():
    cal = SessionCalendar("CME_Equity")
    early = cal.trading_dates(utc("2013-10-07 14:00"))
    late = cal.trading_dates(utc("2024-07-03 14:00"))
    assert str(early[0]) == "2013-10-07" and str(late[0]) == "2024-07-03"
    assert cal.open_minutes("2024-01-09 00:00", "2024-01-09 00:00") == 0
    assert cal.open_minutes("2024-01-08 23:00", "2024-01-09 22:00") == 1380
    assert MINUTE_NS == 60 * 10**9
