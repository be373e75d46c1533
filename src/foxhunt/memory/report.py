"""The memory report of one run: a markdown table and a stacked-bar PNG.

Every figure carries how it was measured (:class:`MeasuredFigure.method`), and the table and
the picture print it next to the number; a probe that did not run is listed with the reason.
The PNG has two panels with their own scales (the accounted tensor bytes of a small model are
a sliver of the process's resident set): left, one bar stacked by component with the model's
target; right, the device figures with the budget's available and total memory.

The figure is drawn on a ``matplotlib.figure.Figure`` with an Agg canvas, never through
``pyplot``: no global figure registry, no backend switch, nothing left open in the process.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from foxhunt.memory.accounting import COMPONENT_METHODS, MemoryBreakdown, to_mb
from foxhunt.memory.budget import MemoryBudget
from foxhunt.memory.probes import ProbeStatus

REPORT_MARKDOWN = "memory_report.md"
REPORT_PNG = "memory_report.png"
FIGURE_SIZE_INCHES = (12.0, 6.0)
DPI = 100
LEGEND_WRAP_CHARS = 52  # a legend entry's line length: the legends sit under their plots, inside the picture
COMPONENT_COLORS = {
    "params": "#4c72b0",
    "grads": "#dd8452",
    "optimizer": "#55a868",
    "buffers": "#8172b3",
    "model_state": "#937860",
    "activations": "#c44e52",
    "temporaries": "#da8bc3",
}
DEVICE_COLOR = "#64b5cd"
OFF_SCALE_FACTOR = 10.0  # a limit line this many times above the tallest bar is listed, not drawn


@dataclass(frozen=True)
class MeasuredFigure:
    """A number of bytes with how it was measured; ``bytes`` is ``None`` when not measured."""

    name: str
    bytes: int | None
    method: str

    @property
    def mb(self) -> float | None:
        return None if self.bytes is None else to_mb(self.bytes)


@dataclass(frozen=True)
class MemoryReport:
    """Everything the report shows. ``peak`` is checked against ``target_mb``,
    ``device_peak`` against ``budget``; ``device_figures`` are the raw probe readings."""

    title: str
    breakdown: MemoryBreakdown
    peak: MeasuredFigure
    device_peak: MeasuredFigure
    device_figures: Sequence[MeasuredFigure] = ()
    probes: Sequence[ProbeStatus] = ()
    budget: MemoryBudget | None = None
    target_mb: float | None = None
    breaches: Sequence[str] = ()
    steps: int = 0
    callback_seconds: float | None = None
    once_seconds: float | None = None
    train_seconds: float | None = None
    notes: Sequence[str] = field(default_factory=tuple)

    @property
    def headroom_mb(self) -> float | None:
        if self.budget is None or self.device_peak.mb is None:
            return None
        return self.budget.headroom_left_mb(self.device_peak.mb)

    @property
    def overhead_fraction(self) -> float | None:
        if self.callback_seconds is None or not self.train_seconds:
            return None
        return self.callback_seconds / self.train_seconds


def _mb(value: float | None) -> str:
    """MB with enough digits for a small model's kilobytes and a card's gigabytes."""
    if value is None:
        return "-"
    return f"{value:.3f}" if abs(value) >= 1 else f"{value:.4g}"


def _limit_line(axes, value: float, tallest: float, label: str, **style) -> None:
    """A horizontal limit; listed in the legend only when it would flatten the bars."""
    if tallest > 0 and value > OFF_SCALE_FACTOR * tallest:
        axes.plot([], [], label=f"{label} (off scale)", **style)
    else:
        axes.axhline(value, label=label, **style)


def render_markdown(report: MemoryReport) -> str:
    """The report as markdown: components, peaks against limits, probes, verdict, overhead."""
    lines = [
        f"# Memory report: {report.title}",
        "",
        f"Measured over {report.steps} training steps. Every figure is measured; the last "
        "column says how. MB = MiB (1,048,576 bytes).",
        "",
        "## Components",
        "",
        "| component | MB | bytes | how measured |",
        "| --- | ---: | ---: | --- |",
    ]
    for name, nbytes in report.breakdown.components().items():
        lines.append(f"| {name} | {_mb(to_mb(nbytes))} | {nbytes} | {COMPONENT_METHODS[name]} |")
    total = report.breakdown.total_training_bytes
    lines += [
        f"| **total** | {_mb(to_mb(total))} | {total} | sum of the components, each at its own "
        "measured peak (an upper bound of what is alive at one instant) |",
        "",
        "## Peaks and limits",
        "",
        "| figure | MB | how measured |",
        "| --- | ---: | --- |",
        f"| peak (checked against the model target) | {_mb(report.peak.mb)} | {report.peak.method} |",
        f"| model target | {_mb(report.target_mb)} | config `model.memory_target_mb` |",
        f"| device peak (checked against the budget) | {_mb(report.device_peak.mb)} | {report.device_peak.method} |",
    ]
    if report.budget is not None:
        budget = report.budget
        lines += [
            f"| budget `{budget.name}` available | {budget.available_mb:.3f} | config: "
            f"{budget.total_mb:g} MB total - {budget.headroom_mb:g} MB required headroom |",
            f"| headroom left | {_mb(report.headroom_mb)} | budget total minus the device peak |",
        ]
    lines += ["", "## Device probes", "", "| figure | MB | how measured |", "| --- | ---: | --- |"]
    lines += [f"| {f.name} | {_mb(f.mb)} | {f.method} |" for f in report.device_figures]
    lines += ["", "| probe | ran | detail |", "| --- | --- | --- |"]
    lines += [f"| {p.name} | {'yes' if p.ran else 'no'} | {p.detail} |" for p in report.probes]
    lines += ["", "## Verdict", ""]
    if report.breaches:
        lines += [f"- BREACH: {message}" for message in report.breaches]
    else:
        lines.append("- within the model target and the budget")
    if report.overhead_fraction is not None:
        lines += [
            "",
            "## Callback overhead",
            "",
            f"{report.callback_seconds:.4f} s inside the memory callback's per-step hooks (metric "
            f"writes included) over {report.train_seconds:.3f} s of training "
            f"({100 * report.overhead_fraction:.3f} %), measured with time.perf_counter around each "
            "hook; the first step's saved-tensor hooks run inside that step and are not included."
            + (
                ""
                if report.once_seconds is None
                else f" Once, before training: {report.once_seconds:.4f} s (probes, static breakdown)."
            ),
        ]
    if report.notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in report.notes]
    return "\n".join(lines) + "\n"


def plot_report(report: MemoryReport, path: str | Path) -> Path:
    """Write the stacked-bar picture of ``report`` to ``path`` (PNG); return the path."""
    path = Path(path)
    figure = draw_report(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


def draw_report(report: MemoryReport) -> Figure:
    """The stacked-bar picture of ``report``: training memory by component beside the device's
    and the process's figures, each with its limits."""
    figure = Figure(figsize=FIGURE_SIZE_INCHES, dpi=DPI, layout="constrained")  # room for the legends under the plots
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.4]})

    bottom = 0.0
    for name, nbytes in report.breakdown.components().items():
        height = to_mb(nbytes)
        left.bar(
            ["components"],
            [height],
            bottom=[bottom],
            color=COMPONENT_COLORS[name],
            label=_label(f"{name} {_mb(height)} MB", COMPONENT_METHODS[name]),
        )
        bottom += height
    tallest = bottom
    if report.peak.mb is not None:
        left.bar(
            ["peak"], [report.peak.mb], color=DEVICE_COLOR, label=_label(f"peak {_mb(report.peak.mb)} MB", report.peak.method)
        )
        tallest = max(tallest, report.peak.mb)
    if report.target_mb is not None:
        _limit_line(
            left, report.target_mb, tallest, f"model target {report.target_mb:g} MB (config)", color="black", linestyle="--"
        )
    left.set_ylabel("MB (MiB)")
    left.set_title("Training memory by component (measured)", fontsize=10)
    left.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.08))

    names, heights, labels = [], [], []
    for item in [report.device_peak, *report.device_figures]:
        if item.mb is not None:
            names.append(item.name)
            heights.append(item.mb)
            labels.append(_label(f"{item.name} {_mb(item.mb)} MB", item.method))
    bars = right.bar(names, heights, color=DEVICE_COLOR)
    for bar, label in zip(bars, labels):
        bar.set_label(label)
    if report.budget is not None:
        budget = report.budget
        tallest = max(heights, default=0.0)
        _limit_line(
            right,
            budget.available_mb,
            tallest,
            f"budget {budget.name} available {budget.available_mb:g} MB (config)",
            color="red",
            linestyle="--",
        )
        _limit_line(
            right,
            budget.total_mb,
            tallest,
            f"budget {budget.name} total {budget.total_mb:g} MB (config)",
            color="black",
            linestyle=":",
        )
    right.set_ylabel("MB (MiB)")
    right.set_title("Device and process (measured)", fontsize=10)
    right.tick_params(axis="x", labelsize=7, labelrotation=15)
    right.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.15))

    status = "BREACH" if report.breaches else "within limits"
    figure.suptitle(f"{report.title}: {status}", fontsize=11)
    return figure


def _label(figure: str, method: str) -> str:
    """A legend entry: the figure and the first clause of how it was measured (the markdown beside
    the picture says the rest), wrapped so the legend stays inside the picture."""
    first_clause = re.split(r" \(|: |; ", method, maxsplit=1)[0]
    return textwrap.fill(f"{figure}: {first_clause}", LEGEND_WRAP_CHARS)


def write_report(report: MemoryReport, directory: str | Path) -> tuple[Path, Path]:
    """Write ``memory_report.md`` and ``memory_report.png`` into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    markdown = directory / REPORT_MARKDOWN
    markdown.write_text(render_markdown(report))
    png = plot_report(report, directory / REPORT_PNG)
    return markdown, png
