"""The leader of a job's process group: runs ``foxhunt-train -m``, tags the parent run, and
settles what training could not.

``python -m foxhunt.jobs.supervisor <launch file> --lock-fd N -- <command>`` is what ``foxhunt
train start`` launches in a new session. The command it runs (``foxhunt-train -m`` and the job's
checked overrides) comes from the launcher, as arguments: the launch file's copy is for display,
and a file anyone who can write ``outputs/jobs`` could swap between two writes never names what
runs. Why a process of its own rather than ``foxhunt-train`` directly:

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

The job's lock (:mod:`foxhunt.jobs.job_lock`), inherited from the launcher as the descriptor
``--lock-fd N``, is kept open here and handed to training: the job cannot be launched again
until both have exited.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from foxhunt.errors import TAG_TEXT_LIMIT, one_line
from foxhunt.jobs.job_lock import LOCK_FD_FLAG
from foxhunt.jobs.launch_file import LaunchFile, job_tags
from foxhunt.jobs.views import Job, find_job, log_tail
from foxhunt.runs.liveness import on_this_host, run_state
from foxhunt.runs.provenance import source_tags
from foxhunt.runs.status import Status
from foxhunt.runs.store import RunStore
from foxhunt.runs.tags import Tag

# Lazy imports: (e) mlflow, once training's process is started: the job's leader does not delay it by MLflow's import

log = logging.getLogger("foxhunt.jobs.supervisor")

# How often the store is polled for the parent run, and how many log lines make an error tag:
# process settings of the supervisor, not training hyperparameters.
POLL_S = 1.0
ERROR_LINES = 5
COMMAND_SEPARATOR = "--"  # before the command to run, in the supervisor's arguments
DEFAULT_EXPERIMENT = "foxhunt"  # conf/train.yaml's task, for a launch file that names none
SOURCE = "foxhunt train start"  # the Source of the run it creates for a job that never reached the store


class Supervisor:
    def __init__(self, launch_file: LaunchFile, command: list[str], lock_fd: int | None = None) -> None:
        self.launch_file = launch_file
        self.command = command  # what to run: the launcher's argument, not the launch file's copy (display only)
        self.lock_fd = lock_fd  # the job's lock, held open for the process's life and handed to training
        self.stop_signal: int | None = None
        self.tagged_parent: str | None = None
        self.store = RunStore(launch_file.tracking_uri)

    def _on_signal(self, signum: int, frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
            print(f"foxhunt job {self.launch_file.job_id}: {signal.Signals(signum).name} received, "
                  "waiting for training to stop", flush=True)  # fmt: skip

    def run(self) -> int:
        # A handler (not SIG_IGN): the training process execs with default dispositions, so the
        # group's SIGTERM still reaches Lightning there.
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        kept = (self.lock_fd,) if self.lock_fd is not None else ()
        child = subprocess.Popen(self.command, cwd=self.launch_file.root, pass_fds=kept)
        # mlflow is imported while training starts, not when the parent appears; the client is
        # not opened yet: opening it creates a missing store, which the sweep is creating
        # (two processes creating one SQLite store crash).
        import mlflow.tracking  # noqa: F401

        rc: int | None = None
        while rc is None:
            try:
                rc = child.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                self._tag_parent()
        self._tag_parent()
        self._settle(rc)
        return rc if rc >= 0 else 128 - rc

    # -- tags ----------------------------------------------------------------------------
    def _job(self) -> Job | None:
        try:
            return find_job(self.launch_file.tracking_uri, self.launch_file.job_id)
        except LookupError:
            return None
        except Exception:  # a store busy or not created yet: try again at the next poll
            log.debug("job %s not readable yet", self.launch_file.job_id, exc_info=True)
            return None

    def tags(self) -> dict[str, str]:
        launch_file = self.launch_file
        tags = job_tags(launch_file.job_id, os.getpid(), display_command(launch_file.command), launch_file.overrides)
        tags[Tag.JOB_LOG] = launch_file.log
        tags[Tag.JOB_SWEEP_DIR] = launch_file.sweep_dir
        plan = json.dumps([cell.to_dict() for cell in launch_file.plan])
        if len(plan) <= TAG_TEXT_LIMIT:  # a larger grid keeps its plan in the launch file
            tags[Tag.JOB_PLAN] = plan
        return tags

    def _parent_run_id(self) -> str | None:
        """This launch's parent run: the sweep's run for our sweep folder (tag ``sweep_dir``,
        set when the sweep creates or reopens it), RUNNING; else the job's parent found through
        its cells' job id."""
        try:
            reader = self.store.reader()
            for run_id in reader.run_ids_with_tag(Tag.SWEEP_DIR, str(Path(self.launch_file.sweep_dir).resolve())):
                if self.store.get(run_id).status == Status.RUNNING:
                    return run_id
        except Exception:  # a store not created yet, or busy: try again at the next poll
            log.debug("parent of job %s not readable yet", self.launch_file.job_id, exc_info=True)
            return None
        job = self._job()
        if job is not None and job.parent is not None and job.parent.status == Status.RUNNING:
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
            self.store.tag(run_id, self.tags())
            self.tagged_parent = run_id
        except Exception:  # the store is shared with training: a locked database, retry later
            log.warning("could not tag the parent run of job %s yet", self.launch_file.job_id, exc_info=True)

    # -- the end -------------------------------------------------------------------------
    def _settle(self, rc: int) -> None:
        stopped = self.stop_signal is not None or rc in (-signal.SIGTERM, -signal.SIGINT, -signal.SIGKILL)
        job = self._job()
        error = one_line(log_tail(self.launch_file.log, ERROR_LINES), TAG_TEXT_LIMIT, separator=" | ", keep_end=True)
        if job is None or (job.parent is None and not job.runs):
            self._record_failure(Status.KILLED if stopped else Status.FAILED, error)
            return
        runs = ([job.parent] if job.parent else []) + job.runs
        for run in runs:
            if run.status != Status.RUNNING:
                continue
            # Training has exited, and a sweep waits for all its cells: a cell still RUNNING on
            # another host is over too. One alive here is another launcher's: not ours to end.
            if run is not job.parent and on_this_host(run) and run_state(run) == Status.RUNNING:
                continue
            if stopped:
                status, tags = Status.KILLED, {Tag.STOP_REASON: _signal_name(self.stop_signal, rc)}
            elif run is job.parent and rc == 0:
                status, tags = Status.FINISHED, {}
            else:
                status, tags = Status.FAILED, {Tag.ERROR: error or f"training exited with status {rc}"}
            try:
                self.store.end(run.run_id, status, tags)
            except Exception:
                log.exception("could not end run %s of job %s", run.run_id, self.launch_file.job_id)

    def _record_failure(self, status: str, error: str) -> None:
        """Nothing reached the store: create a run for the job so that it is listed."""
        experiment = self.launch_file.experiment or DEFAULT_EXPERIMENT
        try:
            experiment_id = self.store.ensure_experiment(experiment, self.launch_file.artifact_location or None)
            tags = {**source_tags(SOURCE), **self.tags()}
            if status == Status.FAILED:
                tags[Tag.ERROR] = error or "training exited before creating a run"
            else:
                tags[Tag.STOP_REASON] = _signal_name(self.stop_signal, 0)
            run_id = self.store.create(experiment_id, f"job-{self.launch_file.job_id}", tags)
            self.store.end(run_id, status)
        except Exception:
            log.exception("could not record job %s in %s", self.launch_file.job_id, self.launch_file.tracking_uri)


def display_command(command: list[str]) -> list[str]:
    """The command as a user would type it: ``foxhunt-train`` without its folder."""
    if command and Path(command[0]).name == "foxhunt-train":
        return ["foxhunt-train", *command[1:]]
    return list(command)


def _signal_name(signum: int | None, rc: int) -> str:
    if signum is not None:
        return signal.Signals(signum).name
    return signal.Signals(-rc).name if rc < 0 else "stop"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    lock_fd = None
    command: list[str] = []
    if COMMAND_SEPARATOR in argv:  # the command to run: from the launcher, never from the launch file (module doc)
        at = argv.index(COMMAND_SEPARATOR)
        argv, command = argv[:at], argv[at + 1 :]
    if len(argv) == 3 and argv[1] == LOCK_FD_FLAG and argv[2].isdigit():
        argv, lock_fd = argv[:1], int(argv[2])
    if len(argv) != 1 or not command:
        print(f"usage: python -m foxhunt.jobs.supervisor <launch file .json> [{LOCK_FD_FLAG} N] {COMMAND_SEPARATOR} <command>",
              file=sys.stderr)  # fmt: skip
        return 2
    path = Path(argv[0])
    launch_file = None
    for _ in range(50):  # the launcher writes the file's pid right after starting us
        try:
            launch_file = LaunchFile.read(path)
            break
        except (OSError, ValueError):
            time.sleep(0.1)
    if launch_file is None:
        print(f"foxhunt job: cannot read launch file {path}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return Supervisor(launch_file, command, lock_fd).run()


if __name__ == "__main__":
    sys.exit(main())
