"""``foxhunt data show``: what a data config yields, on the real Lean ES files, a two-contract
Databento file and the synthetic source; bad inputs get their one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_roll import two_contract_file
from typer.testing import CliRunner

from foxhunt.cli import app


def show(root: Path, *args: str):
    old = os.getcwd()
    os.chdir(root)
    try:
        return CliRunner().invoke(app, ["data", "show", *args], env={"FOXHUNT_ROOT": str(root)})
    finally:
        os.chdir(old)


@pytest.mark.realdata
def test_real_lean_es_roll_schedule(tmp_path, real_data_dir):
    path = str(real_data_dir / "es_lean_minute")
    text = show(tmp_path, "data=lean", f"data.source.path={path}", "asset=es", "data.source.adjust=difference")
    assert text.exit_code == 0, text.output
    assert "2013-12-19  ESZ13 -> ESH14  at 2013-12-18T23:00: out at 1810.25, in at 1804 (gap -6.25); " \
           "ESH14 outtraded ESZ13 in session 2013-12-18 (2,253,915 vs 282,813)" in text.output  # fmt: skip
    assert "calendar: CME_Equity" in text.output
    result = show(tmp_path, "data=lean", f"data.source.path={path}", "asset=es", "--json", "--min-gap", "60")
    summary = json.loads(result.output)
    assert [r["to_contract"] for r in summary["rolls"]] == ["ESH14", "ESH20"]
    assert summary["bars"] == 18_888 and summary["bars_per_contract"] == {"ESH14": 1367, "ESH20": 1425, "ESZ13": 16096}
    assert sum(s["bars"] for s in summary["sessions"]) == summary["bars"]
    assert summary["tick_grid"]["off_grid"] == 0
    # the days without a file are gaps; the weekends and daily breaks between files are not
    assert summary["gaps"][0] == {"start": "2013-10-13T22:00:00+00:00", "end": "2013-10-14T00:00:00+00:00",
                                  "open_minutes_missing": 120, "closed_minutes_inside": 0}  # fmt: skip
    assert "2013-12-25" in summary["calendar"]["holidays"]
    splits = summary["splits"]
    assert splits["train"]["rows"] + splits["val"]["rows"] + splits["test"]["rows"] + 2 * 60 + splits["warmup_bars"] == 18_888
    assert Path(summary["png"]).stat().st_size > 10_000


def test_a_file_too_short_for_the_splits_is_shown_with_what_it_holds(tmp_path):
    path = two_contract_file(tmp_path)
    result = show(tmp_path, "data=databento", f"data.source.path={path}", "asset=es", "data.source.adjust=ratio",
                  "--json", "--png", str(tmp_path))  # fmt: skip
    assert result.exit_code == 0, result.output  # 12 bars cannot fill the default splits: said, not refused
    summary = json.loads(result.output)
    assert summary["bars"] == 12 and "gives 0 bars" in summary["splits"]["error"]
    assert summary["png"] == str(tmp_path / "es-continuous.png") and Path(summary["png"]).is_file()  # --png <folder>
    text = show(tmp_path, "data=databento", f"data.source.path={path}", "asset=es")
    assert "  not formed: split." in text.output and text.exit_code == 0


@pytest.mark.realdata
def test_the_real_databento_one_minute_sample_is_shown(tmp_path, real_data_dir):
    result = show(tmp_path, "data=databento", f"data.source.path={real_data_dir / 'databento' / 'GLBX.MDP3.test_data.ohlcv-1m.dbn.zst'}",
                  "asset=es", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["bars"] > 0 and "error" in summary["splits"]
    # the file it read, as for a CSV or Lean source (a Databento source listed none: found by a helper)
    assert summary["files"] == [str(real_data_dir / "databento" / "GLBX.MDP3.test_data.ohlcv-1m.dbn.zst")]


def test_the_lockbox_is_shown_after_the_splits(tmp_path):
    result = show(tmp_path, "data=synthetic", "data.source.days=14", "asset=es", "evaluation.holdout=0.1", "--json")
    splits = json.loads(result.output)["splits"]
    assert splits["protocol"] == "single" and splits["holdout"]["rows"] > 0
    assert splits["test"]["last_bar"] < splits["holdout"]["first_bar"]


def test_synthetic_walk_forward_folds_and_the_calendar(tmp_path):
    synthetic = show(tmp_path, "data=synthetic", "data.source.days=14", "asset=es", "evaluation.protocol=walk_forward",
                     "evaluation.walk_forward.folds=2", "--json")  # fmt: skip
    assert synthetic.exit_code == 0, synthetic.output
    summary = json.loads(synthetic.output)
    assert summary["rolls"] == [] and summary["gaps"] == []  # synthetic bars fill every open minute
    # the first bar opens the 2024-01-02 session on New Year's Day's evening: the holiday is in range
    assert (summary["first_bar"], summary["last_bar"]) == ("2024-01-01T23:00:00+00:00", "2024-01-12T21:59:00+00:00")
    assert summary["calendar"] == {"name": "CME_Equity", "holidays": ["2024-01-01"], "early_closes": []}
    assert [f["fold"] for f in summary["splits"]["folds"]] == [0, 1]


def test_bad_inputs_are_one_line(tmp_path):
    bad_key = show(tmp_path, "data=lean", "data.source.path=/nowhere", "asset=es", "data.source.roll.by=calendar")
    assert bad_key.exit_code == 2 and "roll.by='calendar'" in bad_key.output and "Traceback" not in bad_key.output
    missing = show(tmp_path, "data=lean", f"data.source.path={tmp_path / 'none'}", "asset=es")
    assert missing.exit_code == 2 and str(tmp_path / "none") in missing.output and "Traceback" not in missing.output


def test_bars_on_a_holiday_alone_are_shown_and_an_unwritable_chart_is_one_line(tmp_path):
    """Bars of one CME holiday (no session in their range: the calendar's early closes failed with
    an AttributeError traceback), and --png under a file (a FileExistsError traceback after the
    whole load): found probing the data commands."""
    path = tmp_path / "holiday.csv"
    path.write_text("timestamp_utc,open,high,low,close,volume\n2024-01-01 23:01:00,1.1076,1.10785,1.1076,1.1078,205\n"
                    "2024-01-01 23:02:00,1.1078,1.1079,1.1077,1.1078,94\n")  # fmt: skip
    shown = show(tmp_path, "asset=6e", "data=csv", f"data.source.path={path}")
    assert shown.exit_code == 0 and "Traceback" not in shown.output, shown.output
    chart = show(tmp_path, "data.source.days=7", "--png", str(path / "x.png"))
    assert chart.exit_code == 2 and "Traceback" not in chart.output, chart.output
    assert f"--png {path / 'x.png'}: the chart cannot be written there" in chart.output
    # a name not ending in .png: matplotlib's traceback for out.csv, a chart written as NOTES.png named NOTES (found by a helper)
    for name in ("out.csv", "NOTES"):
        refused = show(tmp_path, "data.source.days=7", "--png", str(tmp_path / name))
        assert refused.exit_code == 2 and "Traceback" not in refused.output, refused.output
        assert f"--png {tmp_path / name}: the chart is a PNG file" in refused.output and not (tmp_path / name).exists()
