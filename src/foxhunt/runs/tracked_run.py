"""One run in the store, from its creation to its final status; and Lightning's logger on it.

Conventions: experiment = the config's ``task``; run name ``{model}-{asset}-{precision}``;
params = the resolved config flattened to dotted keys (values truncated to MLflow's limit);
the resolved config also as ``config.yaml``; the run ends FINISHED, FAILED (error text as a
tag, traceback as ``error.txt``) or KILLED, whatever happened.

Sweeps: a sweep is a parent run and each cell a nested run (tag ``mlflow.parentRunId``, which
the MLflow UI uses to group them); ``resume=true`` reopens an interrupted cell's run
(``resume_run_id``) so the resumed training continues the same metrics and artifacts.

Lightning's ``MLFlowLogger`` is used for metrics only, attached to the run this module created
(``run_id``): its ``finalize`` would mark the run FINISHED as soon as ``fit`` returns, before
the test split is scored, so :class:`AttachedMLFlowLogger` leaves the run's status to
:class:`TrackedRun`, which sets it once, at the very end.
"""

from __future__ import annotations

import hashlib
import logging
import os
import traceback
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.loggers import MLFlowLogger

from foxhunt.errors import error_line
from foxhunt.runs.provenance import DatasetProvenance, process_tags, source_tags
from foxhunt.runs.status import Status, ending_status
from foxhunt.runs.store import RunStore
from foxhunt.runs.tags import Tag

log = logging.getLogger(__name__)

CONFIG_ARTIFACT = "config.yaml"
ERROR_ARTIFACT = "error.txt"


def flatten(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Dotted ``(key, value)`` pairs of a nested mapping; lists stay values."""
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from flatten(value, f"{dotted}.")
        else:
            yield dotted, value


class AttachedMLFlowLogger(MLFlowLogger):
    """Lightning's MLflow logger attached to an existing run whose lifecycle it does not own.

    ``log_hyperparams`` is a no-op because the run's params are the resolved config, logged by
    :class:`TrackedRun` (logging the module's hparams again would duplicate them under other
    keys). ``finalize`` flushes nothing and leaves the status alone.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_written: dict[str, tuple[int | None, float]] = {}  # key -> (step, value) written last

    def log_hyperparams(self, params: Any) -> None:  # noqa: D102
        return None

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Lightning's, without a value this logger already wrote at the same step: Lightning
        adds ``epoch`` to every call, so a step whose training and validation metrics are logged
        separately would hold ``epoch`` twice (one value per metric and step)."""
        fresh = {k: v for k, v in metrics.items() if self._last_written.get(k) != (step, float(v))}
        self._last_written.update({k: (step, float(v)) for k, v in fresh.items()})
        if fresh:
            super().log_metrics(fresh, step)

    def finalize(self, status: str = "success") -> None:  # noqa: D102
        return None


def trainer_runs(trainer) -> list[tuple[RunStore, str]]:
    """``(store, run id)`` of each MLflow logger of ``trainer`` that has a run: how a callback
    writes metrics, tags and artifacts to MLflow (through the store, sharing the logger's
    client; a logger's metric prefix is not applied: foxhunt's loggers have none)."""
    return [(RunStore.sharing(logger.experiment), logger.run_id) for logger in trainer.loggers
            if isinstance(logger, MLFlowLogger) and logger.run_id]  # fmt: skip


class TrackedRun:
    """One MLflow run, from creation to its final status.

    Use as a context manager: the run is created on enter; on a clean exit it ends FINISHED;
    on an exception it ends FAILED with the error's text as the ``error`` tag and the traceback
    as ``error.txt``; on a stop request (Ctrl-C, SIGTERM, ``SystemExit``) it ends KILLED. The
    exception is never swallowed.

    ``source`` is the entry point and command that started it (the Source column,
    :mod:`foxhunt.runs.provenance`). ``parent_run_id`` nests the run under a sweep's parent run.
    ``resume_run_id`` reopens that existing run instead of creating one
    (:meth:`RunStore.reopen`), and the params are not logged again (they were, and MLflow
    refuses to change a param's value; the config's folders differ per attempt).
    """

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        artifact_location: str | None,
        run_name: str,
        tags: Mapping[str, Any],
        parent_run_id: str | None = None,
        resume_run_id: str | None = None,
        source: str | None = None,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.store = RunStore(tracking_uri)
        self.experiment_name = experiment
        self.experiment_id = self.store.ensure_experiment(experiment, artifact_location)
        self.run_name = run_name
        self.tags = {**process_tags(), **(source_tags(source) if source else {}), **{k: str(v) for k, v in tags.items()}}
        if parent_run_id:
            self.tags[Tag.PARENT] = parent_run_id
        self.resume_run_id = resume_run_id
        self._run_id: str | None = None
        self.status: Status | None = None

    @property
    def run_id(self) -> str:
        """The run's id, once entered (created or reopened); RuntimeError before (a bug)."""
        if self._run_id is None:
            raise RuntimeError(
                f"TrackedRun {self.run_name}: the run has no id before it is entered (with TrackedRun(...) as run)"
            )
        return self._run_id

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> TrackedRun:
        if self.resume_run_id:
            # its name too: a search's retry resumes its failed trial's run as trial<N+1> (it kept trial<N>'s name
            # under the retry's trial tag)
            self.store.reopen(self.resume_run_id, {**self.tags, Tag.RUN_NAME: self.run_name})
            self._run_id = self.resume_run_id
        else:
            self._run_id = self.store.create(self.experiment_id, self.run_name, self.tags)
        log.info("MLflow run %s (%s) in %s", self.run_name, self.run_id, self.tracking_uri)
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        self.status = ending_status(exc)
        tags = {}
        if self.status == Status.KILLED:
            tags[Tag.STOP_REASON] = type(exc).__name__
        elif self.status == Status.FAILED:
            tags[Tag.ERROR] = error_line(exc)  # the line the user reads on stderr
            self._record_traceback(exc)
        self.store.end(self.run_id, self.status, tags)
        return False

    def _record_traceback(self, exc: BaseException) -> None:
        try:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            self.store.log_text(self.run_id, text, ERROR_ARTIFACT)
        except Exception:  # never hide the original error behind a logging failure
            log.exception("could not record the error in MLflow run %s", self.run_id)

    # -- content -------------------------------------------------------------------------
    def logger(self) -> AttachedMLFlowLogger:
        return AttachedMLFlowLogger(experiment_name=self.experiment_name, tracking_uri=self.tracking_uri, run_id=self.run_id)

    def log_config(self, resolved: Mapping[str, Any], yaml_text: str) -> None:
        if not self.resume_run_id:  # a reopened run has its params already
            self.store.log_params(self.run_id, flatten(resolved))
        self.store.log_text(self.run_id, yaml_text, CONFIG_ARTIFACT)
        # the file's digest in the tracking store, the record foxhunt trusts: reproduce, register and a roll's
        # challenger read the artifact back only if it is this (foxhunt.training.reproduce.check_stored_hash)
        self.store.tag(self.run_id, {Tag.CONFIG_DIGEST: hashlib.sha256(yaml_text.encode("utf-8")).hexdigest()})

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.store.log_metrics(self.run_id, metrics, step)

    def system_metrics(self, interval_s: float | None) -> AbstractContextManager:
        """The machine's use logged as ``system/*`` every ``interval_s`` seconds while the block
        runs (:meth:`RunStore.system_metrics`); None or 0: not sampled."""
        return self.store.system_metrics(self.run_id, float(interval_s)) if interval_s else nullcontext()

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        self.store.log_artifact(self.run_id, Path(path), artifact_path)

    def log_datasets(self, datasets: Iterable[DatasetProvenance]) -> None:
        self.store.log_datasets(self.run_id, datasets)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self.store.tag(self.run_id, tags)
