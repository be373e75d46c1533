"""Rich renderings of jobs: the status table, the list, and the live watch view.

Each state has its own colour everywhere (RUNNING cyan, FINISHED green, FAILED red, KILLED
yellow, STALE magenta). The watch view draws one bar per cell and an overall bar weighted by
each cell's expected cost (planned batches x its model's ``expected_seconds_per_batch``), so
a Mamba-2 cell counts for what it costs rather than as one cell among four; its ETA is the
job's own pace so far (elapsed x remaining / done, in those weights), which needs no absolute
calibration of the weights. Functions of the job views: no I/O here but the checkpoint lookup.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from rich.console import Group, JustifyMethod, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from foxhunt.errors import one_line
from foxhunt.jobs.listing import Page
from foxhunt.jobs.views import METRIC_LOSS, METRIC_PEAK_MB, METRIC_SHARPE, Job, JobCell, resumable_checkpoint_of
from foxhunt.printable import shown
from foxhunt.runs.cell import CellResult
from foxhunt.runs.resume import skip_note
from foxhunt.runs.status import Status
from foxhunt.runs.tags import Tag

STATE_STYLES: dict[str, str] = {
    Status.RUNNING: "bold cyan",
    Status.FINISHED: "bold green",
    Status.FAILED: "bold red",
    Status.KILLED: "bold yellow",
    Status.STALE: "bold magenta",
    Status.STARTING: "cyan",
    Status.SKIPPED: "green",
    Status.PENDING: "dim",
}
BAR_WIDTH = 28  # characters of a progress bar, at most
BAR_MIN_WIDTH = 6
ERROR_WIDTH = 200  # characters of a failure's error text shown in the status table


def state_text(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state, ""))


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def fmt_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S") if ms else "-"


def fmt_number(value: float | None, digits: int = 4) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:.{digits}g}"


def fmt_mb(value: float | None, unit: bool = True) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:,.0f} MB" if unit else f"{value:,.0f}"


def short_path(path) -> str:
    """A path relative to the current folder when it lies inside it."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def eta_s(elapsed_s: float, fraction: float) -> float | None:
    """Remaining time at the pace so far; None before there is a pace to extrapolate."""
    if fraction <= 0 or fraction >= 1 or elapsed_s <= 0:
        return None
    return elapsed_s * (1 - fraction) / fraction


def counts_text(job: Job) -> Text:
    text = Text()
    order = [Status.RUNNING, Status.FINISHED, Status.SKIPPED, Status.FAILED, Status.KILLED, Status.STALE, Status.PENDING]
    counts = job.counts()
    for state in order + sorted(set(counts) - set(order)):
        if counts.get(state):
            if text:
                text.append(" ")
            text.append(f"{counts[state]} {state.lower()}", style=STATE_STYLES.get(state, ""))
    return text


# --------------------------------------------------------------------------------------------
# status
# --------------------------------------------------------------------------------------------
def job_header(job: Job, now_ms: int) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("job", Text.assemble(shown(job.job_id, style="bold"), "  ", state_text(job.state)))
    if job.parent is not None:
        grid.add_row("parent run", shown(f"{job.parent.run_id} (experiment {job.parent.experiment})"))
    grid.add_row("started", f"{fmt_time(job.start_ms)}   duration {fmt_duration(job.duration_s(now_ms))}")
    if job.command:
        grid.add_row("command", shown(job.command))
    if job.pid:
        grid.add_row("process", shown(f"pid {job.pid} on {job.host or '?'}"))
    if job.log:
        grid.add_row("log", shown(job.log))
    if job.error:  # its end: a launch's error is its log's last lines, the header first (found by a helper)
        grid.add_row("error", shown(one_line(job.error, ERROR_WIDTH, keep_end=True), style="red"))
    return grid


def status_table(job: Job, now_ms: int) -> Table:
    table = Table(title=Text.assemble("cells of job ", shown(job.job_id)), title_justify="left", expand=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("cell", "left"), ("state", "left"), ("step", "right"), ("progress", "right"), ("loss", "right"),
        ("val/sharpe", "right"), ("peak mem", "right"), ("duration", "right"), ("error / checkpoint", "left"),
    )  # fmt: skip
    for name, justify in columns:
        table.add_column(name, justify=justify, overflow="fold")
    for cell in job.cells():
        run = cell.run
        note = Text()
        checkpoint = resumable_checkpoint_of(cell)
        if run is not None and run.tags.get(Tag.ERROR):
            note = shown(run.tags[Tag.ERROR][:ERROR_WIDTH], style="red")
        elif checkpoint is not None:
            note = shown(short_path(checkpoint.path) if checkpoint.path else str(checkpoint), style="dim")
        elif cell.skipped is not None and run is None:
            note = shown(skipped_note(cell.skipped), style="dim")
        table.add_row(
            shown(cell.name),
            state_text(cell.state),
            "-" if cell.step() is None else str(cell.step()),
            f"{cell.fraction():.0%}" if cell.state != Status.PENDING else "-",
            fmt_number(cell.metric(METRIC_LOSS)),
            fmt_number(cell.metric(METRIC_SHARPE)),
            fmt_mb(cell.metric(METRIC_PEAK_MB)),
            fmt_duration(cell.duration_s(now_ms)),
            note,
        )
    return table


def skipped_note(skipped: CellResult) -> str:
    """Where a skipped cell's result is: the earlier FINISHED run (its metrics are that run's)."""
    return skip_note(skipped.run_id)


def status_view(job: Job, now_ms: int, log_excerpt: str = "") -> RenderableType:
    parts: list[RenderableType] = [job_header(job, now_ms), status_table(job, now_ms)]
    if log_excerpt:
        parts.append(Text("\n").join(shown(line, style="dim") for line in log_excerpt.splitlines()))
    return Group(*parts)


# --------------------------------------------------------------------------------------------
# list
# --------------------------------------------------------------------------------------------
def list_table(page: Page, now_ms: int) -> RenderableType:
    table = Table(expand=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("job", "left"), ("state", "left"), ("started", "left"), ("duration", "right"), ("cells", "left"),
        ("models", "left"), ("assets", "left"), ("best val/sharpe", "right"),
    )  # fmt: skip
    for name, justify in columns:
        table.add_column(name, justify=justify)
    for job in page.jobs:
        table.add_row(
            shown(job.job_id),
            state_text(job.state),
            fmt_time(job.start_ms),
            fmt_duration(job.duration_s(now_ms)),
            counts_text(job),
            shown(",".join(job.models) or "-"),
            shown(",".join(job.assets) or "-"),
            fmt_number(job.best_sharpe()),
        )
    jobs = f"{page.total} job{'s' if page.total != 1 else ''}"
    past = page.page > page.pages  # said, not shown as "page 99/1"
    footer = Text(f"page {page.page}: past the last page ({page.pages}), {jobs}" if past else f"page {page.page}/{page.pages}, {jobs}",
                  style="dim")  # fmt: skip
    return Group(table, footer)


# --------------------------------------------------------------------------------------------
# watch
# --------------------------------------------------------------------------------------------
def _bar(fraction: float, state: str) -> ProgressBar:
    styles: dict[str, str] = {Status.FAILED: "red", Status.KILLED: "yellow", Status.STALE: "magenta"}
    style = styles.get(state)
    bar = ProgressBar(total=1.0, completed=fraction)  # as wide as its column lets it
    if style:
        bar.complete_style = style
        bar.finished_style = style
    return bar


def _cell_eta(cell: JobCell, now_ms: int) -> str:
    if cell.run is None or cell.state != Status.RUNNING:
        return "-"
    return fmt_duration(eta_s(cell.run.duration_s(now_ms), cell.fraction()))


def watch_view(job: Job, now_ms: int) -> RenderableType:
    table = Table(expand=False, title_justify="left",
                  title=Text.assemble("job ", shown(job.job_id, style="bold"), "  ", state_text(job.state)))  # fmt: skip
    for name in ("cell", "state"):
        table.add_column(name, justify="left", no_wrap=True)
    table.add_column("progress", min_width=BAR_MIN_WIDTH, max_width=BAR_WIDTH)  # shrinks on a narrow terminal
    for name in ("", "step", "loss", "peak MB", "eta"):
        table.add_column(name, justify="right", no_wrap=True)
    for cell in job.cells():
        table.add_row(
            shown(cell.name),
            state_text(cell.state),
            _bar(cell.fraction(), cell.state),
            f"{cell.fraction():.0%}",
            "-" if cell.step() is None else str(cell.step()),
            fmt_number(cell.metric(METRIC_LOSS)),
            fmt_mb(cell.metric(METRIC_PEAK_MB), unit=False),
            _cell_eta(cell, now_ms),
        )
    fraction = job.fraction()
    elapsed = job.duration_s(now_ms)
    eta = eta_s(elapsed, fraction) if job.state in (Status.RUNNING, Status.STARTING) else None
    overall = Table.grid(padding=(0, 2))
    overall.add_column(no_wrap=True)
    overall.add_column(min_width=BAR_MIN_WIDTH, max_width=BAR_WIDTH)
    overall.add_row(
        Text("overall", style="bold"),
        _bar(fraction, job.state),
        f"{fraction:.0%}",
        f"elapsed {fmt_duration(elapsed)}",
        f"eta {fmt_duration(eta)}",
    )
    return Group(table, overall)
