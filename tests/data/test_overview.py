"""foxhunt.data.overview.describe on bars made here (the command around it: test_data_show.py):
bars counted per contract and per session, gaps only in open-market time, the off-grid raw
closes, each split's rows, and bars too few for the splits said, not refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from foxhunt.assets import AssetSpec
from foxhunt.data.features import FeatureConfig
from foxhunt.data.overview import describe
from foxhunt.data.splits import SplitConfig

raw = OmegaConf.to_container(OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "asset" / "es.yaml"))
ES = AssetSpec(**{k: v for k, v in raw.items() if k != "_target_"})
FEATURES = FeatureConfig(5, 10, 10)
SPLIT = SplitConfig(0.6, 0.2, 0.2, 1)


class Source:  # what describe reads of a source: its type's name; no files
    pass


def frame(stamps, raw_close, contracts) -> pd.DataFrame:
    close = np.asarray(raw_close, np.float64)
    return pd.DataFrame({"open": close, "high": close + 0.25, "low": close - 0.25, "close": close, "volume": 1.0,
                         "raw_close": close, "contract": contracts}, index=pd.DatetimeIndex(stamps, tz="UTC"))  # fmt: skip


def test_counts_gaps_in_open_market_time_and_off_grid_closes():
    """Tuesday 20:50-20:59 UTC, the daily break (21:00-22:00 UTC), then 22:00-22:09 (the next trading
    date) with 22:05-22:06 missing: one gap of 2 open minutes; the break is none. One close off the grid."""
    stamps = [*pd.date_range("2024-03-12 20:50", periods=10, freq="1min"), *pd.date_range("2024-03-12 22:00", periods=5, freq="1min"),
              *pd.date_range("2024-03-12 22:07", periods=3, freq="1min")]  # fmt: skip
    closes = 4800.0 + 0.25 * np.arange(len(stamps))
    closes[12] += 0.1  # 22:02
    bars = frame(stamps, closes, ["ESH4"] * 10 + ["ESM4"] * 8)
    summary = describe(Source(), ES, bars, None, FEATURES, SPLIT)
    assert (summary["source"], summary["bars"], summary["files"], summary["rolls"]) == ("Source", 18, [], [])
    assert summary["bars_per_contract"] == {"ESH4": 10, "ESM4": 8}
    assert [(s["session"], s["contract"], s["bars"]) for s in summary["sessions"]] == [("2024-03-12", "ESH4", 10),
                                                                                       ("2024-03-13", "ESM4", 8)]  # fmt: skip
    (gap,) = summary["gaps"]
    assert (gap["start"], gap["open_minutes_missing"]) == ("2024-03-12T22:05:00+00:00", 2)
    assert summary["tick_grid"] == {"tick": 0.25, "raw_closes": 18, "off_grid": 1, "first_off_grid": "2024-03-12T22:02:00+00:00"}
    assert summary["calendar"]["name"] == "CME_Equity"
    # after the 10 bars of warm-up: train 22:00-22:02, a gap bar, val 22:04, a gap bar, test 22:08-22:09
    splits = summary["splits"]
    assert (splits["protocol"], splits["warmup_bars"]) == ("single", FEATURES.warmup_bars)
    assert [(splits[k]["rows"], splits[k]["first_bar"]) for k in ("train", "val", "test")] == [
        (3, "2024-03-12T22:00:00Z"),
        (1, "2024-03-12T22:04:00Z"),
        (2, "2024-03-12T22:08:00Z"),
    ]


def test_bars_too_few_for_the_splits_are_said_not_refused():
    stamps = pd.date_range("2024-03-12 15:00", periods=12, freq="1min")
    summary = describe(Source(), ES, frame(stamps, np.full(12, 4800.0), "ESH4"), None, FEATURES, SPLIT)
    assert summary["bars"] == 12 and summary["gaps"] == []
    assert summary["splits"]["error"] == "split.train=0.6: gives 0 bars (2 bars after warm-up, split.gap_bars=1); need more bars"


def test_enough_bars_give_each_splits_rows_in_order():
    stamps = pd.date_range("2024-03-12 13:00", periods=400, freq="1min")
    bars = frame(stamps, 4800.0 + 0.25 * (np.arange(400) % 7), "ESH4")
    splits = describe(Source(), ES, bars, None, FEATURES, SPLIT)["splits"]
    assert "error" not in splits
    rows = {name: splits[name] for name in ("train", "val", "test")}
    usable = 400 - FEATURES.warmup_bars
    assert sum(r["rows"] for r in rows.values()) == usable - 2 * SPLIT.gap_bars
    assert rows["train"]["last_bar"] < rows["val"]["first_bar"] <= rows["val"]["last_bar"] < rows["test"]["first_bar"]
