"""Rich renderings of jobs: each state its own colour, durations and numbers as the tables
show them, the ETA at the job's own pace, the state counts in a fixed order, and the watch
view's bars."""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from foxhunt.jobs.display import (
    STATE_STYLES,
    counts_text,
    eta_s,
    fmt_duration,
    fmt_mb,
    fmt_number,
    list_table,
    status_view,
    watch_view,
)
from foxhunt.jobs.listing import paginate
from foxhunt.jobs.views import find_job, load_jobs
from jobs_store import NOW_MS

DURATION = re.compile(r"^(?:(\d+)h(\d\d)m|(\d+)m(\d\d)s|(\d+)s)$")


def shown(renderable, width=200) -> str:
    console = Console(file=io.StringIO(), width=width)
    console.print(renderable)
    return console.file.getvalue()


def test_each_state_has_its_own_colour(jobs_store):
    styles = [STATE_STYLES[s] for s in ("RUNNING", "FINISHED", "FAILED", "KILLED", "STALE")]
    assert len(set(styles)) == 5
    console = Console(record=True, force_terminal=True, color_system="standard", width=200)
    jobs = load_jobs(jobs_store.uri)
    console.print(list_table(paginate(jobs, 10, 1), NOW_MS))
    for job_id in ("aaaa2222", "dddd5555"):
        console.print(status_view(find_job(jobs_store.uri, job_id), NOW_MS))
    text = console.export_text(styles=True)
    codes = {"RUNNING": "1;36", "FINISHED": "1;32", "FAILED": "1;31", "KILLED": "1;33", "STALE": "1;35"}
    for state, code in codes.items():
        assert f"\x1b[{code}m{state}" in text, state


@given(seconds=st.floats(0, 10**7, allow_nan=False))
def test_a_duration_reads_back_to_the_second_or_the_minute_past_an_hour(seconds):
    text = fmt_duration(seconds)
    hours, minutes, m, s, only_s = DURATION.match(text).groups()
    whole = int(round(seconds))
    if hours is not None:
        assert (int(hours), int(minutes)) == divmod(whole // 60, 60) and int(hours) >= 1
    elif m is not None:
        assert (int(m), int(s)) == divmod(whole, 60) and 1 <= int(m) < 60
    else:
        assert int(only_s) == whole < 60
    assert fmt_duration(None) == "-"


@given(elapsed=st.floats(1e-3, 1e6), fraction=st.floats(1e-6, 1 - 1e-6))
def test_the_eta_is_the_remaining_work_at_the_pace_so_far(elapsed, fraction):
    eta = eta_s(elapsed, fraction)
    assert eta >= 0
    assert (elapsed + eta) * fraction == pytest.approx(elapsed, rel=1e-9)  # the same pace to the end


def test_no_eta_before_there_is_a_pace_or_once_done():
    assert [eta_s(0, 0.5), eta_s(10, 0), eta_s(10, 1), eta_s(10, 1.2), eta_s(-1, 0.5)] == [None] * 5


def test_missing_figures_are_a_dash():
    assert [fmt_number(None), fmt_number(float("nan")), fmt_mb(None), fmt_mb(float("nan"))] == ["-"] * 4
    assert (fmt_number(1.23456789), fmt_number(0.5, 2), fmt_mb(1536.4), fmt_mb(1536.4, unit=False)) == (
        "1.235",
        "0.5",
        "1,536 MB",
        "1,536",
    )


def test_counts_are_in_a_fixed_order_and_zero_counts_left_out(jobs):
    assert str(counts_text(jobs["aaaa2222"])) == "1 finished 1 failed"
    assert str(counts_text(jobs["cccc4444"])) == "1 running 1 pending"


def test_the_watch_view_has_a_row_per_cell_and_an_eta_at_the_jobs_pace_only_while_running(jobs):
    later = NOW_MS + 600_000  # the running job (started at NOW_MS) 10 min in
    rows = [[part.strip() for part in line.split("│")[1:-1]] for line in shown(watch_view(jobs["cccc4444"], later)).splitlines()
            if line.startswith("│")]  # fmt: skip
    assert [(r[0], r[1], r[3], r[-1]) for r in rows] == [
        ("tft-zn-fp32", "RUNNING", "50%", "10m00s"),
        ("dqn-zn-fp32", "PENDING", "0%", "-"),
    ]
    overall = shown(watch_view(jobs["cccc4444"], later)).splitlines()[-1].split()
    # tft (weight 4) half done, dqn (weight 1) not started: 40% in 10 min, 15 min to go at that pace
    assert overall[0] == "overall" and overall[-5:] == ["40%", "elapsed", "10m00s", "eta", "15m00s"]
    assert shown(watch_view(jobs["aaaa1111"], later)).splitlines()[-1].split()[-5:] == ["100%", "elapsed", "2h00m", "eta", "-"]


def test_a_jobs_error_row_keeps_the_end_of_its_log_tail():
    """A launch that failed is tagged with its log's last lines, the "=== start" header first:
    the row showed its first 200 characters, and the error line itself was cut off (found by a
    helper probing the job CLI)."""
    from types import SimpleNamespace

    from foxhunt.jobs.display import job_header

    error = " | ".join(["=== start 2026-12-05 09:30:00 foxhunt-train -m " + "x " * 80, "foxhunt-train: cannot prepare the sweep: "
                        "config error: hydra.sweeper.pruner=bogus: must be one of none, median, hyperband"])  # fmt: skip
    job = SimpleNamespace(job_id="j1", state="FAILED", parent=None, start_ms=NOW_MS, duration_s=lambda now: 1.0, command="",
                          pid=None, host="", log="", error=error)  # fmt: skip
    text = shown(job_header(job, NOW_MS), width=400)
    assert "hydra.sweeper.pruner=bogus: must be one of none, median, hyperband" in text and "=== start" not in text
