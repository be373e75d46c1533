"""The memory report's picture: its legends lie inside the figure (their colours can be read),
and drawing it warns of nothing."""

from __future__ import annotations

import warnings

import pytest
from test_report import make_report

from foxhunt.memory.accounting import BYTES_PER_MB, MemoryBreakdown
from foxhunt.memory.budget import MemoryBudget
from foxhunt.memory.report import MeasuredFigure, draw_report

# The figures and methods of a default run's report (DQN on a CPU, 2026-12-03): the peak's and the
# device peak's methods are a few hundred characters, as the callback writes them.
CPU_RUN = dict(
    title="DQNAgent",
    breakdown=MemoryBreakdown(
        params_bytes=569368,
        grads_bytes=284684,
        optimizer_bytes=569392,
        buffers_bytes=0,
        model_state_bytes=1520304,
        activations_bytes=68608,
        temporaries_bytes=68868,
    ),  # fmt: skip
    peak=MeasuredFigure(
        "peak",
        3081224,
        "allocator peak of the first training step: bytes live when it began plus the peak of what it allocated "
        "(AllocationPeak, a TorchDispatchMode; equal to torch's MemTracker), temporaries included; forward, backward "
        "and optimizer update (a compiled update runs op by op under the meter: its temporaries are eager's, an upper "
        "bound of the compiled kernel's)",
    ),
    device_peak=MeasuredFigure(
        "device peak",
        3081224,
        "sum of the accounted components (no device probe for this budget ran: CUDA context, allocator cache and "
        "process overhead not included)",
    ),
    device_figures=[
        MeasuredFigure("process RSS", 701 * BYTES_PER_MB, "process resident set size (psutil), max over the samples")
    ],
)


def _outside(inner, outer) -> list[str]:
    """The sides of ``inner`` that stick out of ``outer`` (display units, one pixel of slack)."""
    sides = {"left": outer.x0 - inner.x0, "bottom": outer.y0 - inner.y0, "right": inner.x1 - outer.x1, "top": inner.y1 - outer.y1}
    return [f"{side} by {by:.0f} px" for side, by in sides.items() if by > 1.0]


@pytest.mark.parametrize("budget", [MemoryBudget("rtx3050ti", total_mb=4096, headroom_mb=500), None])
@pytest.mark.parametrize("run", ["cpu run", "short methods"])
def test_legends_lie_inside_the_figure_and_drawing_warns_of_nothing(budget, run):
    report = make_report(budget=budget, **(CPU_RUN if run == "cpu run" else {}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        figure = draw_report(report)
        figure.canvas.draw()  # the layout is made when drawn, as savefig draws it
    renderer = figure.canvas.get_renderer()
    legends = [axes.get_legend() for axes in figure.axes]
    assert len(legends) == 2 and all(legend is not None for legend in legends)
    for legend in legends:
        assert _outside(legend.get_window_extent(renderer), figure.bbox) == [], [t.get_text() for t in legend.get_texts()]
    for axes in figure.axes:  # and the plots themselves are not squeezed away by them
        assert axes.get_window_extent(renderer).height > 0.25 * figure.bbox.height
    assert [str(w.message) for w in caught] == []
