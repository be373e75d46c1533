"""``foxhunt train list``: filters, sorting and pages of jobs, and their JSON form.

Pure functions of :class:`foxhunt.jobs.views.Job` lists; no store access, no heavy import.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from foxhunt.errors import ConfigError
from foxhunt.jobs.views import METRIC_LOSS, METRIC_PEAK_MB, METRIC_SHARPE, Job, JobCell, iso_time, resumable_checkpoint_of
from foxhunt.runs.tags import Tag

SORT_KEYS = ("started", "duration", "sharpe")
_SINCE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: datetime | None = None) -> int:
    """``30m``, ``2h``, ``7d``, ``1w`` ago, or an ISO date/time (local time unless it says
    otherwise) -> epoch milliseconds. Raises ValueError with the accepted forms."""
    now = now or datetime.now(timezone.utc)
    match = _SINCE.match(text.strip().lower())
    if match:
        try:
            moment = now - timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])
        except OverflowError:  # before year 1: every job is newer
            return 0
    else:
        try:
            moment = datetime.fromisoformat(text.strip())
        except ValueError:
            raise ValueError(
                f"--since {text!r}: expected an age (30m, 2h, 7d, 1w) or an ISO date/time (2026-11-29, 2026-11-29T14:00)"
            ) from None
        if moment.tzinfo is None:
            moment = moment.astimezone()  # local time
    return int(moment.timestamp() * 1000)


def filter_jobs(
    jobs: list[Job],
    states: Iterable[str] = (),
    models: Iterable[str] = (),
    assets: Iterable[str] = (),
    since_ms: int | None = None,
) -> list[Job]:
    """Jobs in any of ``states`` that ran any of ``models`` on any of ``assets``, started at or
    after ``since_ms`` (each filter ignored when empty)."""
    states, models, assets = {s.upper() for s in states}, {m.lower() for m in models}, {a.lower() for a in assets}
    kept = []
    for job in jobs:
        if states and job.state not in states:
            continue
        if models and not models & set(job.models):
            continue
        if assets and not assets & set(job.assets):
            continue
        if since_ms is not None and job.start_ms < since_ms:
            continue
        kept.append(job)
    return kept


def sort_jobs(jobs: list[Job], key: str, now_ms: int, reverse: bool = False) -> list[Job]:
    """Newest, longest or best (``val/sharpe`` of the best cell) first; ``reverse`` flips it.
    Jobs without a Sharpe ratio go last either way."""
    if key not in SORT_KEYS:
        raise ValueError(f"--sort {key!r}: expected one of {', '.join(SORT_KEYS)}")
    if key == "sharpe":
        scored = [(sharpe, j) for j in jobs if (sharpe := j.best_sharpe()) is not None]
        unscored = [j for j in jobs if j.best_sharpe() is None]
        return [j for _, j in sorted(scored, key=lambda sj: sj[0], reverse=not reverse)] + sorted(
            unscored, key=lambda j: j.start_ms, reverse=True
        )
    value = (lambda j: j.start_ms) if key == "started" else (lambda j: j.duration_s(now_ms))
    return sorted(jobs, key=value, reverse=not reverse)


@dataclass
class Page:
    jobs: list[Job]
    page: int
    pages: int
    total: int


def paginate(jobs: list[Job], limit: int, page: int) -> Page:
    """Page ``page`` (from 1) of ``limit`` jobs; a page past the end is empty."""
    if limit < 1 or page < 1:
        raise ValueError(f"--limit {limit} --page {page}: both must be >= 1")
    pages = max(1, -(-len(jobs) // limit))
    return Page(jobs[(page - 1) * limit : page * limit], page, pages, len(jobs))


def job_to_dict(job: Job, now_ms: int) -> dict[str, Any]:
    """A job for ``--json``: what the tables show, with run ids and raw numbers."""
    return {
        "job_id": job.job_id,
        "state": job.state,
        "parent_run_id": job.parent.run_id if job.parent else None,
        "experiment": job.parent.experiment if job.parent else (job.runs[0].experiment if job.runs else None),
        "started": iso_time(job.start_ms),
        "duration_s": round(job.duration_s(now_ms), 3),
        "progress": round(job.fraction(), 4),
        "models": job.models,
        "assets": job.assets,
        "best_val_sharpe": job.best_sharpe(),
        "counts": job.counts(),
        "command": job.command,
        "overrides": _overrides(job),
        "pid": job.pid,
        "host": job.host,
        "error": job.error or None,
        "cells": [cell_to_dict(c, now_ms) for c in job.cells()],
    }


def _overrides(job: Job) -> list[str] | None:
    """The job's overrides; None (JSON null) for stored ones that are not a list of strings."""
    try:
        return job.overrides
    except ConfigError:
        return None


def cell_to_dict(cell: JobCell, now_ms: int) -> dict[str, Any]:
    run = cell.run
    checkpoint = resumable_checkpoint_of(cell)
    duration = cell.duration_s(now_ms)
    return {
        "name": cell.name,
        "run_id": run.run_id if run else None,  # the cell's run in this job
        "state": cell.state,
        "skipped_from": cell.skipped.run_id if cell.skipped is not None and run is None else None,
        "progress": round(cell.fraction(), 4),
        "step": cell.step(),
        "weight": cell.weight,
        "loss": cell.metric(METRIC_LOSS),
        "val_sharpe": cell.metric(METRIC_SHARPE),
        "peak_mb": cell.metric(METRIC_PEAK_MB),
        "duration_s": round(duration, 3) if duration is not None else None,
        "error": (run.tags.get(Tag.ERROR) or None) if run else None,
        "checkpoint": str(checkpoint) if checkpoint else None,
    }
