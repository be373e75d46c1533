"""The read-only fast path: MLflow's SQLite tables read with the standard library's ``sqlite3``.

Why not only ``MlflowClient``: reading the store through it costs seconds per command
(``import mlflow``, then opening the SQLite store; the figures: docs/benchmarks.md), which the
read-only job commands (``foxhunt train list``, ``status``, ``watch``'s refresh) cannot afford.
This reader queries MLflow's tables (``runs``, ``tags``, ``latest_metrics``, ``params``,
``experiments``) directly, queries only; a whole ``foxhunt train list`` or ``status`` takes
under a second (interpreter and typer start-up included). It answers the same questions as the client reader
(:class:`foxhunt.runs.store.ClientReader`), and the tests check that both give the same runs;
a SQLite schema it does not recognise goes through the client (:func:`foxhunt.runs.store.open_reader`).
``foxhunt runs top`` reads its leaderboard here too (:meth:`SqliteReader.finished_runs`: only the
tags and metrics it names, one row per run; :mod:`foxhunt.runs.leaderboard`).
This module imports neither torch, lightning nor mlflow.

A store another writer holds locked (a commit in progress, a long ``BEGIN EXCLUSIVE``) is
waited for, up to :data:`SQLITE_TIMEOUT_S`, then :class:`StoreLocked`: one line naming the file
and saying it is locked (not "no MLflow tables", not a traceback), for every command that reads
here (``foxhunt train list|status|watch``, ``foxhunt runs top``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from foxhunt.errors import UserError
from foxhunt.runs.stored import Metric, StoredRun
from foxhunt.runs.tags import RUN_KIND_SWEEP, Param, Tag

SQLITE_TIMEOUT_S = 10  # how long a read waits for another writer's lock on the store
SQLITE_MAX_PARAMS = 500  # SQLite's default limit on host parameters is 999
REQUIRED_COLUMNS = {
    "runs": {"run_uuid", "name", "status", "start_time", "end_time", "lifecycle_stage", "experiment_id", "artifact_uri"},
    "experiments": {"experiment_id", "name"},
    "tags": {"run_uuid", "key", "value"},
    "params": {"run_uuid", "key", "value"},
    "latest_metrics": {"run_uuid", "key", "value", "step", "timestamp", "is_nan"},
}
KNOWN, INCOMPLETE, UNKNOWN = "known", "incomplete", "unknown"
_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)  # primary result codes of a lock held by another connection


class StoreLocked(UserError):
    """Another writer held the SQLite store locked for longer than a read waits; one line."""

    kind = "store"


def _is_locked(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return (code is not None and code & 0xFF in _BUSY) or "database is locked" in str(exc)


def not_a_store(path: Path) -> str | None:
    """Why the existing SQLite file ``path`` is no MLflow store a command may open with MLflow's
    client (which would create MLflow's tables in any file it is given: a 0-byte ``mlflow.db``
    grew to 950 KB under ``runs prune``); None when it is one (or of a newer schema)."""
    if SqliteReader(path).schema() == INCOMPLETE:
        return "not an SQLite store with MLflow's tables"
    return None


class SqliteReader:
    """Queries on MLflow's SQLite store (its tables, not its Python API: see above); no writes."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection for the block, closed after it. Read-write mode but queries only
        (``query_only``): a read-only connection cannot roll back the hot journal a writer
        killed mid-transaction leaves (``kill -9``), and then fails with "attempt to write a
        readonly database". A lock held past :data:`SQLITE_TIMEOUT_S` is :class:`StoreLocked`."""
        timeout = SQLITE_TIMEOUT_S
        try:
            with closing(sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=rw", uri=True, timeout=timeout)) as db:
                db.execute("PRAGMA query_only = ON")
                yield db
        except sqlite3.OperationalError as exc:
            if _is_locked(exc):
                raise StoreLocked(f"the MLflow store {self.path} is locked by another writer: waited {timeout:g} s; "
                                  "try again when it is done") from None  # fmt: skip
            raise

    def schema(self) -> str:
        """``known``; ``incomplete`` (no file, or tables still missing: being created);
        ``unknown`` (MLflow's tables changed: read through the client). A store locked by
        another writer is waited for, then :class:`StoreLocked`."""
        if not self.path.is_file():
            return INCOMPLETE
        try:
            with self._connect() as db:
                for table, columns in REQUIRED_COLUMNS.items():
                    found = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                    if not found:
                        return INCOMPLETE
                    if not columns <= found:
                        return UNKNOWN
        except sqlite3.Error:
            return INCOMPLETE
        return KNOWN

    def job_runs(self, job_id: str | None = None) -> list[StoredRun]:
        """Every run that belongs to a job (tagged ``job_id``, nested, or a parent: a sweep's
        parent run counts before its first cell starts), or, with ``job_id``, the runs of the
        jobs whose id starts with it."""
        try:
            return self._job_runs(job_id)
        except sqlite3.OperationalError as exc:  # a store whose tables are being created
            if "no such table" in str(exc):
                return []
            raise

    def _job_runs(self, job_id: str | None) -> list[StoredRun]:
        if not self.path.is_file():
            return []
        with self._connect() as db:
            if job_id is None:
                member = (
                    "SELECT run_uuid FROM tags WHERE (key = ? AND value != '') OR key = ? OR (key = ? AND value = ?) "
                    "UNION SELECT value FROM tags WHERE key = ?"
                )
                args: tuple = (Tag.JOB_ID, Tag.PARENT, Tag.RUN_KIND, RUN_KIND_SWEEP, Tag.PARENT)
            else:  # runs tagged with a matching job id, parents whose id matches; their kin
                # a plain, case-sensitive prefix, as the client reader's startswith (LIKE ignores case)
                member = (
                    "WITH a AS (SELECT run_uuid AS id FROM tags WHERE key = ? AND substr(value, 1, ?) = ? "
                    "UNION SELECT value FROM tags WHERE key = ? AND substr(value, 1, ?) = ? "
                    "UNION SELECT run_uuid FROM tags WHERE key = ? AND value = ? AND substr(run_uuid, 1, ?) = ?), "
                    "p AS (SELECT value AS id FROM tags WHERE key = ? AND run_uuid IN (SELECT id FROM a)), "
                    "roots AS (SELECT id FROM a UNION SELECT id FROM p) "
                    "SELECT id FROM roots UNION "
                    "SELECT run_uuid FROM tags WHERE key = ? AND value IN (SELECT id FROM roots)"
                )
                prefix = (len(job_id), job_id)
                args = (Tag.JOB_ID, *prefix, Tag.PARENT, *prefix, Tag.RUN_KIND, RUN_KIND_SWEEP, *prefix, Tag.PARENT, Tag.PARENT)
            runs = db.execute(
                "SELECT r.run_uuid, r.name, e.name, r.status, r.start_time, r.end_time, r.artifact_uri "
                "FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id "
                f"WHERE r.lifecycle_stage = 'active' AND r.run_uuid IN ({member})",
                args,
            ).fetchall()
            ids = [row[0] for row in runs]
            tags = self._by_run(db, "SELECT run_uuid, key, value FROM tags", ids)
            metrics = self._by_run(db, "SELECT run_uuid, key, value, step, timestamp, is_nan FROM latest_metrics", ids)
            params = self._by_run(db, "SELECT run_uuid, key, value FROM params", ids, extra=("key", Param.CHECKPOINT_DIRS))
        stored = []
        for run_id, name, experiment, status, start, end, artifact_uri in runs:
            run_tags = {k: v for k, v in tags.get(run_id, [])}
            run_metrics = {
                k: Metric(float("nan") if is_nan else float(v), step, ts) for k, v, step, ts, is_nan in metrics.get(run_id, [])
            }
            stored.append(
                StoredRun(
                    run_id=run_id,
                    name=name or run_tags.get(Tag.RUN_NAME, run_id[:8]),
                    experiment=experiment,
                    status=status,
                    start_ms=int(start or 0),
                    end_ms=int(end) if end else None,
                    tags=run_tags,
                    metrics=run_metrics,
                    params={k: v for k, v in params.get(run_id, [])},
                    artifact_uri=artifact_uri or "",
                )  # fmt: skip
            )
        return stored

    def run_ids_with_tag(self, key: str, value: str) -> list[str]:
        """Active runs whose tag ``key`` is ``value``, newest first."""
        if self.schema() != KNOWN:
            return []
        with self._connect() as db:
            rows = db.execute(
                "SELECT r.run_uuid FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
                "WHERE r.lifecycle_stage = 'active' AND t.key = ? AND t.value = ? ORDER BY r.start_time DESC",
                (key, value),
            ).fetchall()
        return [row[0] for row in rows]

    # -- the leaderboard's reads (foxhunt.runs.leaderboard): only the keys it asks for --------
    def experiment_ids(self, name: str) -> list[str]:
        """The ids of the active experiments named ``name`` (one per MLflow workspace)."""
        if self.schema() != KNOWN:
            return []
        with self._connect() as db:
            rows = db.execute(
                "SELECT experiment_id FROM experiments WHERE name = ? AND lifecycle_stage = 'active'", (name,)
            ).fetchall()
        return [str(row[0]) for row in rows]

    def experiment_names(self) -> list[str]:
        """The names of the active experiments, sorted."""
        if self.schema() != KNOWN:
            return []
        with self._connect() as db:
            rows = db.execute("SELECT DISTINCT name FROM experiments WHERE lifecycle_stage = 'active'").fetchall()
        return sorted(row[0] for row in rows)

    def finished_runs(self, experiment_ids: list[str], tag_keys, metric_keys) -> list[StoredRun]:
        """The active FINISHED runs of these experiments with only the tags ``tag_keys`` and the
        latest values of the metrics ``metric_keys`` (NaN where MLflow stored NaN; step and time
        not read, as the client's search gives none), newest first.

        One query, one row per run, each key a correlated lookup through the ``(key, run_uuid)``
        primary key of ``tags`` or ``latest_metrics``: the cost grows with the runs and the keys
        asked for, not with the metrics the runs logged (joining the tables instead was slower:
        docs/benchmarks.md)."""
        if not experiment_ids or self.schema() != KNOWN:
            return []
        tag_keys, metric_keys = list(dict.fromkeys(tag_keys)), list(dict.fromkeys(metric_keys))
        columns = [*("(SELECT value FROM tags WHERE key = ? AND run_uuid = r.run_uuid)" for _ in tag_keys), *(
            "(SELECT CASE WHEN is_nan THEN 'NaN' ELSE value END FROM latest_metrics "
            "WHERE key = ? AND run_uuid = r.run_uuid)" for _ in metric_keys)]  # fmt: skip
        query = (
            "SELECT r.run_uuid, r.name, e.name, r.status, r.start_time, r.end_time, r.artifact_uri"
            + "".join(f", {column}" for column in columns)
            + " FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id "
            f"WHERE r.experiment_id IN ({','.join('?' * len(experiment_ids))}) "
            "AND r.status = 'FINISHED' AND r.lifecycle_stage = 'active' ORDER BY r.start_time DESC, r.run_uuid"
        )
        with self._connect() as db:
            found = db.execute(query, [*tag_keys, *metric_keys, *experiment_ids]).fetchall()
        stored = []
        n_tags = len(tag_keys)
        for run_id, name, experiment, status, start, end, artifact_uri, *values in found:
            tags = {key: value for key, value in zip(tag_keys, values[:n_tags]) if value is not None}
            metrics = {key: Metric(float(value), None, None)
                       for key, value in zip(metric_keys, values[n_tags:]) if value is not None}  # fmt: skip
            stored.append(
                StoredRun(
                    run_id=run_id,
                    name=name or tags.get(Tag.RUN_NAME, run_id[:8]),
                    experiment=experiment,
                    status=status,
                    start_ms=int(start or 0),
                    end_ms=int(end) if end else None,
                    tags=tags,
                    metrics=metrics,
                    artifact_uri=artifact_uri or "",
                )  # fmt: skip
            )
        return stored

    def latest_metrics(self, run_ids, keys=(), prefix: str = "") -> dict[str, dict[str, Metric]]:
        """Per run of ``run_ids``, its latest metrics named in ``keys`` or starting with ``prefix``."""
        run_ids, keys = list(run_ids), list(keys)
        if not run_ids or not (keys or prefix) or self.schema() != KNOWN:
            return {}
        conditions, extra = [], []
        if keys:
            conditions.append(f"key IN ({','.join('?' * len(keys))})")
            extra += keys
        if prefix:
            conditions.append("substr(key, 1, ?) = ?")  # LIKE would ignore case
            extra += [len(prefix), prefix]
        found: dict[str, dict[str, Metric]] = {}
        with self._connect() as db:
            for start in range(0, len(run_ids), SQLITE_MAX_PARAMS):
                part = run_ids[start : start + SQLITE_MAX_PARAMS]
                query = (
                    "SELECT run_uuid, key, value, step, timestamp, is_nan FROM latest_metrics "
                    f"WHERE run_uuid IN ({','.join('?' * len(part))}) AND ({' OR '.join(conditions)})"
                )
                for run_id, key, value, step, ts, is_nan in db.execute(query, [*part, *extra]):
                    found.setdefault(run_id, {})[key] = Metric(float("nan") if is_nan else float(value), step, ts)
        return found

    @staticmethod
    def _by_run(db: sqlite3.Connection, select: str, ids: list[str], extra: tuple | None = None) -> dict:
        found: dict[str, list] = {}
        for start in range(0, len(ids), SQLITE_MAX_PARAMS):
            part = ids[start : start + SQLITE_MAX_PARAMS]
            query = f"{select} WHERE run_uuid IN ({','.join('?' * len(part))})"
            args = list(part)
            if extra is not None:
                column, values = extra
                query += f" AND {column} IN ({','.join('?' * len(values))})"
                args += list(values)
            for row in db.execute(query, args):
                found.setdefault(row[0], []).append(row[1:])
        return found
