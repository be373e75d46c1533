"""``foxhunt train list``: filters, sorting and pages of jobs, ``--since`` ages and dates, and
the JSON form of a job and its cells."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from foxhunt.jobs.listing import filter_jobs, job_to_dict, paginate, parse_since, sort_jobs
from jobs_store import HOUR_MS, NOW_MS

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def test_filters_sorting_and_pages(jobs, jobs_store):
    all_jobs = list(jobs.values())
    ids = lambda js: [j.job_id for j in js]  # noqa: E731
    byhand = jobs_store.runs["byhand"]
    assert ids(filter_jobs(all_jobs, states=["stale"])) == ["dddd5555"]
    assert sorted(ids(filter_jobs(all_jobs, models=["tft"], assets=["es"]))) == sorted(["aaaa1111", byhand])
    assert ids(filter_jobs(all_jobs, models=["ppo"], states=["FAILED", "KILLED"])) == ["aaaa2222"]
    recent = filter_jobs(all_jobs, since_ms=NOW_MS - 3 * HOUR_MS)
    assert sorted(ids(recent)) == ["bbbb3333", "cccc4444", "dddd5555", "eeee6666"]

    newest = sort_jobs(all_jobs, "started", NOW_MS)
    assert ids(newest)[-1] == "aaaa1111" and ids(sort_jobs(all_jobs, "started", NOW_MS, reverse=True))[0] == "aaaa1111"
    assert ids(sort_jobs(all_jobs, "sharpe", NOW_MS))[:2] == ["aaaa1111", "aaaa2222"]
    # the hand-started sweep has been RUNNING for 48 h (on another host), the finished job took 2 h
    assert ids(sort_jobs(all_jobs, "duration", NOW_MS))[:2] == [byhand, "aaaa1111"]
    with pytest.raises(ValueError, match="--sort 'pnl'"):
        sort_jobs(all_jobs, "pnl", NOW_MS)

    pages = [paginate(newest, 3, page) for page in (1, 2, 3, 4)]
    assert [len(p.jobs) for p in pages] == [3, 3, 1, 0]
    assert pages[0].pages == 3 and pages[0].total == 7
    assert sum((ids(p.jobs) for p in pages), []) == ids(newest)


def test_since_accepts_ages_and_dates():
    now = NOW
    assert parse_since("2h", now) == int((now - timedelta(hours=2)).timestamp() * 1000)
    assert parse_since("1w", now) == int((now - timedelta(days=7)).timestamp() * 1000)
    midnight = datetime(2026, 11, 28, tzinfo=timezone.utc)
    assert parse_since("2026-11-28T00:00+00:00", now) == int(midnight.timestamp() * 1000)
    with pytest.raises(ValueError, match="expected an age"):
        parse_since("yesterday", now)
    assert parse_since("99999999999d", now) == 0  # older than any date: every job (an OverflowError traceback before)


def test_json_carries_cells_errors_and_checkpoints(jobs, tmp_path):
    data = job_to_dict(jobs["aaaa2222"], NOW_MS)
    json.dumps(data)  # serializable
    assert data["state"] == "FAILED" and data["counts"] == {"FINISHED": 1, "FAILED": 1}
    failed = [c for c in data["cells"] if c["state"] == "FAILED"][0]
    assert failed["error"] == "ValueError: loss is NaN at step 30" and failed["step"] == 30


@given(amount=st.integers(0, 10_000), unit=st.sampled_from(sorted(UNIT_S)), spaced=st.booleans(), upper=st.booleans())
def test_an_age_is_that_long_before_now(amount, unit, spaced, upper):
    text = f"{amount}{' ' if spaced else ''}{unit.upper() if upper else unit}"
    assert parse_since(text, NOW) == int((NOW - timedelta(seconds=amount * UNIT_S[unit])).timestamp() * 1000)


def test_a_date_without_a_zone_is_local_time():
    local = datetime(2026, 11, 28, 9, 30).astimezone()
    assert parse_since("2026-11-28T09:30", NOW) == int(local.timestamp() * 1000)


@given(count=st.integers(0, 40), limit=st.integers(1, 12))
def test_pages_cover_every_job_once_in_order(count, limit):
    jobs = list(range(count))
    first = paginate(jobs, limit, 1)
    assert first.total == count and first.pages == max(1, -(-count // limit))
    pages = [paginate(jobs, limit, page) for page in range(1, first.pages + 2)]
    assert sum((p.jobs for p in pages), []) == jobs and pages[-1].jobs == []  # a page past the end is empty
    assert all(len(p.jobs) == limit for p in pages[: first.pages - 1])


@pytest.mark.parametrize("limit, page", [(0, 1), (3, 0), (-1, -1)])
def test_a_limit_or_page_below_one_is_refused(limit, page):
    with pytest.raises(ValueError, match="both must be >= 1"):
        paginate([1, 2], limit, page)


def test_jobs_without_a_sharpe_go_last_either_way(jobs):
    all_jobs = list(jobs.values())
    for reverse in (False, True):
        ordered = sort_jobs(all_jobs, "sharpe", NOW_MS, reverse=reverse)
        scored = [j.best_sharpe() for j in ordered if j.best_sharpe() is not None]
        assert scored == sorted(scored, reverse=not reverse) and len(scored) == 2
        assert all(j.best_sharpe() is None for j in ordered[len(scored) :])
