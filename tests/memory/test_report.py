"""The memory report: every figure with how it was measured; markdown and PNG written."""

from __future__ import annotations

import matplotlib.image
import pytest

from foxhunt.memory.accounting import BYTES_PER_MB, COMPONENT_METHODS, MemoryBreakdown
from foxhunt.memory.budget import MemoryBudget
from foxhunt.memory.probes import ProbeStatus
from foxhunt.memory.report import (
    DPI,
    FIGURE_SIZE_INCHES,
    REPORT_MARKDOWN,
    REPORT_PNG,
    MeasuredFigure,
    MemoryReport,
    render_markdown,
    write_report,
)

MB = BYTES_PER_MB


def make_report(**changes) -> MemoryReport:
    fields = dict(
        title="TinyNet",
        breakdown=MemoryBreakdown(
            params_bytes=10 * MB,
            grads_bytes=10 * MB,
            optimizer_bytes=20 * MB,
            buffers_bytes=MB // 2,
            model_state_bytes=64 * MB,
            activations_bytes=3 * MB,
        ),
        peak=MeasuredFigure("peak", 120 * MB, "torch.cuda.max_memory_allocated since the run started"),
        device_peak=MeasuredFigure("device peak", 600 * MB, "NVML used minus baseline"),
        device_figures=[MeasuredFigure("process RSS", 900 * MB, "process resident set size (psutil)")],
        probes=[
            ProbeStatus("cuda", True, "allocator peaks of cuda:0"),
            ProbeStatus("nvml", False, "import pynvml failed (nvidia-ml-py): no module"),
            ProbeStatus("rss", True, "resident set size of this process"),
        ],
        budget=MemoryBudget("rtx3050ti", total_mb=4096, headroom_mb=500),
        target_mb=150.0,
        steps=42,
        callback_seconds=0.05,
        once_seconds=0.01,
        train_seconds=10.0,
    )
    fields.update(changes)
    return MemoryReport(**fields)


def table_rows(markdown: str) -> list[list[str]]:
    rows = []
    for line in markdown.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_markdown_lists_every_component_with_exact_bytes_and_method():
    markdown = render_markdown(make_report())
    rows = {row[0]: row for row in table_rows(markdown)}
    assert rows["params"] == ["params", "10.000", str(10 * MB), COMPONENT_METHODS["params"]]
    assert rows["buffers"] == ["buffers", "0.5", str(MB // 2), COMPONENT_METHODS["buffers"]]
    assert rows["**total**"][1:3] == ["107.500", str(107 * MB + MB // 2)]
    assert rows["headroom left"][1] == f"{4096 - 600:.3f}"
    assert rows["budget `rtx3050ti` available"][1] == "3596.000"
    assert rows["model target"][1] == "150.000"
    assert rows["nvml"] == ["nvml", "no", "import pynvml failed (nvidia-ml-py): no module"]
    assert "(0.500 %)" in markdown  # 0.05 s of 10 s


def test_every_figure_says_how_it_was_measured():
    for row in table_rows(render_markdown(make_report())):
        assert row[-1], f"row without a method: {row}"


def test_small_figures_keep_their_digits():
    report = make_report(breakdown=MemoryBreakdown(params_bytes=220))
    rows = {row[0]: row for row in table_rows(render_markdown(report))}
    assert rows["params"][1:3] == ["0.0002098", "220"]


def test_verdict_lists_breaches_or_says_within():
    assert "- within the model target and the budget" in render_markdown(make_report())
    breach = "memory target exceeded at step 3: 200.00 MB (x) > 150.00 MB (model.memory_target_mb)"
    markdown = render_markdown(make_report(breaches=[breach]))
    assert f"- BREACH: {breach}" in markdown
    assert "within the model target" not in markdown


def test_write_report_writes_markdown_and_png(tmp_path):
    markdown, png = write_report(make_report(), tmp_path / "reports")
    assert markdown == tmp_path / "reports" / REPORT_MARKDOWN and png == tmp_path / "reports" / REPORT_PNG
    assert markdown.read_text().startswith("# Memory report: TinyNet")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width = matplotlib.image.imread(png).shape[:2]
    assert (width, height) == (int(FIGURE_SIZE_INCHES[0] * DPI), int(FIGURE_SIZE_INCHES[1] * DPI))


@pytest.mark.parametrize("budget", [None, MemoryBudget("cpu", 16384, 2048, kind="cpu")])
def test_report_without_budget_or_target_or_measurements_still_renders(tmp_path, budget):
    report = make_report(
        breakdown=MemoryBreakdown(),
        budget=budget,
        target_mb=None,
        device_figures=[],
        callback_seconds=None,
        train_seconds=None,
        notes=["activations and gradients not measured: no training step produced gradients"],
    )
    markdown, png = write_report(report, tmp_path)
    text = markdown.read_text()
    assert "## Callback overhead" not in text
    assert "- activations and gradients not measured" in text
    assert ("headroom left" in text) == (budget is not None)
    assert png.stat().st_size > 0
