"""The read-only SQLite fast path reads what MlflowClient (and so the MLflow UI) reads."""

from __future__ import annotations

from foxhunt.jobs.views import group_jobs
from foxhunt.runs.environment import sqlite_path
from foxhunt.runs.sqlite_reader import SqliteReader
from foxhunt.runs.store import ClientReader, RunStore, open_reader


def test_the_sqlite_reader_agrees_with_mlflow_client(jobs_store):
    """The direct reader reads what MlflowClient (and so the MLflow UI) reads."""

    def summary(runs):
        jobs = group_jobs(runs)
        return {
            j.job_id: (
                j.state, j.parent.run_id if j.parent else None, j.overrides,
                sorted((r.run_id, r.name, r.status, r.start_ms, r.end_ms, r.state,
                        tuple(sorted((k, m.value) for k, m in r.metrics.items())),
                        r.metrics["progress"].step if "progress" in r.metrics else None,
                        tuple(sorted((k, v) for k, v in r.tags.items() if not k.startswith("mlflow."))))
                       for r in j.runs),
            )  # fmt: skip
            for j in jobs
        }

    path = sqlite_path(jobs_store.uri)
    assert isinstance(open_reader(jobs_store.uri), SqliteReader)
    client = ClientReader(RunStore(jobs_store.uri))
    assert summary(SqliteReader(path).job_runs()) == summary(client.job_runs())
    one = client.job_runs("cccc")
    assert {r.run_id for r in one} == {jobs_store.runs["running"], jobs_store.runs["running/tft-zn"]}
    assert {r.run_id for r in SqliteReader(path).job_runs("cccc")} == {r.run_id for r in one}


def test_a_job_prefix_matches_as_the_client_matches_it_case_and_wildcards_included(jobs_store):
    """A job id (or parent run id) prefix is a plain, case-sensitive prefix: ``CCCC`` is no
    prefix of ``cccc4444``, and ``_`` or ``%`` match only themselves."""
    reader, client = SqliteReader(sqlite_path(jobs_store.uri)), ClientReader(RunStore(jobs_store.uri))
    byhand = jobs_store.runs["byhand"]
    for prefix in ("cccc", "CCCC", "AAAA1111", "aaaa_", "a%", byhand[:10], byhand[:10].upper()):
        expected = sorted(r.run_id for r in client.job_runs(prefix))
        assert sorted(r.run_id for r in reader.job_runs(prefix)) == expected, prefix
    assert {r.run_id for r in reader.job_runs("CCCC")} == set()
    assert {r.run_id for r in reader.job_runs(byhand[:10])} == {byhand, jobs_store.runs["byhand/tft-es"]}
