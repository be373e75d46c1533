"""The MLflow store behind one interface: experiments, runs, tags, search, the model registry.

:class:`RunStore` is the only place foxhunt constructs an ``MlflowClient``; every writer (a
training run, the sweep's parent run, the job supervisor, ``foxhunt train stop``, resume) and
every reader goes through it. Reads that the job commands make many times a second take the
read-only SQLite fast path (:mod:`foxhunt.runs.sqlite_reader`) when the store is the
project's SQLite file, else the client (:class:`ClientReader`, a server or an unknown
schema): :func:`open_reader`. Nothing here imports mlflow until a method needs the client.

The store is created on first use: :meth:`RunStore.ensure_experiment` makes the SQLite file's
folder and the experiment. Concurrent writers (several ``foxhunt-train`` processes, the jobs of
``foxhunt train start``, a sweep's parallel cells) share one SQLite file safely: the client is
opened, and a fresh store's tables created or migrated, under an exclusive lock on
``<store>.lock`` (the first process creates, the others wait and then find the tables), and
every SQLite connection waits up to :data:`SQLITE_BUSY_TIMEOUT_MS` for a writer's lock instead
of failing with "database is locked". A store that cannot be opened (an unknown URI scheme, a
file that is not an SQLite database, a folder that cannot be made) raises :class:`StoreError`,
one line naming the URI.

Model registry (for whatever consumes trained runs; the sweep and the jobs do not use it)::

    store.register_model_version(name, run_id, source, tags=None, alias=None) -> ModelVersion
        # source: an artifact path of the run ("checkpoints") or a URI ("runs:/<id>/...",
        # "models:/...", "file:///..."); creates the registered model when missing;
        # alias, if given, then points at the new version
    store.set_alias(name, alias, version) -> None
    store.get_version_by_alias(name, alias) -> ModelVersion | None
    store.get_version(name, version) -> ModelVersion | None
    store.log_artifacts(run_id, folder, artifact_path) / store.download_uri(uri, destination)
    store.search_finished_runs(experiment, filter_string="") -> list[StoredRun]
        # FINISHED runs of an experiment (by name), newest first, with metrics, params and
        # tags; filter_string in MLflow's search syntax, e.g. "tags.model = 'dqn'"
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foxhunt.errors import UserError, one_line_error
from foxhunt.runs.environment import sqlite_path
from foxhunt.runs.provenance import SPLIT_SHA256, DatasetProvenance
from foxhunt.runs.server_lock import server_lock
from foxhunt.runs.sqlite_reader import INCOMPLETE, KNOWN, SqliteReader
from foxhunt.runs.status import Status
from foxhunt.runs.stored import Metric, StoredRun
from foxhunt.runs.tags import EXPERIMENT_KIND, RUN_KIND_SWEEP, Param, Tag

# Lazy imports: (c) mlflow and sqlalchemy, in the methods that use the client: train list/status/watch import this module

log = logging.getLogger(__name__)

# MLflow's limits (mlflow.utils.validation): param values up to 6000 characters, 100 params
# (and 1000 metrics) per batch call.
PARAM_VALUE_LIMIT = 6000
PARAMS_PER_BATCH = 100
METRIC_BATCH = 1000  # MLflow's limit on metrics per log_batch
SEARCH_PAGE = 1000
#: How long an SQLite connection waits for another process's write lock (milliseconds).
SQLITE_BUSY_TIMEOUT_MS = 120_000
STORE_LOCK_SUFFIX = ".lock"
_SQLITE_HEADER = b"SQLite format 3\x00"
_ACCEPTED_URIS = "sqlite:///<file> (created when missing) or an http(s):// MLflow server"
SYSTEM_METRICS_LOGGER = "mlflow.system_metrics"  # MLflow's monitor logs its start and stop at INFO
#: The version tags naming runs (foxhunt.ensemble.registry: the cell run chosen, the run whose weights it holds).
VERSION_RUN_TAGS = ("run_id", "weights_run_id")
MAX_VERSION = 2**63 - 1  # SQLite's largest integer: no registered version is numbered beyond it


def is_version_number(value: Any) -> bool:
    """Whether ``value`` (text or an int) can number a registered version: ASCII digits of a
    positive number within :data:`MAX_VERSION` (a larger one overflowed SQLite's integer in the
    store's query: a traceback blaming the store)."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    return isinstance(text, str) and text.isascii() and text.isdigit() and 0 < int(text[:20]) <= MAX_VERSION


# Each key's latest value as MLflow keeps it: the greatest (step, timestamp, value).
_LATEST_METRICS = """
INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid)
SELECT key, value, timestamp, step, is_nan, run_uuid FROM metrics AS m WHERE run_uuid = ?1 AND NOT EXISTS (
    SELECT 1 FROM metrics AS n WHERE n.run_uuid = m.run_uuid AND n.key = m.key AND (
        n.step > m.step OR (n.step = m.step AND (n.timestamp > m.timestamp
        OR (n.timestamp = m.timestamp AND n.value > m.value)))))
GROUP BY key
"""


class StoreError(UserError):
    """The MLflow store cannot be opened (the message names the URI and what is accepted), or a
    record read back from it is not what its run recorded (the message names the run and the file)."""

    kind = "store"


def _busy_timeout(dbapi_connection, _record) -> None:
    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")


def _wait_for_locks() -> None:
    """Every SQLite engine of the process (MLflow's, Lightning's logger's) waits for locks."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not event.contains(Engine, "connect", _busy_timeout):
        event.listen(Engine, "connect", _busy_timeout)


@contextmanager
def _store_lock(database: Path):
    """An exclusive lock on ``<database>.lock`` (held while a client opens, and maybe creates, the store)."""
    with open(database.with_name(database.name + STORE_LOCK_SUFFIX), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def open_client(tracking_uri: str):
    """An ``MlflowClient`` on a store that exists (see the module doc); :class:`StoreError` when
    the store cannot be opened."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    database = sqlite_path(tracking_uri)
    try:
        if database is None:
            return MlflowClient(tracking_uri)
        if database.is_file() and database.stat().st_size:  # an existing file must be an SQLite database
            with open(database, "rb") as handle:
                if handle.read(len(_SQLITE_HEADER)) != _SQLITE_HEADER:
                    raise StoreError(
                        f"{tracking_uri}: not an MLflow SQLite store (the file is not an SQLite "
                        f"database); expected {_ACCEPTED_URIS}"
                    )
        _wait_for_locks()
        database.parent.mkdir(parents=True, exist_ok=True)
        with _store_lock(database):
            client = MlflowClient(tracking_uri)
            client.search_experiments(max_results=1)  # opens the store: creates or migrates its tables
        return client
    except (MlflowException, OSError) as exc:
        raise StoreError(
            f"{tracking_uri}: cannot open the MLflow store ({one_line_error(exc, with_type=False, first_line=True, limit=300)}); expected {_ACCEPTED_URIS}"
        ) from None
    except Exception as exc:  # SQLAlchemy's and alembic's errors for a file that is not an MLflow store
        if type(exc).__module__.split(".")[0] not in ("sqlalchemy", "alembic", "sqlite3"):
            raise
        raise StoreError(
            f"{tracking_uri}: not an MLflow SQLite store ({one_line_error(exc, with_type=False, first_line=True, limit=300)}); expected {_ACCEPTED_URIS}"
        ) from None


METRIC_PROGRESS = "progress"  # its step is where a cell is (foxhunt.training.progress)


def param_value(value: Any) -> str:
    text = str(value)
    return text if len(text) <= PARAM_VALUE_LIMIT else text[: PARAM_VALUE_LIMIT - 3] + "..."


@dataclass(frozen=True)
class ModelVersion:
    name: str
    version: str
    run_id: str | None
    source: str
    tags: dict[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()


class RunStore:
    def __init__(self, tracking_uri: str) -> None:
        self.tracking_uri = tracking_uri
        self._client = None

    @classmethod
    def sharing(cls, client) -> RunStore:
        """The store of an open ``MlflowClient`` (a Lightning logger's), writing through it."""
        store = cls(str(client.tracking_uri))
        store._client = client
        return store

    @property
    def client(self):
        """The store's ``MlflowClient``, created on first use (importing mlflow takes seconds).
        Creating it opens the store, and creates a missing SQLite store: only the process that
        owns the store's creation (a sweep's parent, a single run) may touch it first."""
        if self._client is None:
            self._client = open_client(self.tracking_uri)
        return self._client

    @contextmanager
    def exclusive(self, name: str):
        """Hold the store's lock ``name`` (``<store>.<name>.lock`` beside the SQLite file) for a
        step that reads then writes and must not interleave with another process's same step
        (``foxhunt ensemble register``: two at once would both find no champion and register
        one each). A server store's lock is held on the server, for every host that reaches it
        (:mod:`foxhunt.runs.server_lock`); before, its steps ran unlocked."""
        database = sqlite_path(self.tracking_uri)
        if database is None:
            with server_lock(self.client, name):
                yield
            return

        path = database.with_name(f"{database.name}.{name}{STORE_LOCK_SUFFIX}")
        try:  # never through a link planted at its name (one made the file it pointed to), nor a folder there
            database.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StoreError(f"the store's lock {path} cannot be opened ({exc.strerror or exc}; a symbolic link is refused): "
                             "remove what is at that path") from None  # fmt: skip
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # drops the flock

    # -- experiments ---------------------------------------------------------------------
    def ensure_experiment(self, name: str, artifact_location: str | None = None) -> str:
        """The id of experiment ``name``, creating the store and the experiment if needed."""
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        location = Path(artifact_location).resolve().as_uri() if artifact_location else None
        try:
            return self.client.create_experiment(name, artifact_location=location, tags=dict([EXPERIMENT_KIND]))
        except MlflowException:  # created by a concurrent process in between: use theirs
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def experiment_id(self, name: str) -> str | None:
        found = self.client.get_experiment_by_name(name)
        return None if found is None else found.experiment_id

    # -- writing runs --------------------------------------------------------------------
    def create(self, experiment_id: str, run_name: str, tags: Mapping[str, Any]) -> str:
        run = self.client.create_run(experiment_id, run_name=run_name, tags={k: str(v) for k, v in tags.items()})
        return run.info.run_id

    def reopen(self, run_id: str, tags: Mapping[str, Any]) -> StoredRun:
        """Make an ended run RUNNING again: ``tags`` set (and ``resume_count`` one up), an
        earlier ``error`` and ``stop_reason`` removed, then the status, last (a job's supervisor tags a parent
        once it is RUNNING, and these tags must not overwrite its). Returns the run as it was."""
        previous = self.get(run_id)
        count = int(previous.tags.get(Tag.RESUME_COUNT, "0") or 0) + 1
        self.tag(run_id, {**tags, Tag.RESUME_COUNT: count})
        for ended in (Tag.ERROR, Tag.STOP_REASON):  # what ended the earlier attempt is not this one's
            if ended in previous.tags:
                self.client.delete_tag(run_id, ended)
        self.client.update_run(run_id, status=Status.RUNNING.value)
        return previous

    def forget_metrics_after(self, run_id: str, step: int, since_ms: int) -> int:
        """Remove the run's metric values of steps ``step`` and later logged after ``since_ms``
        (milliseconds since the epoch); returns how many.

        A run killed after its last checkpoint (of step ``step``, taken at ``since_ms``) logged
        steps whose training died with it; resumed from that checkpoint it logs them again, so
        without this the history would hold those steps twice. (Both bounds: Lightning logs a
        step's values at the index of its batch, the ``progress`` metric at the step count after
        it, so a value of step ``step`` can come from before the checkpoint or after it.) MLflow's client cannot delete a metric value: on the project's SQLite store
        the rows go (and each key's latest value is recomputed) in one transaction; another store
        keeps them, said in the log."""
        database = sqlite_path(self.tracking_uri)
        if database is None or not database.is_file():
            log.warning(
                "run %s: metrics after step %d stay in the store %s (only SQLite's can be rewound)",
                run_id,
                step,
                self.tracking_uri,
            )
            return 0
        with _store_lock(database), sqlite3.connect(database, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000) as db:
            removed = db.execute(
                "DELETE FROM metrics WHERE run_uuid = ? AND step >= ? AND timestamp > ?", (run_id, step, since_ms)
            ).rowcount
            if removed:
                db.execute("DELETE FROM latest_metrics WHERE run_uuid = ?", (run_id,))
                db.execute(_LATEST_METRICS, (run_id,))
        return removed

    def end(self, run_id: str, status: str, tags: Mapping[str, Any] | None = None) -> None:
        """End the run with ``status`` (FINISHED, FAILED, KILLED), after setting ``tags``."""
        if tags:
            self.tag(run_id, tags)
        self.client.set_terminated(run_id, str(status))

    def tag(self, run_id: str, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(key, str(value)) for key, value in tags.items()])

    def log_params(self, run_id: str, params: Iterable[tuple[str, Any]]) -> None:
        from mlflow.entities import Param as MlflowParam

        batch = [MlflowParam(key, param_value(value)) for key, value in params]
        for start in range(0, len(batch), PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=batch[start : start + PARAMS_PER_BATCH])

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.log_metric_rows(run_id, [(step or 0, int(time.time() * 1000), metrics)])

    def log_metric_rows(self, run_id: str, rows: Iterable[tuple[int, int, Mapping[str, float]]]) -> None:
        """Rows of ``(step, timestamp ms, {key: value})`` in as few ``log_batch`` calls as
        MLflow's limit allows (:data:`METRIC_BATCH` metrics a call)."""
        from mlflow.entities import Metric as MlflowMetric

        batch = [MlflowMetric(key, float(value), stamp, step) for step, stamp, metrics in rows for key, value in metrics.items()]
        for start in range(0, len(batch), METRIC_BATCH):
            self.client.log_batch(run_id, metrics=batch[start : start + METRIC_BATCH])

    def last_metric_step(self, run_id: str, keys: Iterable[str]) -> int | None:
        """The greatest step at which the run has a value of any of ``keys`` (None: no value)."""
        steps = [m.step for key in keys for m in self.client.get_metric_history(run_id, key)]
        return max(steps, default=None)

    @contextmanager
    def system_metrics(self, run_id: str, interval_s: float):
        """MLflow's system metrics of this machine (CPU, memory, disk, network; each NVIDIA GPU's
        use and memory through nvidia-ml-py) logged to the run as ``system/*`` (the run's System
        metrics tab) every ``interval_s`` seconds while the block runs, at MLflow's own step (the
        sample's index, continued by a resumed run). The sampling thread ends with the block and
        its last samples are written then; MLflow's info lines about it are not printed."""
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        quiet = logging.getLogger(SYSTEM_METRICS_LOGGER)
        level = quiet.level
        quiet.setLevel(logging.WARNING)
        try:
            monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, samples_before_logging=1,
                                           resume_logging=True, tracking_uri=self.tracking_uri)  # fmt: skip
            monitor.start()
            try:
                yield
            finally:
                monitor.finish()
        finally:
            quiet.setLevel(level)

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def log_artifacts(self, run_id: str, folder: str | Path, artifact_path: str | None = None) -> None:
        """Every file under ``folder`` into the run's artifacts (under ``artifact_path``)."""
        self.client.log_artifacts(run_id, str(folder), artifact_path)

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self.client.log_text(run_id, text, name)

    def log_datasets(self, run_id: str, datasets: Iterable[DatasetProvenance]) -> None:
        """Record ``datasets`` as the run's inputs (the runs table's Dataset column)."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        inputs = [
            DatasetInput(
                Dataset(d.name, d.digest, d.source_type, d.source_json(), profile=d.profile_json()),
                [InputTag(Tag.DATASET_CONTEXT, d.context)],
            )
            for d in datasets
        ]
        if inputs:
            self.client.log_inputs(run_id, datasets=inputs)

    def recorded_split_digests(self, run_id: str) -> dict[str, str | None]:
        """The SHA-256 of its bars each dataset input of the run recorded, by split (the context
        :meth:`log_datasets` tags it with; None: an input that recorded none, an older run's)."""
        found: dict[str, str | None] = {}
        for given in self.client.get_run(run_id).inputs.dataset_inputs:
            context = next((t.value for t in given.tags if t.key == Tag.DATASET_CONTEXT), None)
            if context is not None and context not in found:
                found[context] = json.loads(given.dataset.profile or "{}").get(SPLIT_SHA256)
        return found

    # -- reading runs --------------------------------------------------------------------
    def get(self, run_id: str) -> StoredRun:
        run = self.client.get_run(run_id)
        experiment = self.client.get_experiment(run.info.experiment_id)
        return self._stored_run(run, {experiment.experiment_id: experiment.name})

    def search(
        self,
        experiment: str,
        *,
        tags: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        status: str | None = None,
        filter_string: str = "",
        max_results: int | None = None,
    ) -> list[StoredRun]:
        """Active runs of experiment ``experiment`` (a name) with these tags, params and status,
        newest first; an experiment that does not exist has none."""
        experiment_id = self.experiment_id(experiment)
        if experiment_id is None:
            return []
        wanted = [("tags", k, v) for k, v in (tags or {}).items()] + [("params", k, v) for k, v in (params or {}).items()]
        # MLflow's filter has no escape for a quote in a value: such a condition is checked here
        clauses = [f"{kind}.`{key}` = '{value}'" for kind, key, value in wanted if "'" not in str(value)]
        if status is not None:
            clauses.append(f"attributes.status = '{status}'")
        if filter_string:
            clauses.append(f"({filter_string})" if " or " in filter_string.lower() else filter_string)
        runs = self._search_all([experiment_id], " and ".join(clauses), max_results)
        names = {experiment_id: experiment}
        stored = [self._stored_run(run, names) for run in runs]
        return [
            r for r in stored
            if all((r.tags if kind == "tags" else r.params).get(key) == str(value) for kind, key, value in wanted)
        ]  # fmt: skip

    def search_finished_runs(self, experiment: str, filter_string: str = "") -> list[StoredRun]:
        """FINISHED runs of ``experiment``, newest first, with their metrics, params and tags."""
        return self.search(experiment, status=Status.FINISHED, filter_string=filter_string)

    def logged_files(self, run_id: str, folder: str) -> list[str]:
        """Names of the files logged to the run under the artifact folder ``folder``."""
        return [item.path.rsplit("/", 1)[-1] for item in self.client.list_artifacts(run_id, folder) if not item.is_dir]

    def download(self, run_id: str, artifact: str, destination: Path) -> Path:
        destination.mkdir(parents=True, exist_ok=True)
        return Path(self.client.download_artifacts(run_id, artifact, str(destination)))

    def reader(self) -> SqliteReader | ClientReader:
        return open_reader(self.tracking_uri, self)

    def _search_all(self, experiment_ids: list[str], filter_string: str, max_results: int | None) -> list:
        runs: list = []
        token = None
        while True:
            page_size = SEARCH_PAGE if max_results is None else min(SEARCH_PAGE, max_results - len(runs))
            page = self.client.search_runs(
                experiment_ids, filter_string=filter_string, max_results=page_size,
                order_by=["attributes.start_time DESC"], page_token=token,
            )  # fmt: skip
            runs += list(page)
            token = page.token
            if not token or (max_results is not None and len(runs) >= max_results):
                return runs

    def _stored_run(
        self, run, experiments: Mapping[str, str], params: Iterable[str] | None = None, progress: bool = False
    ) -> StoredRun:
        """An MLflow ``Run`` as a :class:`StoredRun`. Metrics come with their latest value; the
        ``progress`` metric also with its step and time (where the run is, and the last time it
        was seen working: foxhunt.runs.liveness) with ``progress`` or for a RUNNING run."""
        metrics = {}
        with_progress = progress or run.info.status == Status.RUNNING
        for key, value in run.data.metrics.items():
            step = timestamp = None
            if key == METRIC_PROGRESS and with_progress:
                history = self.client.get_metric_history(run.info.run_id, key)
                if history:
                    latest = max(history, key=lambda m: (m.step, m.timestamp))
                    step, timestamp = latest.step, latest.timestamp
            metrics[key] = Metric(float(value), step, timestamp)
        kept = run.data.params if params is None else {k: v for k, v in run.data.params.items() if k in set(params)}
        return StoredRun(
            run_id=run.info.run_id, name=run.info.run_name or run.info.run_id[:8],
            experiment=experiments.get(run.info.experiment_id, ""), status=run.info.status,
            start_ms=int(run.info.start_time or 0), end_ms=int(run.info.end_time) if run.info.end_time else None,
            tags=dict(run.data.tags), metrics=metrics, params=dict(kept), artifact_uri=run.info.artifact_uri or "",
        )  # fmt: skip

    # -- logged models (MLflow 3) ---------------------------------------------------------
    def create_logged_model(self, run_id: str, name: str, model_type: str, tags: Mapping[str, Any]) -> tuple[str, str]:
        """A PENDING MLflow 3 logged model of run ``run_id``'s experiment, with the run's params
        (as ``Model.log`` copies them) and ``tags``: its (model id, artifact location).

        Why not ``mlflow.pyfunc.log_model``: it logs into the *active* run and experiment, and
        making a FINISHED training run active again would flip it to RUNNING and rewrite its end
        time; these are the client calls ``Model.log`` makes, on the training run as it is."""
        run = self.client.get_run(run_id)
        model = self.client.create_logged_model(
            experiment_id=run.info.experiment_id, name=name, source_run_id=run_id, model_type=model_type,
            params={k: str(v) for k, v in run.data.params.items()}, tags={k: str(v) for k, v in tags.items()},
        )  # fmt: skip
        return model.model_id, model.artifact_location

    def complete_logged_model(self, model_id: str, run_id: str, folder: Path, metric_prefixes: tuple[str, ...]) -> None:
        """Upload a logged model's folder, mark it READY, list it among the run's outputs (the
        runs table's Models column) at the step of its newest metric, and link the run's latest
        values of the metrics under ``metric_prefixes`` to it (its Metrics in the Models tab).
        Linking re-sends each metric as it was logged (key, value, step, time): the run's own
        history keeps one row per metric (the store drops the same row sent twice)."""
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus
        from mlflow.entities import Metric as MlflowMetric

        self.client.log_model_artifacts(model_id, str(folder))
        self.client.finalize_logged_model(model_id, LoggedModelStatus.READY)
        latest = []
        for key in self.client.get_run(run_id).data.metrics:
            if key.startswith(metric_prefixes):
                history = self.client.get_metric_history(run_id, key)
                if history:
                    latest.append(max(history, key=lambda m: (m.step, m.timestamp)))
        step = max((m.step for m in latest), default=0)
        self.client.log_outputs(run_id, [LoggedModelOutput(model_id, step)])
        linked = [MlflowMetric(m.key, m.value, m.timestamp, m.step, model_id=model_id, run_id=run_id) for m in latest]
        for start in range(0, len(linked), METRIC_BATCH):
            self.client.log_batch(run_id, metrics=linked[start : start + METRIC_BATCH])

    def set_logged_model_tags(self, model_id: str, tags: Mapping[str, Any]) -> None:
        self.client.set_logged_model_tags(model_id, {k: str(v) for k, v in tags.items()})

    def logged_model_tags(self, model_id: str) -> dict[str, str] | None:
        """The tags of logged model ``model_id``; None when the store has no such model."""
        from mlflow.exceptions import MlflowException

        try:
            return dict(self.client.get_logged_model(model_id).tags or {})
        except MlflowException as exc:
            if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
                return None
            raise

    def fail_logged_model(self, model_id: str) -> None:
        """Mark a logged model that could not be completed FAILED (it is never registered)."""
        from mlflow.entities import LoggedModelStatus

        self.client.finalize_logged_model(model_id, LoggedModelStatus.FAILED)

    # -- the model registry --------------------------------------------------------------
    def register_model_version(
        self,
        name: str,
        run_id: str,
        source: str,
        tags: Mapping[str, Any] | None = None,
        alias: str | None = None,
        model_id: str | None = None,
    ) -> ModelVersion:
        """A new version of registered model ``name`` (created when missing) from ``source``, an
        artifact path of run ``run_id`` or a URI (``models:/<model_id>``: a logged model, given
        as ``model_id`` too, which then lists the version as ``mlflow.register_model`` links
        it); ``alias`` then points at it."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.create_registered_model(name)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        uri = source if ":/" in source else f"runs:/{run_id}/{source.strip('/')}"
        with self._as_global_store():  # MLflow's SQL registry resolves models:/<model_id> on the global store
            created = self.client.create_model_version(
                name, uri, run_id=run_id, tags={k: str(v) for k, v in (tags or {}).items()}, model_id=model_id
            )
        if model_id is not None:
            self._link_version(model_id, name, str(created.version))
        if alias:
            self.set_alias(name, alias, created.version)
        return self._version(self.client.get_model_version(name, created.version))

    def _link_version(self, model_id: str, name: str, version: str) -> None:
        """List the version on its logged model (the ``mlflow.modelVersions`` tag, as
        ``mlflow.register_model`` writes it: the model's page in the UI shows its versions)."""
        from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

        existing = self.client.get_logged_model(model_id).tags.get(MLFLOW_MODEL_VERSIONS)
        linked = [*(json.loads(existing) if existing else []), {"name": name, "version": version}]
        self.client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(linked)})

    @contextmanager
    def _as_global_store(self):
        """This store as MLflow's global tracking URI for the block, then the previous one (unset
        stays unset): MLflow resolves ``models:/`` URIs on the global store whatever client asks
        (MLflow's own ``_use_tracking_uri``, private: no public API does this)."""
        from mlflow.tracking._tracking_service.utils import _use_tracking_uri

        with _use_tracking_uri(self.tracking_uri):
            yield

    def registered_run_ids(self) -> set[str]:
        """Every run the model registry points at, whatever its alias: each version's run, the run
        of a ``runs:/<id>/...`` source, the source run of a logged model it was made from, and
        foxhunt's ``run_id`` version tag (``foxhunt runs prune`` never touches these runs)."""
        found: set[str] = set()
        models: set[str] = set()
        token = None
        while True:
            page = self.client.search_model_versions(page_token=token)
            for version in page:
                source = str(version.source or "")
                tags = version.tags or {}
                candidates = [version.run_id, *(tags.get(key) for key in VERSION_RUN_TAGS)]
                if source.startswith("runs:/"):
                    candidates.append(source[len("runs:/") :].split("/", 1)[0])
                found.update(str(run_id) for run_id in candidates if run_id)
                logged = source[len("models:/") :] if source.startswith("models:/") else ""
                if version.model_id or (logged and "/" not in logged and "@" not in logged):  # from a logged model
                    models.add(str(version.model_id or logged))  # (the SQL registry's search leaves model_id unset)
            token = page.token
            if not token:
                break
        from mlflow.exceptions import MlflowException

        for model_id in models:
            try:
                source_run = self.client.get_logged_model(model_id).source_run_id
            except MlflowException as exc:  # a logged model deleted since: its version's run is counted above
                if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
                    raise
                continue
            if source_run:
                found.add(str(source_run))
        return found

    def get_version(self, name: str, version: str | int) -> ModelVersion | None:
        from mlflow.exceptions import MlflowException

        try:
            return self._version(self.client.get_model_version(name, str(version)))
        except MlflowException as exc:
            if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                return None
            raise

    def download_uri(self, uri: str, destination: Path) -> Path:
        """The local copy of any artifact URI (``runs:/...``, ``models:/...``) of this store."""
        import mlflow.artifacts

        destination.mkdir(parents=True, exist_ok=True)
        with self._as_global_store():  # a models:/ URI is resolved on the global store, whatever tracking_uri says
            return Path(
                mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(destination), tracking_uri=self.tracking_uri)
            )

    def set_version_tags(self, name: str, version: str | int, tags: Mapping[str, Any]) -> None:
        for key, value in tags.items():
            self.client.set_model_version_tag(name, str(version), key, str(value))

    def set_alias(self, name: str, alias: str, version: str | int) -> None:
        self.client.set_registered_model_alias(name, alias, str(version))

    def get_version_by_alias(self, name: str, alias: str) -> ModelVersion | None:
        from mlflow.exceptions import MlflowException

        try:
            return self._version(self.client.get_model_version_by_alias(name, alias))
        except MlflowException as exc:
            if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                return None
            raise

    @staticmethod
    def _version(found) -> ModelVersion:
        return ModelVersion(
            name=found.name, version=str(found.version), run_id=found.run_id, source=found.source,
            tags=dict(found.tags or {}), aliases=tuple(found.aliases or ()),
        )  # fmt: skip


class ClientReader:
    """The job views' reads through ``MlflowClient``: for a tracking server, or a SQLite schema
    the direct reader does not know. Answers as :class:`~foxhunt.runs.sqlite_reader.SqliteReader`."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

    def run_ids_with_tag(self, key: str, value: str) -> list[str]:
        """Active runs whose tag ``key`` is ``value``, newest first."""
        experiments = self._experiments()
        if not experiments:
            return []
        quoted = value.replace("'", "\\'")
        runs = self.store._search_all(list(experiments), f"tags.`{key}` = '{quoted}'", None)
        return [run.info.run_id for run in runs]

    def job_runs(self, job_id: str | None = None) -> list[StoredRun]:
        """As :meth:`SqliteReader.job_runs`."""
        experiments = self._experiments()
        if not experiments:
            return []
        runs = self.store._search_all(list(experiments), "", None)
        parents = {r.data.tags.get(Tag.PARENT) for r in runs}
        parents |= {r.info.run_id for r in runs if r.data.tags.get(Tag.RUN_KIND) == RUN_KIND_SWEEP}
        members = [
            r for r in runs
            if r.data.tags.get(Tag.JOB_ID) or r.data.tags.get(Tag.PARENT) or r.info.run_id in parents
        ]  # fmt: skip
        if job_id is not None:
            wanted = {r.info.run_id for r in members if r.data.tags.get(Tag.JOB_ID, "").startswith(job_id)}
            wanted |= {p for p in parents if p and p.startswith(job_id)}
            wanted |= {r.data.tags[Tag.PARENT] for r in members if r.info.run_id in wanted and r.data.tags.get(Tag.PARENT)}
            members = [r for r in members if r.info.run_id in wanted or r.data.tags.get(Tag.PARENT) in wanted]
        return [self.store._stored_run(run, experiments, params=Param.CHECKPOINT_DIRS, progress=True) for run in members]

    def _experiments(self) -> dict[str, str]:
        from mlflow.entities import ViewType

        found = self.store.client.search_experiments(view_type=ViewType.ACTIVE_ONLY)
        return {e.experiment_id: e.name for e in found}


def open_reader(tracking_uri: str, store: RunStore | None = None) -> SqliteReader | ClientReader:
    """The direct SQLite reader when the store is a SQLite file whose schema it knows (or that
    does not exist, or is being created: no runs yet), else the client.

    The client is never opened on a store that is being created: opening it runs MLflow's
    migrations, which race with the sweep creating the same tables.
    """
    path = sqlite_path(tracking_uri)
    if path is not None:
        reader = SqliteReader(path)
        if reader.schema() in (KNOWN, INCOMPLETE):
            return reader
    return ClientReader(store or RunStore(tracking_uri))
