"""LeanMinuteSource: the real ES zips (UTC stamps, front month by volume) and loader errors."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pandas as pd
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from configs import lean_source
from foxhunt.assets import AssetSpec
from foxhunt.data.errors import BarDataError
from foxhunt.data.sources.lean import LeanMinuteSource, lean_contract_symbol

REPO = Path(__file__).resolve().parents[2]


def asset(key: str) -> AssetSpec:
    cfg = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "asset" / f"{key}.yaml"))
    return AssetSpec(**{k: v for k, v in cfg.items() if k != "_target_"})


ES = asset("es")

FRONT_MONTHS = {
    "2013-10-07": "ESZ13", "2013-10-08": "ESZ13", "2013-10-09": "ESZ13", "2013-10-10": "ESZ13",
    "2013-10-11": "ESZ13", "2013-10-14": "ESZ13", "2013-10-15": "ESZ13", "2013-10-29": "ESZ13",
    "2013-10-30": "ESZ13", "2013-10-31": "ESZ13", "2013-11-18": "ESZ13", "2013-11-19": "ESZ13",
    "2013-12-02": "ESZ13", "2013-12-03": "ESZ13", "2013-12-04": "ESZ13", "2013-12-18": "ESZ13",
    "2013-12-19": "ESH14", "2013-12-20": "ESH14", "2020-01-06": "ESH20", "2020-01-07": "ESH20",
}  # fmt: skip


@pytest.fixture(scope="module")
def real(real_data_dir) -> LeanMinuteSource:
    return lean_source(str(real_data_dir / "es_lean_minute"))


@pytest.mark.realdata
def test_real_zips_front_month_per_trading_date(real):
    fronts = real.front_months(ES)
    assert {str(d.date()): c for d, c in fronts.items()} == FRONT_MONTHS


@pytest.mark.realdata
def test_real_zips_exact_bars(real):
    contracts = real.read_contracts(ES)
    assert len(contracts) == 23_948  # README: ~24k rows over all contracts
    assert contracts.groupby("contract").size().to_dict() == {
        "ESH14": 5116, "ESH20": 1425, "ESM14": 442, "ESM20": 272,
        "ESU14": 6, "ESU20": 5, "ESZ13": 16673, "ESZ14": 9,
    }  # fmt: skip
    bars = real.load(ES)
    assert len(bars) == 18_888  # README: ~19k front-month rows (here ESZ13 holds 2013-12-18, see below)
    # 20131006_es_minute_trade_201312.csv line 1: "79200000,1676.75,1677.25,1673.5,1675.25,1884"
    assert bars.index[0] == pd.Timestamp("2013-10-06 22:00", tz="UTC")
    assert bars.iloc[0].tolist()[:5] == [1676.75, 1677.25, 1673.5, 1675.25, 1884.0]
    # No look-ahead: ESH14 outtraded ESZ13 in the 2013-12-18 session, so the roll is the session
    # after; 2013-12-18 still comes from 20131218_es_minute_trade_201312.csv
    # ("0,1780.25,1780.25,1780,1780,24"), not from ..._201403.csv ("0,1773.75,...")
    assert bars.loc["2013-12-18 00:00"].tolist()[:5] == [1780.25, 1780.25, 1780.0, 1780.0, 24.0]
    # 20200106_es_minute_trade_202003.csv last line: "86340000,3241.75,3242.5,3241.75,3242.5,158"
    assert bars.index[-1] == pd.Timestamp("2020-01-06 23:59", tz="UTC")
    assert bars.iloc[-1].tolist()[:5] == [3241.75, 3242.5, 3241.75, 3242.5, 158.0]


@pytest.mark.realdata
def test_real_stamps_are_utc(real):
    """Read as UTC, the bars respect the CME equity schedule in New York time through the
    daylight-saving change: no bar in the 16:15-16:30 halt or the 17:15-18:00 maintenance
    (2013), none in 17:00-18:00 (2020), and Sunday opens at 18:00. Read as exchange time,
    October and December would disagree by an hour."""
    bars = real.load(ES)
    local = bars.index.tz_convert("America/New_York")
    minutes = local.hour * 60 + local.minute
    in_2013 = local.year == 2013
    assert not (in_2013 & (minutes >= 16 * 60 + 15) & (minutes < 16 * 60 + 30)).any()
    assert not (in_2013 & (minutes >= 17 * 60 + 15) & (minutes < 18 * 60)).any()
    assert not (~in_2013 & (minutes >= 17 * 60) & (minutes < 18 * 60)).any()
    sunday = local[local.day_of_week == 6]
    assert sunday.min().strftime("%H:%M") == "18:00"
    # and the sessions do trade right up to the edges of those windows
    assert ((minutes == 16 * 60 + 14) & in_2013).any() and ((minutes == 17 * 60 + 14) & in_2013).any()


@pytest.mark.realdata
def test_daily_and_hour_zips_are_skipped_in_a_directory_but_rejected_by_name(real_data_dir):
    daily = real_data_dir / "es_lean_minute" / "daily_es_trade.zip"
    with pytest.raises(BarDataError, match=r"daily_es_trade\.zip: no Lean minute trade CSV .* among es_trade_201312\.csv"):
        lean_source(str(daily)).load(ES)


# ------------------------------------------------------------------------------ synthetic zips
def lean_zip(folder: Path, day: str, contracts: dict[str, list[str]], root="es") -> Path:
    path = folder / f"{day}_trade.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for month, rows in contracts.items():
            archive.writestr(f"{day}_{root}_minute_trade_{month}.csv", "".join(r + "\n" for r in rows))
    return path


def test_roll_never_goes_back_to_an_earlier_expiry(tmp_path):
    # 14:30 UTC bars; volumes lead: Mar, Jun, Mar (ignored: stays Jun)
    lean_zip(
        tmp_path,
        "20240304",
        {
            "202403": ["52200000,5000,5000.25,4999.75,5000,90"],
            "202406": ["52200000,5050,5050.25,5049.75,5050,10"],
        },
    )
    lean_zip(
        tmp_path,
        "20240305",
        {
            "202403": ["52200000,5001,5001.25,5000.75,5001,10"],
            "202406": ["52200000,5051,5051.25,5050.75,5051,90"],
        },
    )
    lean_zip(
        tmp_path,
        "20240306",
        {
            "202403": ["52200000,5002,5002.25,5001.75,5002,90"],
            "202406": ["52200000,5052,5052.25,5051.75,5052,10"],
        },
    )
    source = lean_source(str(tmp_path))
    # ESM24 leads from 2024-03-05: held from the session after
    assert source.front_months(ES).tolist() == ["ESH24", "ESH24", "ESM24"]
    assert source.load(ES)["open"].tolist() == [5000.0, 5001.0, 5052.0]


def test_exchange_time_zone_argument(tmp_path):
    lean_zip(tmp_path, "20240304", {"202403": ["34200000,5000,5000.25,4999.75,5000,90"]})  # 09:30
    bars = lean_source(str(tmp_path), timezone="America/New_York").load(ES)
    assert bars.index[0] == pd.Timestamp("2024-03-04 14:30", tz="UTC")


def test_bad_rows_name_zip_member_line_and_field(tmp_path):
    zip_path = lean_zip(
        tmp_path,
        "20240304",
        {"202403": ["52200000,5000,5000.25,4999.75,5000,90", "52260000,5000,5000.25,4999.75,5000.1,9"]},
    )
    with pytest.raises(BarDataError) as err:
        lean_source(str(zip_path)).load(ES)
    assert str(err.value) == (
        f"{zip_path}:20240304_es_minute_trade_202403.csv: line 2 (2024-03-04T14:31:00+00:00): "
        "field 'close'=5000.1 is off the 0.25 tick grid (20000.400000 ticks)"
    )
    lean_zip(tmp_path, "20240305", {"202403": ["52200000,5000,5000.25,4999.75,5000"]})
    with pytest.raises(BarDataError, match=r"20240305_es_minute_trade_202403\.csv: 5 columns, expected 6"):
        lean_source(str(tmp_path / "20240305_trade.zip")).load(ES)


GOOD_ROW = "52200000,5000,5000.25,4999.75,5000,90"
MEMBER = "_es_minute_trade_"


@pytest.mark.parametrize(
    ("month", "row", "expected"),
    [  # each loaded wrong or was a traceback (found by a helper probing the data)
        ("201313", GOOD_ROW, "trade_201313.csv: contract month 201313 is not a month (YYYYMM, MM 01..12)"),  # IndexError
        ("201400", GOOD_ROW, "trade_201400.csv: contract month 201400 is not a month"),  # read as ESZ14, ranked Dec 2013
        ("202403", "-60000,5000,5000.25,4999.75,5000,90", "line 1: field 'ms'=-60000 is not the start of a minute of the day "
                                                          "(0..86,340,000 in steps of 60,000)"),  # the day before
        ("202403", "86400000,5000,5000.25,4999.75,5000,90", "line 1: field 'ms'=86400000 is not the start"),  # the day after
        ("202403", "30000.5,5000,5000.25,4999.75,5000,90", "line 1: field 'ms'=30000.5 is not the start"),
        ("202403", "1e23,5000,5000.25,4999.75,5000,90", "line 1: field 'ms'=1e+23 is not the start"),  # 3 lines, naming 'ts'
    ],
    ids=["month 13", "month 00", "ms before the day", "ms after the day", "ms off the minute", "ms 1e23"],
)  # fmt: skip
def test_a_member_of_another_month_or_a_time_outside_its_day_is_one_line(tmp_path, month, row, expected):
    zip_path = lean_zip(tmp_path, "20240304", {month: [row]})
    with pytest.raises(BarDataError) as err:
        lean_source(str(zip_path)).load(ES)
    assert str(err.value).startswith(f"{zip_path}:20240304{MEMBER}") and expected in str(err.value), str(err.value)


def test_a_member_too_large_for_a_day_of_bars_is_refused_unread(tmp_path, monkeypatch):
    """A 349 KB zip of a 150 MB member took 1 GB and 11 s before a line was refused (found by a
    helper): the size the zip declares is checked first (the limit lowered here for speed)."""
    import foxhunt.data.sources.lean as lean

    monkeypatch.setattr(lean, "MAX_MEMBER_BYTES", 1000)
    zip_path = lean_zip(tmp_path, "20240304", {"202403": [GOOD_ROW] * 40})
    with pytest.raises(BarDataError, match=r"trade_202403\.csv: 1,520 bytes uncompressed, more than the 1,000 a day"):
        lean_source(str(zip_path)).load(ES)


def test_missing_path_and_other_root(tmp_path):
    with pytest.raises(BarDataError, match=r"nowhere: file not found \(Lean minute zips\)"):
        lean_source(str(tmp_path / "nowhere")).load(ES)
    lean_zip(tmp_path, "20240304", {"202403": ["52200000,5000,5000.25,4999.75,5000,90"]}, root="nq")
    with pytest.raises(BarDataError, match="no Lean minute trade bars for root es"):
        lean_source(str(tmp_path)).load(ES)


def test_contract_symbols_and_config(tmp_path):
    assert lean_contract_symbol("es", "201312") == "ESZ13"
    assert lean_contract_symbol("6e", "202403") == "6EH24"
    zip_path = lean_zip(tmp_path, "20240304", {"202403": ["52200000,5000,5000.25,4999.75,5000,90"]})
    cfg = OmegaConf.load(REPO / "conf" / "data" / "lean.yaml")
    cfg.source.path = str(tmp_path)
    source = instantiate(cfg.source)
    assert isinstance(source, LeanMinuteSource) and source.timezone == "UTC"
    first = source.fingerprint(ES)
    assert first == lean_source(str(tmp_path)).fingerprint(ES)
    zip_path.write_bytes(zip_path.read_bytes() + b"\0")
    assert first != source.fingerprint(ES)


def test_overlapping_zips_name_both_files(tmp_path):
    """Two copies of one day's zip: 'two bars of the held contract at ...: the files overlap', with
    neither file named (found by a helper probing the data)."""
    import shutil

    first = lean_zip(tmp_path, "20240304", {"202403": [GOOD_ROW]})
    shutil.copy(first, tmp_path / "copy_trade.zip")
    with pytest.raises(BarDataError) as err:
        lean_source(str(tmp_path)).load(ES)
    member = "20240304_es_minute_trade_202403.csv line 1"
    assert f"({first}:{member} and {tmp_path / 'copy_trade.zip'}:{member}): the files overlap" in str(err.value), str(err.value)
