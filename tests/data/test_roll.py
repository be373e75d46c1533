"""Rolls without look-ahead, back-adjustment and the roll as a trade, on hand-made two-contract
files (every figure below is worked out by hand) and on the real Lean ES files."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import databento_dbn as dbn
import numpy as np
import pandas as pd
import pytest
import torch
from test_databento import NS, asset, bar, encode, metadata

from configs import databento_source, lean_source
from foxhunt.data.errors import BarDataError
from foxhunt.data.roll import RollRule
from foxhunt.evaluation.backtest import backtest
from foxhunt.trading.env import TradingEnv
from foxhunt.trading.pnl import held_moves

ES = asset("es")
SESSIONS = pd.date_range("2024-03-04", periods=4, freq="D")  # Monday..Thursday, trading dates
IDS = {"ESH4": 1, "ESM4": 2}
# contracts traded per session: ESM4 outtrades ESH4 in the SECOND session (Tuesday)
VOLUMES = [{"ESH4": 900, "ESM4": 90}, {"ESH4": 300, "ESM4": 600}, {"ESH4": 90, "ESM4": 900}, {"ESH4": 30, "ESM4": 900}]
COMMISSION, SLIPPAGE = 2.0, 0.5  # per contract: 2.0 + 0.5 tick x 12.5 = 8.25 USD


def two_contract_file(tmp_path: Path, volumes=VOLUMES, name="es.dbn") -> Path:
    """Three bars per session and contract at 15:00-15:02 UTC; ESH4's closes run 5000, 5001, ...
    one point a bar, ESM4's are always 50 points above ESH4's at the same minute."""
    records = []
    for s, (day, vols) in enumerate(zip(SESSIONS, volumes, strict=True)):
        for minute in range(3):
            ts = day + pd.Timedelta(hours=15, minutes=minute)
            h = 5000.0 + 3 * s + minute
            for symbol, price in (("ESH4", h), ("ESM4", h + 50.0)):
                records.append(bar(IDS[symbol], ts, price, price + 0.25, price - 0.25, price, vols[symbol] // 3))
    mappings = {sym: (iid, dt.date(2024, 3, 4), dt.date(2024, 3, 8)) for sym, iid in IDS.items()}
    return encode(tmp_path / name, metadata(["ES.FUT"], mappings, stype_in=dbn.SType.PARENT), records)


def definitions_file(tmp_path: Path, expiry_h: str = "2024-03-07 13:30", tick=0.25, size=50.0) -> Path:
    def definition(symbol: str, expiry: str) -> dbn.InstrumentDefMsg:
        return dbn.InstrumentDefMsg(
            1, IDS[symbol], SESSIONS[0].value, SESSIONS[0].value, round(tick * NS), 10_000_000, symbol, "ES", "FUT",
            dbn.InstrumentClass.FUTURE, dbn.SecurityUpdateAction.ADD, expiration=pd.Timestamp(expiry, tz="UTC").value,
            unit_of_measure_qty=round(size * NS), unit_of_measure="IPNT",
        )  # fmt: skip

    meta = metadata(["ES.FUT"], {s: (i, dt.date(2024, 3, 4), dt.date(2024, 3, 8)) for s, i in IDS.items()},
                    stype_in=dbn.SType.PARENT, schema=dbn.Schema.DEFINITION)  # fmt: skip
    return encode(tmp_path / "defs.dbn", meta, [definition("ESH4", expiry_h), definition("ESM4", "2024-06-21 13:30")])


def load(path, **kwargs):
    source = databento_source(str(path), **kwargs)
    return source.continuous(ES)


def test_the_roll_is_the_session_after_volume_crossed(tmp_path):
    series = load(two_contract_file(tmp_path))
    assert series.schedule["contract"].tolist() == ["ESH4", "ESH4", "ESM4", "ESM4"]  # crossed Tuesday, rolled Wednesday
    (roll,) = series.rolls.itertuples()
    assert roll.session == pd.Timestamp("2024-03-06") and (roll.from_contract, roll.to_contract) == ("ESH4", "ESM4")
    assert roll.reason == "ESM4 outtraded ESH4 in session 2024-03-05 (600 vs 300)"
    # closed at ESH4's last close 5005, reopened at ESM4's close at that minute, 5055
    assert (roll.from_price, roll.roll_price, roll.gap) == (5005.0, 5055.0, 50.0)
    frame = series.frame
    assert frame["raw_close"].tolist() == [5000, 5001, 5002, 5003, 5004, 5005, 5056, 5057, 5058, 5059, 5060, 5061]
    assert frame["contract"].tolist() == ["ESH4"] * 6 + ["ESM4"] * 6
    assert np.isnan(frame["roll_price"].to_numpy()).sum() == 11 and frame["roll_price"].iloc[6] == 5055.0


@pytest.mark.parametrize("adjust", ["difference", "ratio"])
def test_the_adjusted_series_has_no_jump_at_the_roll(tmp_path, adjust):
    frame = load(two_contract_file(tmp_path), adjust=adjust).frame
    close = frame["close"].to_numpy()
    np.testing.assert_array_equal(close[6:], frame["raw_close"].to_numpy()[6:])  # the last contract keeps its prices
    if adjust == "difference":
        assert close[:6].tolist() == [5050, 5051, 5052, 5053, 5054, 5055]  # shifted by the 50-point gap
        np.testing.assert_array_equal(np.diff(close), np.ones(11))  # one point a bar, the roll included
    else:
        np.testing.assert_allclose(close[:6], (5000 + np.arange(6)) * 5055 / 5005, rtol=1e-15)
        # the roll bar's return is ESM4's own, 5056 / 5055, not the 5056 / 5005 jump
        assert close[6] / close[5] == pytest.approx(5056 / 5055, rel=1e-14)
    scale = frame["close"] / frame["raw_close"] if adjust == "ratio" else 1.0
    for column, spread in (("open", 0.0), ("high", 0.25), ("low", -0.25)):  # each price moves with its close
        np.testing.assert_allclose(frame[column] - frame["close"], spread * scale, atol=1e-9)


def test_the_backtest_trades_raw_prices_and_pays_the_roll(tmp_path):
    frame = load(two_contract_file(tmp_path), adjust="ratio").frame
    long = np.ones(len(frame), dtype=np.int8)
    result = backtest(long, frame["raw_close"], frame.index, ES, COMMISSION, SLIPPAGE, bars_per_year=1000.0,
                      roll_price=frame["roll_price"])  # fmt: skip
    # 11 steps of +1 point x 50 USD; costs: entry 8.25 + the roll's two contracts 16.50
    assert result.gross_pnl.tolist() == [50.0] * 11
    assert result.costs.tolist() == [8.25] + [0.0] * 4 + [16.5] + [0.0] * 5  # step 5 holds over roll bar 6
    assert result.metrics["pnl"] == 550.0 - 24.75
    naive = backtest(long, frame["raw_close"], frame.index, ES, COMMISSION, SLIPPAGE, bars_per_year=1000.0)
    assert naive.metrics["pnl"] == 550.0 + 50 * 50 - 8.25  # without the roll the spread is booked as profit
    flat_over_roll = long.copy()
    flat_over_roll[5] = 0  # flat from bar 5 to 6: nothing to roll
    costs = backtest(flat_over_roll, frame["raw_close"], frame.index, ES, COMMISSION, SLIPPAGE, bars_per_year=1000.0,
                     roll_price=frame["roll_price"]).costs  # fmt: skip
    assert costs[5] == 8.25 and costs[6] == 8.25  # one exit, one entry, no roll


def test_the_env_reward_is_the_backtest_pnl_in_ticks(tmp_path):
    frame = load(two_contract_file(tmp_path), adjust="difference").frame
    positions = np.array([1, 1, -1, -1, 1, 1, 1, 0, -1, -1, 1, 0], dtype=np.int8)
    env = TradingEnv.sequential(torch.zeros(len(frame), 3), frame["raw_close"].to_numpy().copy(), ES, COMMISSION,
                                SLIPPAGE, roll_price=frame["roll_price"].to_numpy().copy())  # fmt: skip
    env.reset()
    rewards = [float(env.step(torch.tensor([p + 1]))[1]) for p in positions[:-1]]
    result = backtest(positions, frame["raw_close"], frame.index, ES, COMMISSION, SLIPPAGE, bars_per_year=1000.0,
                      roll_price=frame["roll_price"])  # fmt: skip
    np.testing.assert_allclose(np.array(rewards) * ES.tick_value, result.pnl, rtol=1e-6)
    assert held_moves(frame["raw_close"], frame["roll_price"]).tolist() == [1.0] * 11


def test_open_interest_published_before_the_session_decides(tmp_path):
    two_contract_file(tmp_path, volumes=[{"ESH4": 900, "ESM4": 90}] * 4)  # volume never crosses
    oi = [  # (published, ESH4, ESM4)
        ("2024-03-04 12:00", 2000, 500),
        ("2024-03-05 20:00", 1000, 2000),  # after Tuesday's bars: decides Wednesday
        ("2024-03-06 15:01", 5000, 100),  # during Wednesday: known too late, and a roll never goes back
    ]
    records = [
        dbn.StatMsg(
            1,
            IDS[s],
            pd.Timestamp(t, tz="UTC").value,
            pd.Timestamp(t, tz="UTC").value,
            0,
            dbn.UNDEF_PRICE,
            q,
            dbn.StatType.OPEN_INTEREST,
        )  # fmt: skip
        for t, h, m in oi
        for s, q in (("ESH4", h), ("ESM4", m))
    ]
    meta = metadata(["ES.FUT"], {s: (i, dt.date(2024, 3, 4), dt.date(2024, 3, 8)) for s, i in IDS.items()},
                    stype_in=dbn.SType.PARENT, schema=dbn.Schema.STATISTICS)  # fmt: skip
    encode(tmp_path / "oi.dbn", meta, records)
    assert load(tmp_path, roll={"by": "volume", "expiry_sessions": None}).schedule["contract"].tolist() == ["ESH4"] * 4
    series = load(tmp_path, roll={"by": "open_interest", "expiry_sessions": None})
    assert series.schedule["contract"].tolist() == ["ESH4", "ESH4", "ESM4", "ESM4"]
    assert series.rolls["reason"].iloc[0] == (
        "ESM4 had more open interest than ESH4 published before 2024-03-06 15:00 UTC (2,000 vs 1,000)"
    )
    other = tmp_path / "without_statistics"
    other.mkdir()
    with pytest.raises(BarDataError, match="roll.by=open_interest needs open interest"):
        load(two_contract_file(other), roll={"by": "open_interest", "expiry_sessions": None})


def test_expiry_sessions_rolls_before_expiry(tmp_path):
    path = two_contract_file(tmp_path, volumes=[{"ESH4": 900, "ESM4": 90}] * 4)
    defs = definitions_file(tmp_path)  # ESH4 expires Thursday 2024-03-07
    series = load(path, definitions=str(defs), roll={"by": "volume", "expiry_sessions": 2})
    assert series.schedule["contract"].tolist() == ["ESH4", "ESH4", "ESM4", "ESM4"]
    assert series.rolls["reason"].iloc[0] == "2 session(s) left to ESH4's expiry 2024-03-07 (expiry_sessions=2)"
    with pytest.raises(BarDataError, match=r"roll.expiry_sessions=2 needs each contract's expiration .* ESH4, ESM4"):
        load(path, roll={"by": "volume", "expiry_sessions": 2})


def test_definitions_are_checked_against_the_asset(tmp_path):
    path = two_contract_file(tmp_path)
    assert load(path, definitions=str(definitions_file(tmp_path))).schedule["contract"].iloc[-1] == "ESM4"
    bad_tick = definitions_file(tmp_path, tick=0.5)
    with pytest.raises(BarDataError, match=r"defs\.dbn: ESH4: definition tick size 0\.5, but asset\.tick_size=0\.25"):
        load(path, definitions=str(bad_tick))
    small = dataclasses.replace(ES, multiplier=5.0, tick_value=1.25)  # MES-sized, but the file says 50
    with pytest.raises(BarDataError, match=r"contract size 50 IPNT .* but asset\.multiplier=5"):
        databento_source(str(path), definitions=str(definitions_file(tmp_path))).load(small)


def test_bad_roll_settings_name_the_key():
    with pytest.raises(ValueError, match=r"roll.by='calendar': must be one of volume, open_interest"):
        RollRule.from_config({"by": "calendar", "expiry_sessions": None}, "none")
    with pytest.raises(ValueError, match=r"roll.expiry_sessions=-1"):
        RollRule.from_config({"by": "volume", "expiry_sessions": -1}, "none")
    with pytest.raises(ValueError, match=r"roll.every: unknown key"):
        RollRule.from_config({"every": 3}, "none")
    with pytest.raises(ValueError, match=r"adjust='log': must be one of none, difference, ratio"):
        RollRule.from_config("volume", "log")
    with pytest.raises(ValueError, match=r"Lean minute data rolls by volume only"):
        lean_source("x", roll={"by": "open_interest", "expiry_sessions": None})


@pytest.mark.realdata
def test_real_lean_roll_schedule(real_data_dir):
    series = lean_source(str(real_data_dir / "es_lean_minute"), adjust="difference").continuous(ES)
    rolls = series.rolls
    assert rolls["session"].dt.strftime("%Y-%m-%d").tolist() == ["2013-12-19", "2020-01-06"]
    assert rolls["to_contract"].tolist() == ["ESH14", "ESH20"]
    # ESH14 led the 2013-12-18 session (2,253,915 contracts against ESZ13's 282,813): held from 12-19
    assert rolls["reason"].iloc[0] == "ESH14 outtraded ESZ13 in session 2013-12-18 (2,253,915 vs 282,813)"
    assert rolls["reason"].iloc[1] == "ESH14 expired before this session"
    # ESZ13's last bar 2013-12-18 22:14 closed at 1810.25; ESH14's last close by then was 1804.00
    assert (rolls["from_price"].iloc[0], rolls["roll_price"].iloc[0]) == (1810.25, 1804.0)
    frame = series.frame
    at = frame.index.get_loc(rolls["first_bar"].iloc[0])
    jump = frame["close"].iloc[at] - frame["close"].iloc[at - 1]
    assert jump == frame["raw_close"].iloc[at] - 1804.0  # ESH14's own first move, not the -6.25 spread


@pytest.mark.realdata
def test_real_definitions_match_the_asset_configs(real_data_dir):
    folder = real_data_dir / "databento"
    bars = folder / "historical_bars_catalog_futures_ohlcv-1m_2024-07-01T23-40_2024-07-02T00-10.dbn.zst"
    defs = folder / "historical_bars_catalog_futures_definition.dbn.zst"  # ESU4 and NQU4: tick 0.25, 50 and 20 IPNT
    nq = asset("nq")
    for spec in (ES, nq):
        assert len(databento_source(str(bars), definitions=str(defs)).load(spec)) == 30
    wrong = dataclasses.replace(nq, multiplier=50.0, tick_value=12.5)
    with pytest.raises(
        BarDataError, match=r"NQU4: definition contract size 20 IPNT \(= 20 per 1.0 of price\), but asset\.multiplier=50"
    ):
        databento_source(str(bars), definitions=str(defs)).load(wrong)
    series = databento_source(str(bars), definitions=str(defs), roll={"by": "volume", "expiry_sessions": 5}).continuous(ES)
    assert series.schedule["contract"].tolist() == ["ESU4"]  # expires 2024-09-20: far from the 2024-07-02 session
