"""The end-of-sweep summary: text table, markdown pivot, heatmap."""

from __future__ import annotations

from foxhunt.runs.cell import CellKey, CellResult
from foxhunt.sweeps.summary import failures, format_markdown, format_table, plot_heatmap


def _records() -> list[CellResult]:
    ok = {"test/sharpe": 1.23456, "val/loss": 0.98765, "memory/device_peak_mb": 612.4}
    return [
        CellResult(CellKey("dqn", "es", "fp32", "42", "h1"), "FINISHED", "r1", None, 12.34, None, {"test/sharpe": -0.5, "memory/device_peak_mb": 80.0}),
        CellResult(CellKey("dqn", "nq", "fp32", "42", "h2"), "FAILED", "r2", "BarDataError: bad.csv line 3: price not on the tick grid", 1.0),
        CellResult(CellKey("tft", "es", "fp32", "42", "h3"), "SKIPPED", "r3", None, 30.0, "skipped: FINISHED earlier in run r3", ok),
        CellResult(CellKey("tft", "nq", "fp32", "42", "h4"), "FINISHED", "r4", None, 31.0, None, ok),
    ]


def test_table_has_one_line_per_cell_with_the_figures():
    lines = format_table(_records()).splitlines()
    assert lines[0].split() == ["cell", "status", "test/sharpe", "val/loss", "peak", "MB", "wall", "s", "error", "/", "note"]
    assert lines[2].split() == ["dqn-es-fp32", "FINISHED", "-0.500", "-", "80", "12.3"]
    assert lines[3].split()[:6] == ["dqn-nq-fp32", "FAILED", "-", "-", "-", "1.0"]
    assert "price not on the tick grid" in lines[3]
    assert lines[5].split()[:6] == ["tft-nq-fp32", "FINISHED", "1.235", "0.9877", "612", "31.0"]
    assert [r.cell for r in failures(_records())] == ["dqn-nq-fp32"]


def test_markdown_has_the_model_by_asset_pivot_and_names_failures():
    text = format_markdown(_records(), "sweep x")
    assert "| model | es | nq |" in text
    assert "| dqn | -0.500 | FAILED |" in text
    assert "| tft | 1.235 | 1.235 |" in text
    assert text.rstrip().endswith("3 of 4 cells ok; failed: dqn-nq-fp32")


def test_heatmap_is_a_png(tmp_path):
    path = plot_heatmap(_records(), tmp_path / "summary.png", "sweep x")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
