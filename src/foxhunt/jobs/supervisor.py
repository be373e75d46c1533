"""The leader of a job's process group: runs ``foxhunt-train -m``, tags the parent run, and
settles what training could not.

``python -m foxhunt.jobs.supervisor <launch record>`` is what ``foxhunt train start`` launches
in a new session. Why a process of its own rather than ``foxhunt-train`` directly:

- The parent run is created by the sweep inside ``foxhunt-train``; the job's tags (leader
  pid, host, command, overrides, plan, log) are known only to the launcher. The supervisor
  waits for the parent to appear in the store and sets them, so the sweep code needs to know
  nothing about jobs.
- SIGTERM reaches the whole group. Lightning turns it into a clean KILLED for the cell in
  ``fit``; but the Hydra process itself then exits from a ``SystemExit`` (or, outside ``fit``,
  from the default SIGTERM action) without ending the parent run, which would stay RUNNING
  for ever. The supervisor records the stop request (it handles SIGTERM instead of dying),
  waits for training to exit, then ends every run of the job still RUNNING whose process is
  gone: KILLED after a stop request, FAILED (with the log's last lines as the ``error`` tag)
  when training crashed, FINISHED for a parent left open by a clean exit.
- A job that dies before anything reaches the store (a crash at import) still gets a run:
  the supervisor creates one, FAILED with the error, so ``foxhunt train list`` and the MLflow UI
  show it.

After ``kill -9`` of the group nothing runs this, and the job shows as STALE until resumed.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from foxhunt.jobs.records import (
    FAILED,
    FINISHED,
    KILLED,
    RUNNING,
    TAG_ERROR,
    TAG_LOG,
    TAG_PLAN,
    TAG_STOP_REASON,
    TAG_SWEEP_DIR,
    TAG_SWEEP_DIR_OF_PARENT,
    Job,
    LaunchRecord,
    find_job,
    job_tags,
    log_tail,
    open_reader,
    process_alive,
)

log = logging.getLogger("foxhunt.jobs.supervisor")

# How often the store is polled for the parent run, and how many log lines make an error tag:
# process settings of the supervisor, not training hyperparameters.
POLL_S = 1.0
ERROR_LINES = 5
TAG_VALUE_LIMIT = 5000  # as foxhunt.tracking.mlflow_store (not imported: it imports lightning)
DEFAULT_EXPERIMENT = "foxhunt"  # conf/train.yaml's task, for a launch record that names none


class Supervisor:
    def __init__(self, record: LaunchRecord) -> None:
        self.record = record
        self.stop_signal: int | None = None
        self.tagged_parent: str | None = None
        self._client = None

    @property
    def client(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(self.record.tracking_uri)
        return self._client

    def _on_signal(self, signum: int, frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
            print(f"foxhunt job {self.record.job_id}: {signal.Signals(signum).name} received, "
                  "waiting for training to stop", flush=True)  # fmt: skip

    def run(self) -> int:
        # A handler (not SIG_IGN): the training process execs with default dispositions, so the
        # group's SIGTERM still reaches Lightning there.
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        child = subprocess.Popen(self.record.command, cwd=self.record.root)
        _ = self.client  # import mlflow while training starts, not when the parent appears
        while True:
            try:
                rc = child.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                self._tag_parent()
        self._tag_parent()
        self._settle(rc)
        return rc if rc >= 0 else 128 - rc

    # -- tags ----------------------------------------------------------------------------
    def _job(self) -> Job | None:
        try:
            return find_job(self.record.tracking_uri, self.record.job_id)
        except LookupError:
            return None
        except Exception:  # a store busy or not created yet: try again at the next poll
            log.debug("job %s not readable yet", self.record.job_id, exc_info=True)
            return None

    def tags(self) -> dict[str, str]:
        import json

        record = self.record
        tags = job_tags(record.job_id, os.getpid(), display_command(record.command), record.overrides)
        tags[TAG_LOG] = record.log
        tags[TAG_SWEEP_DIR] = record.sweep_dir
        plan = json.dumps([cell.to_dict() for cell in record.plan])
        if len(plan) <= TAG_VALUE_LIMIT:  # a larger grid keeps its plan in the launch record
            tags[TAG_PLAN] = plan
        return tags

    def _parent_run_id(self) -> str | None:
        """This launch's parent run: the sweep's run for our sweep folder (tag ``sweep_dir``,
        set when the sweep creates or reopens it), RUNNING; else the job's parent found through
        its cells' job id."""
        try:
            reader = open_reader(self.record.tracking_uri)
            for run_id in reader.run_ids_with_tag(TAG_SWEEP_DIR_OF_PARENT, str(Path(self.record.sweep_dir).resolve())):
                if self.client.get_run(run_id).info.status == RUNNING:
                    return run_id
        except Exception:  # a store not created yet, or busy: try again at the next poll
            log.debug("parent of job %s not readable yet", self.record.job_id, exc_info=True)
            return None
        job = self._job()
        if job is not None and job.parent is not None and job.parent.status == RUNNING:
            return job.parent.run_id
        return None

    def _tag_parent(self) -> None:
        """Tag this launch's parent run as soon as it is in the store, RUNNING (on resume, the
        previous launch's parent is not ours until the sweep reopens it)."""
        if self.tagged_parent is not None:
            return
        run_id = self._parent_run_id()
        if run_id is None:
            return
        try:
            for key, value in self.tags().items():
                self.client.set_tag(run_id, key, value)
            self.tagged_parent = run_id
        except Exception:  # the store is shared with training: a locked database, retry later
            log.warning("could not tag the parent run of job %s yet", self.record.job_id, exc_info=True)

    # -- the end -------------------------------------------------------------------------
    def _settle(self, rc: int) -> None:
        stopped = self.stop_signal is not None or rc in (-signal.SIGTERM, -signal.SIGINT, -signal.SIGKILL)
        job = self._job()
        error = _one_line(log_tail(self.record.log, ERROR_LINES))
        if job is None or (job.parent is None and not job.runs):
            self._record_failure(KILLED if stopped else FAILED, error)
            return
        runs = ([job.parent] if job.parent else []) + job.runs
        for run in runs:
            if run.status != RUNNING:
                continue
            pid = run.tags.get("pid", "")
            alive = pid.isdigit() and int(pid) != os.getpid() and process_alive(int(pid), run.last_seen_ms())
            if run is not job.parent and alive:
                continue  # a worker still alive (another launcher's): not ours to end
            if stopped:
                status = KILLED
            elif run is job.parent and rc == 0:
                status = FINISHED
            else:
                status = FAILED
            try:
                if status == KILLED:
                    self.client.set_tag(run.run_id, TAG_STOP_REASON, _signal_name(self.stop_signal, rc))
                elif status == FAILED:
                    self.client.set_tag(run.run_id, TAG_ERROR, error or f"training exited with status {rc}")
                self.client.set_terminated(run.run_id, status)
            except Exception:
                log.exception("could not end run %s of job %s", run.run_id, self.record.job_id)

    def _record_failure(self, status: str, error: str) -> None:
        """Nothing reached the store: create a run for the job so that it is listed."""
        from mlflow.exceptions import MlflowException

        from foxhunt.jobs.records import sqlite_path

        experiment_name = self.record.experiment or DEFAULT_EXPERIMENT
        artifacts = self.record.artifact_location or None
        try:
            path = sqlite_path(self.record.tracking_uri)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
            experiment = self.client.get_experiment_by_name(experiment_name)
            if experiment is None:
                try:
                    location = Path(artifacts).resolve().as_uri() if artifacts else None
                    experiment_id = self.client.create_experiment(experiment_name, artifact_location=location)
                except MlflowException:
                    experiment_id = self.client.get_experiment_by_name(experiment_name).experiment_id
            else:
                experiment_id = experiment.experiment_id
            tags = self.tags()
            if status == FAILED:
                tags[TAG_ERROR] = error or "training exited before creating a run"
            else:
                tags[TAG_STOP_REASON] = _signal_name(self.stop_signal, 0)
            run = self.client.create_run(experiment_id, run_name=f"job-{self.record.job_id}", tags=tags)
            self.client.set_terminated(run.info.run_id, status)
        except Exception:
            log.exception("could not record job %s in %s", self.record.job_id, self.record.tracking_uri)


def display_command(command: list[str]) -> list[str]:
    """The command as a user would type it: ``foxhunt-train`` without its folder."""
    if command and Path(command[0]).name == "foxhunt-train":
        return ["foxhunt-train", *command[1:]]
    return list(command)


def _signal_name(signum: int | None, rc: int) -> str:
    if signum is not None:
        return signal.Signals(signum).name
    return signal.Signals(-rc).name if rc < 0 else "stop"


def _one_line(text: str) -> str:
    line = " | ".join(" ".join(part.split()) for part in text.splitlines() if part.strip())
    return line if len(line) <= TAG_VALUE_LIMIT else "..." + line[-(TAG_VALUE_LIMIT - 3):]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m foxhunt.jobs.supervisor <launch record .json>", file=sys.stderr)
        return 2
    path = Path(argv[0])
    record = None
    for _ in range(50):  # the launcher writes the record's pid right after starting us
        try:
            record = LaunchRecord.read(path)
            break
        except (OSError, ValueError):
            time.sleep(0.1)
    if record is None:
        print(f"foxhunt job: cannot read launch record {path}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return Supervisor(record).run()


if __name__ == "__main__":
    sys.exit(main())
