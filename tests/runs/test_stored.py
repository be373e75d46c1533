"""A run as read from the store (``StoredRun``): its parent and job, its metrics, when it was
last seen working and how long it ran."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from foxhunt.runs.cell import CellKey
from foxhunt.runs.stored import Metric, StoredRun

T0 = 1_760_000_000_000
stamps = st.integers(min_value=0, max_value=10**9)


def stored(status="RUNNING", start=T0, end=None, tags=None, metrics=None, state=""):
    return StoredRun("r1", "dqn-es-fp32", "foxhunt", status, start, end, dict(tags or {}), dict(metrics or {}), state=state)


def test_parent_job_and_cell_come_from_the_tags():
    run = stored(tags={"mlflow.parentRunId": "p1", "job_id": "aaaa1111", "model": "dqn", "asset": "es",
                       "precision": "fp32", "seed": "7", "config_hash": "abc"})  # fmt: skip
    assert (run.parent_id, run.job_id) == ("p1", "aaaa1111")
    assert run.cell_key() == CellKey("dqn", "es", "fp32", "7", "abc")
    bare = stored(tags={"mlflow.parentRunId": ""})
    assert (bare.parent_id, bare.job_id) == (None, "")  # an empty parent tag is no parent


def test_metric_is_the_latest_value_or_none():
    run = stored(metrics={"val/sharpe": Metric(1.5, 10, T0), "progress": Metric(0.25, 10, T0)})
    assert run.metric("val/sharpe") == 1.5 and run.metric("test/sharpe") is None
    assert run.metric_values() == {"val/sharpe": 1.5, "progress": 0.25}


@given(offsets=st.lists(st.one_of(st.none(), stamps), max_size=5), end=st.one_of(st.none(), stamps))
def test_last_seen_is_the_end_else_the_newest_metric_never_before_the_start(offsets, end):
    metrics = {f"m{i}": Metric(0.0, i, None if o is None else T0 + o) for i, o in enumerate(offsets)}
    run = stored(end=None if end is None else T0 + end, metrics=metrics)
    written = [T0 + o for o in offsets if o is not None]
    assert run.last_seen_ms() == (T0 + end if end is not None else max([T0, *written]))


@settings(max_examples=60)
@given(length=stamps, later=stamps, seen=stamps)
def test_duration_of_an_ended_run_is_fixed_a_running_one_grows_and_a_stale_one_stops(length, later, seen):
    now = T0 + length
    ended = stored(status="FINISHED", end=T0 + length)
    assert ended.duration_s(now) == ended.duration_s(now + later) == length / 1000
    running = stored(metrics={"progress": Metric(0.5, 1, T0 + seen)}, state="RUNNING")
    assert running.duration_s(now + later) == (length + later) / 1000
    stale = stored(metrics={"progress": Metric(0.5, 1, T0 + seen)}, state="STALE")
    assert stale.duration_s(now + later) == seen / 1000  # its last sign of life, not now


def test_a_clock_behind_the_start_gives_no_negative_duration():
    assert stored().duration_s(T0 - 5_000) == 0.0
