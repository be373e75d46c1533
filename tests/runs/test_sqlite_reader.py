"""The read-only SQLite fast path reads what MlflowClient (and so the MLflow UI) reads: a job's
runs, the leaderboard's finished runs with only the keys asked for, latest metrics, runs by tag;
a store it does not know (no file, tables missing, MLflow's columns changed) is said so, and
reading writes nothing."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from foxhunt.jobs.views import group_jobs
from foxhunt.runs.environment import sqlite_path
from foxhunt.runs.sqlite_reader import INCOMPLETE, KNOWN, UNKNOWN, SqliteReader, StoreLocked
from foxhunt.runs.store import ClientReader, RunStore, open_reader


@pytest.fixture(scope="module")
def reader(jobs_store) -> SqliteReader:
    return SqliteReader(sqlite_path(jobs_store.uri))


def test_the_sqlite_reader_agrees_with_mlflow_client(jobs_store):
    """The direct reader reads what MlflowClient (and so the MLflow UI) reads."""

    def summary(runs):
        jobs = group_jobs(runs)
        return {
            j.job_id: (
                j.state,
                j.parent.run_id if j.parent else None,
                j.overrides,
                sorted(
                    (
                        r.run_id,
                        r.name,
                        r.status,
                        r.start_ms,
                        r.end_ms,
                        r.state,
                        tuple(sorted((k, m.value) for k, m in r.metrics.items())),
                        r.metrics["progress"].step if "progress" in r.metrics else None,
                        tuple(sorted((k, v) for k, v in r.tags.items() if not k.startswith("mlflow."))),
                    )
                    for r in j.runs
                ),
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


def test_a_store_it_cannot_read_yet_or_does_not_know_is_said_so(tmp_path, reader):
    assert reader.schema() == KNOWN
    missing = SqliteReader(tmp_path / "none.db")
    assert (missing.schema(), missing.job_runs(), missing.finished_runs(["1"], ["model"], ["val/sharpe"])) == (INCOMPLETE, [], [])
    with sqlite3.connect(tmp_path / "empty.db") as db:  # MLflow is creating its tables
        db.execute("CREATE TABLE alembic_version (version_num TEXT)")
    empty = SqliteReader(tmp_path / "empty.db")
    assert (empty.schema(), empty.job_runs(), empty.experiment_names(), empty.run_ids_with_tag("job_id", "x")) == (
        INCOMPLETE,
        [],
        [],
        [],
    )
    changed = tmp_path / "changed.db"
    shutil.copy(reader.path, changed)
    with sqlite3.connect(changed) as db:  # a newer MLflow renamed a column this reader reads
        db.execute("ALTER TABLE latest_metrics RENAME COLUMN is_nan TO nan_flag")
    assert SqliteReader(changed).schema() == UNKNOWN
    assert SqliteReader(changed).experiment_ids("foxhunt") == []  # left to the client reader


def test_a_store_locked_by_another_writer_is_said_locked_not_incomplete(reader, tmp_path, monkeypatch):
    from foxhunt.runs import sqlite_reader

    copy = tmp_path / "locked.db"
    shutil.copy(reader.path, copy)
    monkeypatch.setattr(sqlite_reader, "SQLITE_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(copy, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        for read in (SqliteReader(copy).schema, SqliteReader(copy).job_runs, lambda: open_reader(f"sqlite:///{copy}")):
            with pytest.raises(StoreLocked, match=f"^the MLflow store {copy} is locked by another writer: waited 0.2 s; "):
                read()
    finally:
        holder.rollback()
        holder.close()
    assert SqliteReader(copy).schema() == KNOWN


def test_the_leaderboards_read_has_only_the_keys_asked_for_of_finished_runs(jobs_store, reader):
    (experiment,) = reader.experiment_ids("foxhunt")
    assert reader.experiment_ids("nope") == [] and reader.experiment_names() == ["Default", "foxhunt"]
    found = reader.finished_runs([experiment], ["model", "asset"], ["val/sharpe"])
    labels = {run_id: label for label, run_id in jobs_store.runs.items()}
    assert sorted(labels[r.run_id] for r in found) == sorted(
        ["finished", "finished/dqn-es", "finished/dqn-nq", "finished/tft-es", "finished/tft-nq", "failed/ppo-es", "single"]
    )
    assert [r.start_ms for r in found] == sorted((r.start_ms for r in found), reverse=True)  # newest first
    assert all(set(r.tags) <= {"model", "asset"} and set(r.metrics) <= {"val/sharpe"} for r in found)
    best = max((r for r in found if r.metrics), key=lambda r: r.metric("val/sharpe"))
    assert (labels[best.run_id], best.metric("val/sharpe"), best.tags) == (
        "finished/tft-nq",
        pytest.approx(1.4),
        {"model": "tft", "asset": "nq"},
    )


def test_latest_metrics_by_name_or_case_sensitive_prefix(jobs_store, reader):
    cells = [jobs_store.runs[f"finished/{c}"] for c in ("dqn-es", "tft-nq")]
    by_prefix = reader.latest_metrics(cells, prefix="memory/")
    assert {run: set(metrics) for run, metrics in by_prefix.items()} == {run: {"memory/peak_mb"} for run in cells}
    assert by_prefix[cells[0]]["memory/peak_mb"].value == 120.0 and by_prefix[cells[0]]["memory/peak_mb"].step == 100
    named = reader.latest_metrics(cells, keys=["val/sharpe", "progress"])
    assert {run: sorted(metrics) for run, metrics in named.items()} == {run: ["progress", "val/sharpe"] for run in cells}
    assert named[cells[1]]["val/sharpe"].value == pytest.approx(1.4)
    assert reader.latest_metrics(cells, prefix="Memory/") == {}
    assert reader.latest_metrics(cells) == {} and reader.latest_metrics([], keys=["progress"]) == {}


def test_runs_by_tag_newest_first(jobs_store, reader):
    assert reader.run_ids_with_tag("sweep_id", "sweep-finished") == [jobs_store.runs["finished"]]
    model_dqn = reader.run_ids_with_tag("model", "dqn")
    assert set(model_dqn) >= {jobs_store.runs["finished/dqn-es"], jobs_store.runs["single"]}
    assert reader.run_ids_with_tag("model", "DQN") == []


def test_reading_writes_nothing(jobs_store, tmp_path):
    copy = tmp_path / "mlflow.db"
    shutil.copy(sqlite_path(jobs_store.uri), copy)
    before = copy.read_bytes()
    reader = SqliteReader(copy)
    runs = reader.job_runs() + reader.job_runs("aaaa")
    (experiment,) = reader.experiment_ids("foxhunt")
    reader.finished_runs([experiment], ["model"], ["val/sharpe"])
    reader.latest_metrics([r.run_id for r in runs], prefix="")
    reader.run_ids_with_tag("job_id", "aaaa1111")
    assert len(runs) == 18 + 8  # every job's runs, then those of jobs aaaa1111 and aaaa2222 (prefix aaaa)
    assert copy.read_bytes() == before
