"""The bars-frame contract: validate_bars, tick snapping, trading dates, file inputs."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from configs import csv_source
from foxhunt.assets import AssetSpec
from foxhunt.data.bars import (
    BAR_COLUMNS,
    resolve_files,
    snap_to_tick,
    source_fingerprint,
    validate_bars,
)
from foxhunt.data.calendar import calendar_for
from foxhunt.data.errors import BarDataError

REPO = Path(__file__).resolve().parents[2]


def asset(key: str) -> AssetSpec:
    cfg = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "asset" / f"{key}.yaml"))
    return AssetSpec(**{k: v for k, v in cfg.items() if k != "_target_"})


def bars(rows, start="2024-01-02 14:30", tz="UTC") -> pd.DataFrame:
    index = pd.date_range(start, periods=len(rows), freq="1min", tz=tz)
    return pd.DataFrame(rows, columns=list(BAR_COLUMNS), index=index)


GOOD = [
    (4800.00, 4800.50, 4799.75, 4800.25, 10),
    (4800.25, 4801.00, 4800.00, 4800.75, 12),
    (4800.75, 4800.75, 4799.50, 4799.50, 0),
]


def test_valid_frame_is_normalized():
    frame = bars(GOOD)[["volume", "close", "low", "high", "open"]]  # any column order
    frame["volume"] = frame["volume"].astype(np.int64)
    frame["extra"] = 1
    out = validate_bars(frame, 0.25, origin="unit")
    assert list(out.columns) == list(BAR_COLUMNS)
    assert all(out[c].dtype == np.float64 for c in BAR_COLUMNS)
    assert out.index.name == "ts" and str(out.index.tz) == "UTC" and out.index.dtype == "datetime64[ns, UTC]"
    assert out.loc["2024-01-02 14:31", "close"] == 4800.75
    assert out["volume"].tolist() == [10.0, 12.0, 0.0]


def test_float_noise_is_snapped_onto_the_exact_grid():
    frame = bars([(1.1076 + 3e-13, 1.10785, 1.1076 - 2e-13, 1.1078, 205)])
    out = validate_bars(frame, 0.00005, origin="noise")
    # the snapped value is the double a CSV parser gives for the decimal text
    assert out["open"].iloc[0] == float("1.1076")
    assert out["low"].iloc[0] == float("1.1076")
    assert out["open"].iloc[0] != 1.1076 + 3e-13


def test_snap_to_tick_hand_values():
    assert snap_to_tick([4800.1249999, 4800.125000001, 0.24], 0.25).tolist() == [4800.0, 4800.25, 0.25]
    assert snap_to_tick(1.10762, 0.00005) == float("1.1076")
    assert snap_to_tick(110.0 + 1 / 64 + 1e-9, 1 / 64) == 110.015625
    with pytest.raises(ValueError, match="tick_size"):
        snap_to_tick(1.0, 0.0)


@settings(max_examples=60, deadline=None)
@given(
    ticks=st.integers(min_value=1, max_value=10**7),
    tick=st.sampled_from([0.25, 0.00005, 1 / 64, 0.01, 0.1]),
    noise=st.floats(min_value=-1e-7, max_value=1e-7),
)
def test_snap_is_the_nearest_grid_point(ticks, tick, noise):
    exact = snap_to_tick(ticks * tick, tick)
    assert snap_to_tick(exact * (1 + noise * 1e-9) + noise * tick, tick) == exact
    assert abs(exact / tick - ticks) < 1e-6


# ---------------------------------------------------------------------------------- errors
def broken(row_index: int, field: str, value) -> pd.DataFrame:
    frame = bars(GOOD).astype({field: object if isinstance(value, str) else np.float64})
    frame.iloc[row_index, frame.columns.get_loc(field)] = value
    return frame


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (broken(1, "close", np.nan), "row 1 (2024-01-02T14:31:00+00:00): field 'close' is nan (missing price or volume)"),
        (
            broken(2, "open", 0.0),
            "row 2 (2024-01-02T14:32:00+00:00): field 'open'=0.0 is not a positive price",
        ),
        (
            broken(1, "low", -4800.0),
            "row 1 (2024-01-02T14:31:00+00:00): field 'low'=-4800.0 is not a positive price",
        ),
        (broken(0, "volume", -1), "row 0 (2024-01-02T14:30:00+00:00): field 'volume'=-1.0 is negative"),
        # a count of contracts: a fractional one, or DBN's u64 maximum (a column read wrong), passed
        (
            broken(1, "volume", 812.5),
            "row 1 (2024-01-02T14:31:00+00:00): field 'volume'=812.5 is not a whole number of contracts",
        ),
        (
            broken(2, "volume", 2.0**64 - 1),
            "row 2 (2024-01-02T14:32:00+00:00): field 'volume'=1.8446744073709552e+19 is past 1e+15, "
            "the most contracts a bar may hold",
        ),  # fmt: skip
        (
            broken(1, "high", 4800.10),
            "row 1 (2024-01-02T14:31:00+00:00): field 'high'=4800.1 is off the 0.25 tick grid (19200.400000 ticks)",
        ),
        (broken(0, "high", 4799.50), "row 0 (2024-01-02T14:30:00+00:00): high=4799.5 < low=4799.75"),
        (
            broken(1, "high", 4800.50),
            "row 1 (2024-01-02T14:31:00+00:00): high=4800.5 < max(open=4800.25, close=4800.75)",
        ),
        (
            broken(2, "low", 4800.00),
            "row 2 (2024-01-02T14:32:00+00:00): low=4800.0 > min(open=4800.75, close=4799.5)",
        ),
        (broken(1, "open", "n/a"), "row 1 (2024-01-02T14:31:00+00:00): field 'open'='n/a' is not a number"),
    ],
)
def test_each_violation_names_origin_row_and_field(frame, expected):
    with pytest.raises(BarDataError) as err:
        validate_bars(frame, 0.25, origin="/data/es.csv")
    message = str(err.value)
    assert message == f"/data/es.csv: {expected}"
    assert "\n" not in message


def test_a_bar_time_outside_a_streams_range_or_a_boolean_column_is_refused(tmp_path):
    """Databento's null time (2**64-1, read as -1 ns) and a negative time loaded as bars of 1969,
    which a stream refuses; a CSV column of 'True' loaded as prices of 1.0 (found by a helper
    probing the data). Both are refused, naming the row."""
    before = bars(GOOD, start="1969-12-31 23:58")
    with pytest.raises(BarDataError, match=r"^f: row 0 \(1969-12-31T23:58:00\+00:00\): a bar time outside the times foxhunt "
                                           r"reads \(1970-01-01T00:00:00\+00:00 \.\. 2200-01-01T00:00:00\+00:00, as a stream\)$"):  # fmt: skip
        validate_bars(before, 0.25, origin="f")
    with pytest.raises(BarDataError, match=r"^f: row 2 \(2200-01-01T00:01:00\+00:00\): a bar time outside"):
        validate_bars(bars(GOOD, start="2199-12-31 23:59"), 0.25, origin="f")
    path = tmp_path / "bools.csv"
    path.write_text("timestamp_utc,open,high,low,close,volume\n2024-01-02 14:31:00,True,True,True,True,True\n")
    with pytest.raises(
        BarDataError, match=r"bools\.csv: line 2 .*field 'open'=.*True.* is not a number \(a column of booleans\)"
    ):
        csv_source(str(path)).load(asset("es"))


def test_a_bar_not_on_a_whole_minute_is_refused(tmp_path):
    """A file of 30-second bars (or stamps in seconds read as nanoseconds) loaded as minute bars,
    exit 0 (found by a helper probing the data): every bar starts on a whole minute."""
    with pytest.raises(BarDataError, match=r"^f: row 0 \(2024-01-02T14:30:30\+00:00\): not the start of a whole minute"):
        validate_bars(bars(GOOD, start="2024-01-02 14:30:30"), 0.25, origin="f")
    path = tmp_path / "half.csv"
    path.write_text("timestamp_utc,open,high,low,close,volume\n2024-01-02 14:31:00,4800,4800.5,4799.75,4800.25,10\n"
                    "2024-01-02 14:31:30,4800,4800.5,4799.75,4800.25,10\n")  # fmt: skip
    with pytest.raises(BarDataError, match=r"half\.csv: line 3 \(2024-01-02T14:30:30\+00:00\): not the start of a whole minute"):
        csv_source(str(path)).load(asset("es"))


def test_missing_column():
    with pytest.raises(
        BarDataError,
        match=r"^src\.csv: missing column\(s\) volume \(columns found: open, high, low, close\)$",
    ):
        validate_bars(bars(GOOD).drop(columns="volume"), 0.25, origin="src.csv")


def test_index_must_be_utc_datetimes():
    with pytest.raises(BarDataError, match="^f: timestamps have no time zone, expected UTC$"):
        validate_bars(bars(GOOD, tz=None), 0.25, origin="f")
    with pytest.raises(BarDataError, match="^f: timestamps are in time zone America/Chicago, expected UTC$"):
        validate_bars(bars(GOOD, tz="America/Chicago"), 0.25, origin="f")
    with pytest.raises(BarDataError, match="^f: index is a RangeIndex"):
        validate_bars(bars(GOOD).reset_index(drop=True), 0.25, origin="f")


def test_unsorted_and_duplicated_timestamps_use_given_row_numbers():
    frame = bars(GOOD)
    unsorted = frame.iloc[[0, 2, 1]]
    with pytest.raises(BarDataError) as err:
        validate_bars(unsorted, 0.25, origin="x.csv", rows=[2, 3, 4], row_name="line")
    assert str(err.value) == (
        "x.csv: line 4 (2024-01-02T14:31:00+00:00): timestamps not in increasing order, "
        "earlier than line 3 (2024-01-02T14:32:00+00:00)"
    )
    duplicated = frame.iloc[[0, 1, 1, 2]]
    with pytest.raises(BarDataError) as err:
        validate_bars(duplicated, 0.25, origin="x.dbn", rows=[7, 8, 9, 10], row_name="record")
    assert str(err.value) == (
        "x.dbn: record 9 (2024-01-02T14:31:00+00:00): duplicated timestamp, same as record 8 (2024-01-02T14:31:00+00:00)"
    )


def test_first_offending_row_is_reported():
    frame = bars(GOOD)
    frame.iloc[1, 0] = np.nan
    frame.iloc[2, 3] = np.nan
    with pytest.raises(BarDataError, match="row 1 .*field 'open'"):
        validate_bars(frame, 0.25, origin="o")


def test_empty_frame_is_valid():
    assert validate_bars(bars([]), 0.25, origin="none").shape == (0, 5)


# ---------------------------------------------------------------------------------- sessions
def test_trade_dates_follow_the_globex_evening_open():
    es, fx = asset("es"), asset("6e")
    stamps = pd.DatetimeIndex(
        [
            "2024-01-07 23:00",  # Sunday 18:00 New York (EST): Monday's session
            "2024-01-08 21:59",  # Monday 16:59 EST: still Monday
            "2024-07-01 22:00",  # Monday 18:00 EDT: Tuesday's session
            "2024-07-01 20:59",  # Monday 16:59 EDT
        ],
        tz="UTC",
    )
    assert [str(d) for d in calendar_for(es).trading_dates(stamps)] == [
        "2024-01-08",
        "2024-01-08",
        "2024-07-02",
        "2024-07-01",
    ]
    fx_stamps = pd.DatetimeIndex(["2024-01-02 23:00", "2024-01-02 21:59"], tz="UTC")  # 17:00 / 15:59 CST
    assert [str(d) for d in calendar_for(fx).trading_dates(fx_stamps)] == ["2024-01-03", "2024-01-02"]


# ---------------------------------------------------------------------------------- files
def test_resolve_files(tmp_path):
    (tmp_path / "b.csv").write_text("x")
    (tmp_path / "a.csv.gz").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("x")
    assert [p.name for p in resolve_files(tmp_path, (".csv", ".csv.gz"), "CSV")] == ["a.csv.gz", "b.csv"]
    assert [p.name for p in resolve_files(str(tmp_path / "*.csv"), (".csv",), "CSV")] == ["b.csv"]
    assert resolve_files(tmp_path / "b.csv", (".csv",), "CSV") == [tmp_path / "b.csv"]
    with pytest.raises(BarDataError, match=r"missing\.csv: file not found \(CSV\)$"):
        resolve_files(tmp_path / "missing.csv", (".csv",), "CSV")
    with pytest.raises(BarDataError, match=r"\*\.dbn: no file matches"):
        resolve_files(str(tmp_path / "*.dbn"), (".dbn",), "DBN")
    with pytest.raises(BarDataError, match="directory holds no DBN"):
        resolve_files(tmp_path, (".dbn",), "DBN")
    with pytest.raises(BarDataError, match="is not set"):
        resolve_files("???", (".dbn",), "DBN")


def test_fingerprint_tracks_params_asset_and_file_state(tmp_path):
    file = tmp_path / "a.csv"
    file.write_text("1")
    es, nq = asset("es"), asset("nq")
    first = source_fingerprint("csv", {"p": 1}, es, [file])
    assert first == source_fingerprint("csv", {"p": 1}, es, [file])
    assert first.startswith("csv:") and len(first) == len("csv:") + 64
    assert first != source_fingerprint("csv", {"p": 2}, es, [file])
    assert first != source_fingerprint("csv", {"p": 1}, nq, [file])
    file.write_text("12")
    os.utime(file, ns=(1_000_000_000, 1_000_000_000))
    assert first != source_fingerprint("csv", {"p": 1}, es, [file])


# ---------------------------------------------------------------------------------- the price rule
def test_a_price_below_one_tick_is_refused_not_snapped_to_0():
    # 1e-9 is 4e-9 ticks of ES: within the float-noise tolerance of tick 0, it used to pass as
    # "positive and on the grid" and snap to 0.0 (log(0) in the features)
    frame = broken(1, "low", 1e-9)
    with pytest.raises(BarDataError) as err:
        validate_bars(frame, 0.25, origin="/data/es.csv")
    assert str(err.value) == ("/data/es.csv: row 1 (2024-01-02T14:31:00+00:00): field 'low'=1e-09 is below one tick "
                              "(0.25): a price is at least one tick")  # fmt: skip
    one_tick_less_noise = broken(2, "low", 0.25 * (1 - 1e-9))  # float noise around one tick is still one tick
    one_tick_less_noise.iloc[2, :4] = [0.25, 0.25, 0.25 * (1 - 1e-9), 0.25]
    assert validate_bars(one_tick_less_noise, 0.25, origin="o")["low"].iloc[2] == 0.25


def test_a_training_load_of_a_sub_tick_price_is_one_line_naming_the_file_line_and_field(tmp_path):

    file = tmp_path / "es.csv"
    file.write_text("timestamp_utc,open,high,low,close,volume\n2024-01-02T14:31:00Z,4800.25,4800.5,4800,4800.25,3\n"
                    "2024-01-02T14:32:00Z,1e-9,1e-9,1e-9,1e-9,3\n")  # fmt: skip
    with pytest.raises(BarDataError) as err:
        csv_source(str(file)).load(asset("es"))
    message = str(err.value)
    assert message.startswith(f"{file}: line 3 (") and "field 'open'=1e-09 is below one tick (0.25)" in message, message
    assert "\n" not in message


@settings(max_examples=300, deadline=None)
@given(
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.floats(min_value=0, max_value=2.0),
        st.integers(-3, 10**6).map(lambda k: k * 0.25),
        st.sampled_from([1e-9, 0.25 * (1 - 1e-9), 0.25 * 1e-6, 0.25 * 2e-6, 0.25 * 2**53, 0.25 * (2**53 - 1), 5e-324]),
    ),
    tick=st.sampled_from([0.25, 0.00005, 1 / 64, 0.01, 0.1, 1 / 32 / 2]),
)
def test_one_price_rule_for_a_training_load_and_a_stream(value, tick):
    """validate_bars (training loads) and price_problem (a stream's bar, the server) accept the
    same prices, and an accepted price is an exact count of at least one tick."""
    from foxhunt.data.bars import MAX_PRICE_TICKS, price_problem

    frame = bars([(value, value, value, value, 1)])
    try:
        snapped = validate_bars(frame, tick, origin="p")["close"].iloc[0]
        batch = None
    except BarDataError as exc:
        batch, snapped = str(exc), None
    problem = price_problem(value, tick)
    assert (batch is None) == (problem is None), (batch, problem)
    if problem is None:
        assert 1 <= round(snapped / tick) < MAX_PRICE_TICKS and snapped >= tick
    elif math.isfinite(value):
        assert batch.endswith(f"field 'open'={value!r} {problem}"), (batch, problem)


@settings(max_examples=200, deadline=None)
@given(
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(0, 10**6).map(float),
        st.floats(min_value=0, max_value=1e3),
        st.sampled_from([0.0, -0.0, 1e15, 1e15 - 1, 2.0**53, 2.0**64 - 1, 0.5, 5e-324]),
    )
)
def test_one_volume_rule_for_a_training_load_and_a_stream(value):
    """validate_bars and a stream's bar (the server, paper trading) accept the same volumes: a
    stream refused 1e16 that a training file passed, and neither refused a fractional count."""
    from foxhunt.data.bars import MAX_VOLUME, volume_problem

    frame = bars([(4800.0, 4800.0, 4800.0, 4800.0, value)])
    try:
        validate_bars(frame, 0.25, origin="v")
        batch = None
    except BarDataError as exc:
        batch = str(exc)
    problem = volume_problem(value)
    assert (batch is None) == (problem is None), (batch, problem)
    if problem is None:
        assert 0 <= value < MAX_VOLUME and value == int(value)
    elif math.isfinite(value):
        assert batch.endswith(f"field 'volume'={value!r} {problem}"), (batch, problem)
