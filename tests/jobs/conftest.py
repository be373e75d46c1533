"""Fixtures of the job tests: the jobs of the hand-populated store (tests/jobs_store.py)."""

from __future__ import annotations

import pytest

from foxhunt.jobs.views import load_jobs


@pytest.fixture(scope="module")
def jobs(jobs_store):
    """Job id -> job, as ``foxhunt train list`` loads them from the store."""
    return {job.job_id: job for job in load_jobs(jobs_store.uri)}
