"""The MLflow store every foxhunt run writes to, and the lifecycle of one run in it.

Conventions (../shared/DESIGN.md): one store for all runs (SQLite database ``mlruns/mlflow.db``
with artifacts under ``mlruns/artifacts/``; MLflow 3.17+ refuses the plain file store);
experiment = the config's ``task``; run name ``{model}-{asset}-{precision}``; tags ``model,
asset, precision, strategy, job_id, sweep_id``; params = the resolved config flattened to dotted
keys, values truncated to MLflow's limit; the resolved config also as ``config.yaml``; the run
ends FINISHED, FAILED (error text as a tag) or KILLED, whatever happened.

Sweeps: a sweep is a parent run and each cell a nested run (tag ``mlflow.parentRunId``, which
the MLflow UI uses to group them); ``resume=true`` reopens an interrupted cell's run
(``resume_run_id``) so the resumed training continues the same metrics and artifacts.

Lightning's ``MLFlowLogger`` is used for metrics only, attached to the run this module created
(``run_id``): its ``finalize`` would mark the run FINISHED as soon as ``fit`` returns, before
the test split is scored, so :class:`AttachedMLFlowLogger` leaves the run's status to
:class:`TrackedRun`, which sets it once, at the very end.
"""

from __future__ import annotations

import logging
import os
import socket
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import MLFlowLogger

log = logging.getLogger(__name__)

# MLflow's limits (mlflow.utils.validation): param values up to 6000 characters, tag values up
# to 8000 (5000 kept for error text), 100 params per batch call.
PARAM_VALUE_LIMIT = 6000
TAG_VALUE_LIMIT = 5000
PARAMS_PER_BATCH = 100
EXPERIMENT_KIND_TAG = ("mlflow.experimentKind", "custom_model_development")
PARENT_RUN_TAG = "mlflow.parentRunId"  # MLflow's own tag for nested runs
RESUME_COUNT_TAG = "resume_count"


def ensure_store(tracking_uri: str) -> None:
    """Create the folder of a SQLite store (``sqlite:///path/mlflow.db``) if it is missing."""
    prefix = "sqlite:///"
    if tracking_uri.startswith(prefix):
        Path(tracking_uri[len(prefix):]).parent.mkdir(parents=True, exist_ok=True)


def ensure_experiment(tracking_uri: str, name: str, artifact_location: str | None) -> str:
    """Return the id of experiment ``name``, creating the store and the experiment if needed.

    Sweeps call this in the parent process before any job starts: parallel jobs that first
    touch a fresh SQLite store race to create its tables and crash.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    ensure_store(tracking_uri)
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    location = Path(artifact_location).resolve().as_uri() if artifact_location else None
    try:
        return client.create_experiment(name, artifact_location=location, tags=dict([EXPERIMENT_KIND_TAG]))
    except MlflowException:  # created by a concurrent process in between: use theirs
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def flatten(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Dotted ``(key, value)`` pairs of a nested mapping; lists stay values."""
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from flatten(value, f"{dotted}.")
        else:
            yield dotted, value


def param_value(value: Any) -> str:
    text = str(value)
    return text if len(text) <= PARAM_VALUE_LIMIT else text[: PARAM_VALUE_LIMIT - 3] + "..."


def one_line(text: str, limit: int = TAG_VALUE_LIMIT) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class AttachedMLFlowLogger(MLFlowLogger):
    """Lightning's MLflow logger attached to an existing run whose lifecycle it does not own.

    ``log_hyperparams`` is a no-op because the run's params are the resolved config, logged by
    :class:`TrackedRun` (logging the module's hparams again would duplicate them under other
    keys). ``finalize`` flushes nothing and leaves the status alone.
    """

    def log_hyperparams(self, params: Any) -> None:  # noqa: D102
        return None

    def finalize(self, status: str = "success") -> None:  # noqa: D102
        return None


class TrackedRun:
    """One MLflow run, from creation to its final status.

    Use as a context manager: the run is created on enter; on a clean exit it ends FINISHED;
    on an exception it ends FAILED with the error's text as the ``error`` tag and the traceback
    as ``error.txt``; on a stop request (Ctrl-C, SIGTERM, ``SystemExit``) it ends KILLED. The
    exception is never swallowed.

    ``parent_run_id`` nests the run under a sweep's parent run. ``resume_run_id`` reopens that
    existing run instead of creating one: its status goes back to RUNNING, an earlier ``error``
    tag is removed, ``resume_count`` goes up, and the params are not logged again (they were,
    and MLflow refuses to change a param's value; the config's folders differ per attempt).
    """

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        artifact_location: str | None,
        run_name: str,
        tags: Mapping[str, str],
        parent_run_id: str | None = None,
        resume_run_id: str | None = None,
    ) -> None:
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri
        self.experiment_name = experiment
        self.experiment_id = ensure_experiment(tracking_uri, experiment, artifact_location)
        self.client = MlflowClient(tracking_uri)
        self.run_name = run_name
        self.tags = {**_default_tags(), **{k: str(v) for k, v in tags.items()}}
        if parent_run_id:
            self.tags[PARENT_RUN_TAG] = parent_run_id
        self.resume_run_id = resume_run_id
        self.run_id: str | None = None
        self.status: str | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> "TrackedRun":
        if self.resume_run_id:
            self._reopen(self.resume_run_id)
        else:
            run = self.client.create_run(self.experiment_id, run_name=self.run_name, tags=self.tags)
            self.run_id = run.info.run_id
        log.info("MLflow run %s (%s) in %s", self.run_name, self.run_id, self.tracking_uri)
        return self

    def _reopen(self, run_id: str) -> None:
        previous = self.client.get_run(run_id)
        self.run_id = run_id
        self.client.update_run(run_id, status="RUNNING")
        if "error" in previous.data.tags:
            self.client.delete_tag(run_id, "error")
        count = int(previous.data.tags.get(RESUME_COUNT_TAG, "0")) + 1
        self.set_tags({**self.tags, RESUME_COUNT_TAG: count})

    def __exit__(self, exc_type, exc, tb) -> bool:
        from foxhunt.jobs.graceful_stop import is_stop_request

        if exc is None:
            self.status = "FINISHED"
        elif is_stop_request(exc) or isinstance(exc, SystemExit):
            self.status = "KILLED"
            self.client.set_tag(self.run_id, "stop_reason", type(exc).__name__)
        else:
            self.status = "FAILED"
            self._record_error(exc)
        self.client.set_terminated(self.run_id, self.status)
        return False

    def _record_error(self, exc: BaseException) -> None:
        try:
            self.client.set_tag(self.run_id, "error", one_line(f"{type(exc).__name__}: {exc}"))
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            self.client.log_text(self.run_id, text, "error.txt")
        except Exception:  # never hide the original error behind a logging failure
            log.exception("could not record the error in MLflow run %s", self.run_id)

    # -- content -------------------------------------------------------------------------
    def logger(self) -> AttachedMLFlowLogger:
        return AttachedMLFlowLogger(
            experiment_name=self.experiment_name, tracking_uri=self.tracking_uri, run_id=self.run_id
        )

    def log_config(self, resolved: Mapping[str, Any], yaml_text: str) -> None:
        from mlflow.entities import Param

        if self.resume_run_id:  # a reopened run has its params already
            self.client.log_text(self.run_id, yaml_text, "config.yaml")
            return
        params = [Param(key, param_value(value)) for key, value in flatten(resolved)]
        for start in range(0, len(params), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[start : start + PARAMS_PER_BATCH])
        self.client.log_text(self.run_id, yaml_text, "config.yaml")

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, float(value), now, step or 0) for key, value in metrics.items()]
        for start in range(0, len(batch), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[start : start + PARAMS_PER_BATCH])

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(key, str(value)) for key, value in tags.items()])


def _default_tags() -> dict[str, str]:
    return {
        "host": socket.gethostname(),
        "pid": str(os.getpid()),
        "job_id": os.environ.get("FOXHUNT_JOB_ID", ""),
    }
