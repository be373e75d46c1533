"""The report of ``foxhunt memory validate``: text (printed), markdown, JSON and a PNG.

What it shows, every figure with how it was measured (nothing in it is an estimate; a
prediction is labelled as one and sits beside its measurement):

- a per-model table: the measured footprint, the model's target, the footprint as a share of
  the budget's total memory and of the target, PASS / FAIL against the target (with
  ``--predict``: the predicted footprint and its error);
- the components of every footprint (parameters, gradients, optimizer state, buffers,
  model-owned state, activations), measured (and predicted);
- the ensemble total (every model resident at once) and the headroom analysis against the
  budget's required headroom;
- an ASCII bar chart scaled to the budget: one column is ``total_mb / BAR_COLUMNS``; ``|``
  marks the available memory (total - required headroom), ``!`` a column beyond it;
- the verdict line.

The PNG is drawn on a ``matplotlib.figure.Figure`` with an Agg canvas, never through
``pyplot`` (as :mod:`foxhunt.memory.report`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from foxhunt.memory.accounting import COMPONENT_METHODS, MemoryBreakdown, to_mb
from foxhunt.memory.card import ASSUMPTION, CardVerdict
from foxhunt.memory.predict import COMPONENT_PREDICTIONS
from foxhunt.memory.report import COMPONENT_COLORS
from foxhunt.memory.training_run import MEASURE_EXTRA_STEPS

MARKDOWN_NAME = "memory_validate.md"
JSON_NAME = "memory_validate.json"
PNG_NAME = "memory_validate.png"
BAR_COLUMNS = 60
COMPONENTS = ("params", "grads", "optimizer", "buffers", "model_state", "activations", "temporaries")
FIGURE_SIZE_INCHES = (13.0, 6.5)
LABEL_ROOM = 1.35  # x range of the per-model panel, as a multiple of its largest figure (room for the labels)
DPI = 100


def _mb(value: float | None, width: int = 0, digits: int = 2) -> str:
    text = "-" if value is None else f"{value:.{digits}f}"
    return f"{text:>{width}}"


def _pct(value: float | None, width: int = 0) -> str:
    text = "-" if value is None else f"{value:.2f}%"
    return f"{text:>{width}}"


def _signed_pct(value: float | None, width: int = 0) -> str:
    text = "-" if value is None else f"{value:+.2f}%"
    return f"{text:>{width}}"


# -- text --------------------------------------------------------------------------------
def render_text(verdict: CardVerdict) -> str:
    """The report as printed: header, tables, headroom, bars, verdict line."""
    budget = verdict.budget
    predicted = any(m.prediction is not None for m in verdict.models)
    lines = [
        "foxhunt memory validate",
        f"  budget     {budget.name} ({budget.kind}): {budget.total_mb:g} MB total, {budget.headroom_mb:g} MB "
        f"required headroom -> {budget.available_mb:g} MB available (conf/budget)",
        f"  precision  {verdict.precision}   device {verdict.device}   assumption: {ASSUMPTION}",
        f"  data       {verdict.data}",
        "  measured   one real training fit per model (the model built from its config, its own "
        "configure_optimizers, the run's precision plugin), stopped "
        f"{MEASURE_EXTRA_STEPS} steps after the first step with gradients; MB = MiB",
        "",
    ]
    lines += _model_table(verdict, predicted)
    lines += [""]
    lines += _component_table(verdict, predicted)
    lines += [""]
    lines += _headroom(verdict)
    lines += [""]
    lines += render_bars(verdict)
    notes = _notes(verdict)
    if notes:
        lines += ["", "Notes"] + [f"  - {note}" for note in notes]
    lines += ["", verdict.summary_line()]
    return "\n".join(lines) + "\n"


def _model_table(verdict: CardVerdict, predicted: bool) -> list[str]:
    budget = verdict.budget
    methods = sorted({m.measurement.footprint.method for m in verdict.models})
    head = (
        f"{'model':<9}{'module':<27}{'batch':>7}{'memory MB':>12}{'target MB':>11}"
        f"{'% of budget':>13}{'% of target':>13}  {'verdict':<7}"
    )
    if predicted:
        head += f"{'predicted MB':>14}{'error':>9}"
    lines = [
        f"Per model: measured training footprint against its target and budget {budget.name}'s {budget.total_mb:g} MB",
        head,
        "-" * len(head),
    ]
    for model in verdict.models:
        m = model.measurement
        row = (
            f"{m.model:<9}{m.module:<27}{'-' if m.batch_size is None else m.batch_size:>7}"
            f"{_mb(model.footprint_mb, 12)}{_mb(model.target_mb, 11, 1)}"
            f"{_pct(model.pct_of_budget, 13)}{_pct(model.pct_of_target, 13)}  {'PASS' if model.passed else 'FAIL':<7}"
        )
        if predicted:
            prediction = model.prediction
            row += _mb(None if prediction is None else prediction.total_mb, 14)
            row += _signed_pct(None if prediction is None else prediction.error_pct(m.breakdown.total_training_bytes), 9)
        lines.append(row)
    lines.append("-" * len(head))
    total = (
        f"{'ensemble':<9}{'(all resident at once)':<27}{'':>7}{_mb(verdict.total_mb, 12)}{'':>11}"
        f"{_pct(verdict.pct_of_budget, 13)}{'':>13}  {'PASS' if verdict.headroom_ok else 'FAIL':<7}"
    )
    if predicted:
        total += _mb(to_mb(sum(m.prediction.total_bytes for m in verdict.models if m.prediction is not None)), 14)
    lines.append(total)
    lines += [f"  memory: {method}" for method in methods]
    lines.append("  target: model.memory_target_mb (conf/model); % of budget: memory / budget total")
    if predicted:
        lines.append(
            "  predicted: from the config before the measurement (components below); "
            "error: predicted / measured sum of the components - 1"
        )
    return lines


def _component_table(verdict: CardVerdict, predicted: bool) -> list[str]:
    head = f"{'component MB':<22}" + "".join(f"{name:>13}" for name in COMPONENTS) + f"{'sum':>11}"
    lines = ["Components of each footprint (MB)", head, "-" * len(head)]

    def row(label: str, breakdown: MemoryBreakdown) -> str:
        parts = breakdown.components()
        cells = "".join(_mb(to_mb(parts[name]), 13, 3) for name in COMPONENTS)
        return f"{label:<22}{cells}{_mb(breakdown.total_training_mb, 11, 3)}"

    for model in verdict.models:
        lines.append(row(f"{model.name} measured", model.measurement.breakdown))
        if predicted and model.prediction is not None:
            lines.append(row(f"{model.name} predicted", model.prediction.breakdown))
    lines.append("  measured, each component:")
    lines += [f"    {name}: {COMPONENT_METHODS[name]}" for name in COMPONENTS]
    if predicted:
        lines.append("  predicted (before the measurement, from the config), each component:")
        lines += [f"    {name}: {COMPONENT_PREDICTIONS[name]}" for name in COMPONENTS]
    return lines


def _headroom(verdict: CardVerdict) -> list[str]:
    budget = verdict.budget
    margin = verdict.headroom_left_mb - verdict.required_headroom_mb
    width = 66
    return [
        f"Headroom on budget {budget.name}, assuming {ASSUMPTION}",
        f"  {'budget total (conf/budget total_mb)':<{width}}{_mb(float(budget.total_mb), 11)} MB",
        f"  {f'ensemble: sum of the {len(verdict.models)} measured footprints':<{width}}{_mb(verdict.total_mb, 11)} MB",
        f"  {'headroom left = total - ensemble':<{width}}{_mb(verdict.headroom_left_mb, 11)} MB",
        f"  {'required headroom (conf/budget headroom_mb)':<{width}}{_mb(verdict.required_headroom_mb, 11)} MB",
        f"  {'margin = headroom left - required headroom':<{width}}{_mb(margin, 11)} MB   "
        f"{'PASS' if verdict.headroom_ok else 'FAIL'}",
    ]


def bar(value_mb: float, total_mb: float, available_mb: float, columns: int = BAR_COLUMNS, fill: str = "#") -> str:
    """One bar of ``columns`` cells scaled to ``total_mb``: ``fill`` up to ``available_mb``,
    ``!`` beyond it, ``|`` on the available mark when empty, ``.`` for a value under one
    column, ``>`` at the end when the value exceeds the total."""
    scale = total_mb / columns
    mark = min(columns - 1, round(available_mb / scale))
    filled = min(columns, round(value_mb / scale))
    cells = [" "] * columns
    for i in range(filled):
        cells[i] = "!" if i >= mark else fill
    if filled == 0 and value_mb > 0:
        cells[0] = "."
    if cells[mark] == " ":
        cells[mark] = "|"
    if value_mb > total_mb:
        cells[-1] = ">"
    return "[" + "".join(cells) + "]"


def stacked_bar(parts: list[tuple[str, float]], total_mb: float, available_mb: float, columns: int = BAR_COLUMNS) -> str:
    """A bar stacked from ``(letter, MB)`` parts, each part as many columns as its cumulative
    share rounds to (a part under one column may take none); cells beyond the available mark
    show ``!``."""
    scale = total_mb / columns
    mark = min(columns - 1, round(available_mb / scale))
    cells = [" "] * columns
    start, cumulative = 0, 0.0
    for letter, value in parts:
        cumulative += value
        end = min(columns, round(cumulative / scale))
        for i in range(start, end):
            cells[i] = "!" if i >= mark else letter
        start = max(start, end)
    if cells[mark] == " ":
        cells[mark] = "|"
    if cumulative > total_mb:
        cells[-1] = ">"
    return "[" + "".join(cells) + "]"


def model_letters(verdict: CardVerdict) -> dict[str, str]:
    """A distinct letter per model for the stacked ensemble bar (its first free letter)."""
    letters: dict[str, str] = {}
    for model in verdict.models:
        for char in model.name.upper() + "ABCDEFGHIJKLMNOPQRSTUVWXYZ":
            if char.isalpha() and char not in letters.values():
                letters[model.name] = char
                break
    return letters


def render_bars(verdict: CardVerdict) -> list[str]:
    budget = verdict.budget
    total, available = float(budget.total_mb), float(budget.available_mb)
    letters = model_letters(verdict)
    lines = [
        f"Memory against budget {budget.name}: the bar is its {total:g} MB total, 1 column = {total / BAR_COLUMNS:.2f} MB; "
        f"'|' = available {available:g} MB (total - required headroom), '!' = beyond it, '.' = under one column",
    ]
    for model in verdict.models:
        lines.append(f"{model.name:<9}{bar(model.footprint_mb, total, available)} {_mb(model.footprint_mb, 10)} MB")
    parts = [(letters[m.name], m.footprint_mb) for m in verdict.models]
    lines.append(f"{'ensemble':<9}{stacked_bar(parts, total, available)} {_mb(verdict.total_mb, 10)} MB")
    lines.append("         ensemble letters: " + ", ".join(f"{letter} = {name}" for name, letter in letters.items()))
    return lines


def _notes(verdict: CardVerdict) -> list[str]:
    notes = list(verdict.notes)
    for model in verdict.models:
        notes += [f"{model.name}: {note}" for note in model.measurement.notes]
        if model.prediction is not None:
            notes += [f"{model.name} prediction: {note}" for note in model.prediction.notes]
    return notes


# -- markdown / JSON ---------------------------------------------------------------------
def render_markdown(verdict: CardVerdict) -> str:
    """The printed report in a text block, plus each model's device figures and timings."""
    lines = [
        "# foxhunt memory validate",
        "",
        f"**{verdict.summary_line()}**",
        "",
        "```text",
        render_text(verdict).rstrip("\n"),
        "```",
        "",
        "## Each measuring fit",
        "",
        "| model | steps | seconds | device | precision | figure | MB | how measured |",
        "| --- | ---: | ---: | --- | --- | --- | ---: | --- |",
    ]
    for model in verdict.models:
        m = model.measurement
        for figure in (m.footprint, *m.device_figures):
            lines.append(
                f"| {m.model} | {m.steps} | {m.seconds:.1f} | {m.device} | {m.precision} | {figure.name} | "
                f"{_mb(figure.mb, digits=3)} | {figure.method} |"
            )
    predictions = [m for m in verdict.models if m.prediction is not None]
    if predictions:
        lines += [
            "",
            "## Predictions",
            "",
            "| model | batch key | batch | probe fits (batch: activations MB, model state MB) | predicted MB | measured (sum of components) MB | error | seconds |",
            "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |",
        ]
        for model in predictions:
            p, m = model.prediction, model.measurement
            probes = "; ".join(f"{b}: {to_mb(a):.3f}, {to_mb(s):.3f}, {'-' if t is None else f'{to_mb(t):.3f}'}"
                               for b, a, s, t in p.probes) or "-"  # fmt: skip
            lines.append(
                f"| {p.model} | {p.batch_key or '-'} | {p.batch_size if p.batch_size is not None else '-'} | {probes} | "
                f"{p.total_mb:.3f} | {to_mb(m.breakdown.total_training_bytes):.3f} | "
                f"{_signed_pct(p.error_pct(m.breakdown.total_training_bytes))} | {p.seconds:.1f} |"
            )
    return "\n".join(lines) + "\n"


def to_json(verdict: CardVerdict, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every figure of the report, machine-readable (MB = MiB; bytes exact)."""
    budget = verdict.budget
    models = []
    for model in verdict.models:
        m = model.measurement
        entry: dict[str, Any] = {
            "name": m.model,
            "module": m.module,
            "batch_key": m.batch_key,
            "batch_size": m.batch_size,
            "memory_mb": model.footprint_mb,
            "memory_bytes": m.footprint.bytes,
            "memory_method": m.footprint.method,
            "target_mb": model.target_mb,
            "pct_of_budget": model.pct_of_budget,
            "pct_of_target": model.pct_of_target,
            "verdict": "PASS" if model.passed else "FAIL",
            "components_bytes": m.breakdown.components(),
            "component_methods": {name: COMPONENT_METHODS[name] for name in COMPONENTS},
            "device_figures": [{"name": f.name, "bytes": f.bytes, "mb": f.mb, "method": f.method} for f in m.device_figures],
            "device": m.device,
            "precision": m.precision,
            "steps": m.steps,
            "seconds": m.seconds,
            "notes": list(m.notes),
        }
        if model.prediction is not None:
            p = model.prediction
            entry["predicted"] = {
                "memory_mb": p.total_mb,
                "memory_bytes": p.total_bytes,
                "error_pct": p.error_pct(m.breakdown.total_training_bytes),
                "error_against": "the measured sum of the components",
                "components_bytes": p.breakdown.components(),
                "component_methods": dict(p.methods),
                "probes": [
                    {"batch": b, "activations_bytes": a, "model_state_bytes": s, "allocator_dynamic_bytes": t}
                    for b, a, s, t in p.probes
                ],  # fmt: skip
                "seconds": p.seconds,
                "notes": list(p.notes),
            }
        models.append(entry)
    report = {
        "verdict": "PASS" if verdict.passed else "FAIL",
        "summary": verdict.summary_line(),
        "failures": verdict.failures(),
        "assumption": ASSUMPTION,
        "precision": verdict.precision,
        "device": verdict.device,
        "data": verdict.data,
        "budget": {
            "name": budget.name,
            "kind": budget.kind,
            "total_mb": float(budget.total_mb),
            "headroom_mb": float(budget.headroom_mb),
            "available_mb": budget.available_mb,
        },
        "models": models,
        "ensemble": {
            "memory_mb": verdict.total_mb,
            "memory_bytes": verdict.total_bytes,
            "pct_of_budget": verdict.pct_of_budget,
            "headroom_left_mb": verdict.headroom_left_mb,
            "required_headroom_mb": verdict.required_headroom_mb,
            "verdict": "PASS" if verdict.headroom_ok else "FAIL",
        },
        "notes": _notes(verdict),
    }
    report.update(extra or {})
    return report


# -- PNG ---------------------------------------------------------------------------------
def plot(verdict: CardVerdict, path: str | Path) -> Path:
    """Left: each model's footprint stacked by component, its target (and prediction);
    right: the ensemble stacked by model against the budget's available and total memory."""
    path = Path(path)
    figure = Figure(figsize=FIGURE_SIZE_INCHES, dpi=DPI)
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [1.6, 1]})
    names = [m.name for m in verdict.models]
    for index, model in enumerate(verdict.models):
        start = 0.0
        for name in COMPONENTS:
            width = to_mb(model.measurement.breakdown.components()[name])
            left.barh(index, width, left=start, color=COMPONENT_COLORS[name], label=name if index == 0 else None)
            start += width
        if model.measurement.footprint.bytes != model.measurement.breakdown.total_training_bytes:
            left.plot(
                [model.footprint_mb], [index], marker="o", color="black", label="footprint (device)" if index == 0 else None
            )
        if model.target_mb is not None:
            left.plot([model.target_mb] * 2, [index - 0.4, index + 0.4], color="black", linestyle="--",
                      label="target (model.memory_target_mb)" if index == 0 else None)  # fmt: skip
        if model.prediction is not None:
            left.plot([model.prediction.total_mb], [index], marker="x", color="red", markersize=10,
                      label="predicted" if index == 0 else None)  # fmt: skip
        verdict_text = "PASS" if model.passed else "FAIL"
        left.text(max(model.footprint_mb, model.target_mb or 0.0), index, f"  {model.footprint_mb:.1f} MB {verdict_text}",
                  va="center", fontsize=8)  # fmt: skip
    widest = max(
        [m.footprint_mb for m in verdict.models]
        + [m.target_mb for m in verdict.models if m.target_mb is not None]
        + [m.prediction.total_mb for m in verdict.models if m.prediction is not None]
    )
    left.set_xlim(0, LABEL_ROOM * widest if widest > 0 else 1.0)
    left.set_yticks(range(len(names)), names)
    left.invert_yaxis()
    left.set_xlabel("MB (MiB), measured")
    left.set_title("Each model's training footprint by component, and its target", fontsize=10)
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=5)

    budget = verdict.budget
    start = 0.0
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]
    for index, model in enumerate(verdict.models):
        right.bar(["ensemble"], [model.footprint_mb], bottom=[start], color=colors[index % len(colors)],
                  label=f"{model.name} {model.footprint_mb:.1f} MB")  # fmt: skip
        start += model.footprint_mb
    right.axhline(
        budget.available_mb, color="red", linestyle="--", label=f"available {budget.available_mb:g} MB (total - headroom)"
    )
    right.axhline(
        float(budget.total_mb), color="black", linestyle=":", label=f"budget {budget.name} total {budget.total_mb:g} MB"
    )
    right.set_ylim(0, max(float(budget.total_mb), verdict.total_mb) * 1.05)
    right.set_ylabel("MB (MiB)")
    right.set_title(
        f"All resident at once: {verdict.total_mb:.1f} MB, headroom left {verdict.headroom_left_mb:.1f} MB", fontsize=10
    )
    right.legend(fontsize=7, loc="upper right")
    figure.suptitle(
        f"foxhunt memory validate ({verdict.precision}, {verdict.device}): {'PASS' if verdict.passed else 'FAIL'}", fontsize=11
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


def write_all(verdict: CardVerdict, directory: str | Path, extra: dict[str, Any] | None = None) -> list[Path]:
    """Write ``memory_validate.md``, ``.json`` and ``.png`` into ``directory``; return them."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    markdown = directory / MARKDOWN_NAME
    markdown.write_text(render_markdown(verdict))
    data = directory / JSON_NAME
    data.write_text(json.dumps(to_json(verdict, extra), indent=2) + "\n")
    return [markdown, data, plot(verdict, directory / PNG_NAME)]
