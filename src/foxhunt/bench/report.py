"""The benchmark's report: one row per figure, written as ``benchmark.json`` and ``benchmark.md``.

A :class:`Row` holds a comparison measured in one run: foxhunt's median, the reference's
median (a peer library, the bare loop, or nothing for an absolute latency), the figure judged
against the goal (the median of paired ratios, or the latency itself), the goal, and the
CPU-time ratio where one was taken (robust to other processes on the machine at 1 thread).

A ratio row also holds the confidence interval of its median (:func:`foxhunt.bench.measure.paired_ratios`),
and the report judges a goal twice: ``met`` by the median, ``met_past_noise`` by the whole
interval. A goal is met past the noise when the interval lies on the goal's side; a median at the
goal with an interval across it is a lead the run-to-run noise can hide, and the report says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from foxhunt import json_output

if TYPE_CHECKING:  # an annotation only: reading and writing reports needs no torch
    from foxhunt.bench.measure import PairedRatio

SECTION_TITLES = {
    "rl": "1. RL training throughput (env-steps/s)",
    "tft": "2. TFT training throughput and peak memory",
    "latency": "3. Batch-1 CPU inference latency",
    "overhead": "4. Framework overhead: an epoch through foxhunt-train against a plain loop",
    "ensemble": "5. The streaming ensemble: per-bar latency of each member and of the whole ensemble",
    "system": "6. The whole chain: a planted pattern found, none found in a random walk (walk-forward, through the CLI)",
    "checkpoint": "7. Exact resume's cost: checkpoint size and the writes' share of a fit at the default cadence",
    "roll": "8. The rolling loop: a pattern that changes sign, a rolled ensemble against a frozen one",
}


@dataclass
class Row:
    section: str
    name: str  # what is compared, e.g. "PPO vs Stable-Baselines3"
    threads: int
    unit: str  # unit of foxhunt / reference
    foxhunt: float
    reference: float | None  # the other side's median (None: an absolute figure)
    figure: float  # what the goal judges: a paired ratio, or the value itself
    figure_kind: str  # "ratio" | "value"
    goal_op: str | None  # ">=" | "<=" | None (information only)
    goal: float | None
    cpu_figure: float | None = None  # the same ratio on process CPU time
    note: str = ""
    samples: dict = field(default_factory=dict)
    # a ratio's confidence interval of its median over `pairs` paired repeats (None: not a paired
    # ratio; NaN ends: too few pairs for `confidence`)
    figure_low: float | None = None
    figure_high: float | None = None
    confidence: float | None = None
    pairs: int | None = None

    @classmethod
    def paired(cls, ratio: PairedRatio, **fields: Any) -> Row:
        """A ratio row whose figure is ``ratio``'s median, with its interval."""
        return cls(figure=ratio.median, figure_kind="ratio", figure_low=ratio.low, figure_high=ratio.high,
                   confidence=ratio.confidence, pairs=ratio.pairs, **fields)  # fmt: skip

    @property
    def met(self) -> bool | None:
        """The goal judged by the median (None: no goal, or no figure)."""
        if self.goal_op is None or self.goal is None or not math.isfinite(self.figure):
            return None
        return self._meets(self.figure)

    @property
    def met_past_noise(self) -> bool | None:
        """The goal judged by the whole confidence interval: True where every value in it meets
        the goal, False where some value does not; None without a goal or a finite interval."""
        if self.met is None or not self.has_interval:
            return None
        return self._meets(self.figure_low) and self._meets(self.figure_high)  # type: ignore[arg-type]

    @property
    def has_interval(self) -> bool:
        return all(v is not None and math.isfinite(v) for v in (self.figure_low, self.figure_high))

    def _meets(self, value: float) -> bool:
        assert self.goal is not None
        return value >= self.goal if self.goal_op == ">=" else value <= self.goal

    def to_dict(self) -> dict:
        return {**asdict(self), "met": self.met, "met_past_noise": self.met_past_noise}


#: What ``Row.to_dict`` adds to the fields (dropped when a row is read back).
DERIVED_KEYS = ("met", "met_past_noise")


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def _goal_text(row: Row) -> str:
    if row.goal_op is None:
        return "-"
    unit = "x" if row.figure_kind == "ratio" else f" {row.unit}"
    return f"{row.goal_op} {_fmt(row.goal)}{unit}"


def _met_text(row: Row) -> str:
    """yes (past the noise where an interval was measured), within noise, or no."""
    if row.met is None:
        return "-"
    if not row.met:
        return "**no**"
    if row.met_past_noise is False:
        return "within noise"
    if row.pairs is not None and not row.has_interval:
        return f"yes ({row.pairs} pairs: noise not bounded)"
    return "yes"


def _interval_text(row: Row) -> str:
    if row.pairs is None:
        return "-"
    if not row.has_interval:
        return f"- ({row.pairs} pairs)"
    return f"{_fmt(row.figure_low)}-{_fmt(row.figure_high)}x ({row.confidence:.0%}, {row.pairs} pairs)"


def markdown(report: dict) -> str:
    """The report as markdown: machine, command, load, then one table per section."""
    meta = report["meta"]
    lines = [
        "# foxhunt benchmark",
        "",
        f"- machine: {meta['machine']['cpu']}, {meta['machine']['logical_cpus']} logical CPUs; "
        f"torch {meta['machine']['torch']}, lightning {meta['machine']['lightning']}, "
        f"Python {meta['machine']['python']}",
        f"- command: `{meta['command']}`",
        f"- load average (1, 5, 15 min): before {meta['load_before']}, after {meta['load_after']}",
        f"- started {meta['started']}, took {meta['seconds']:.0f} s; settings: {meta['settings_file']}"
        + (" (--quick)" if meta.get("quick") else ""),
        *_load_warning(meta),
        "- `figure`: for a comparison, the median over interleaved repeats (A, B, A, B, ...) of "
        "foxhunt / reference measured back to back; for a latency, the percentile itself. `cpu`: the "
        "same figure on process CPU time (what the work costs when no other process takes the core; "
        "robust to load at 1 thread); `interval`: the distribution-free confidence interval of the "
        "median of paired ratios (order statistics; 5 pairs at least for 90%); `met`: yes where the "
        "median meets the goal and the whole interval does too, `within noise` where the median meets "
        "it and the interval crosses it (a lead the run-to-run noise can hide)",
        "",
    ]
    rows = [Row(**{k: v for k, v in r.items() if k not in DERIVED_KEYS}) for r in report["rows"]]
    for section, title in SECTION_TITLES.items():
        section_rows = [r for r in rows if r.section == section]
        if not section_rows and section not in report.get("skipped", {}):
            continue
        lines += [f"## {title}", ""]
        if section in report.get("skipped", {}):
            lines += [f"Skipped: {report['skipped'][section]}", ""]
        if section_rows:
            lines += [
                "| comparison | threads | foxhunt | reference | unit | figure | interval | cpu | goal | met |",
                "|---|---|---|---|---|---|---|---|---|---|",
            ]
            for r in section_rows:
                figure = f"{_fmt(r.figure)}x" if r.figure_kind == "ratio" else _fmt(r.figure)
                lines.append(
                    f"| {r.name} | {r.threads} | {_fmt(r.foxhunt)} | {_fmt(r.reference)} | {r.unit} | "
                    f"{figure} | {_interval_text(r)} | {_fmt(r.cpu_figure)} | {_goal_text(r)} | {_met_text(r)} |"
                )
            notes = [f"- {r.name} ({r.threads} thr): {r.note}" for r in section_rows if r.note]
            if notes:
                lines += ["", *dict.fromkeys(notes)]
        for note in report.get("notes", {}).get(section, []):
            lines.append(f"- {note}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _load_warning(meta: dict) -> list[str]:
    """A line when other processes kept the machine busy: multi-thread figures then mostly
    measure waiting for cores."""
    cpus = meta["machine"].get("logical_cpus") or 1
    peak = max([*meta.get("load_before", []), *meta.get("load_after", [])] or [0.0])
    if peak <= cpus / 2:
        return []
    return [
        f"- **loaded machine**: load average up to {peak:g} on {cpus} CPUs during the run; figures at more "
        "than one thread are dominated by waiting for a core (their CPU-time column less so)"
    ]


def write(report: dict, output_dir: Path) -> tuple[Path, Path]:
    """Write ``benchmark.json`` and ``benchmark.md`` into ``output_dir``; return both paths."""
    output_dir.mkdir(parents=True, exist_ok=True)
    json_path = output_dir / "benchmark.json"
    md_path = output_dir / "benchmark.md"
    json_path.write_text(json_output.dumps(report, indent=2, default=_json_default) + "\n")
    md_path.write_text(markdown(report))
    return json_path, md_path


def _json_default(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return str(value)
