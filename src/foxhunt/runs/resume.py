"""``resume=true``: what to do with a run whose config (same ``config_hash``) was tried before.

- a FINISHED run exists: skip, and report that run's metrics;
- else the most recent FAILED, KILLED or stale RUNNING run with a resumable checkpoint
  (:mod:`foxhunt.runs.checkpoints`: the rule ``foxhunt train status`` shows too): reopen that
  MLflow run and fit from the checkpoint; a run RUNNING on this host with its process alive,
  or RUNNING on another host (:mod:`foxhunt.runs.liveness`: the rule of the job views), is
  left alone;
- else train from scratch in a new run.

A resumed run continues from its checkpoint's step: :func:`rewind_run` first removes the metric
values logged after that step (a ``kill -9`` lost their training), so no step is logged twice.

:meth:`ResumePlan.describe` says which, in one line, for the log and the sweep's summary;
when the store holds no run of the config, or none that can be continued, the line says so
and names the hash, so that a changed setting is not silently a new training.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from foxhunt.runs.checkpoints import resumable_checkpoint
from foxhunt.runs.liveness import run_state
from foxhunt.runs.records import RunRecord
from foxhunt.runs.status import Status
from foxhunt.runs.store import RunStore
from foxhunt.runs.tags import Tag

log = logging.getLogger(__name__)

FRESH, SKIP, RESUME = "fresh", "skip", "resume"
RESUMABLE_STATES = (Status.FAILED, Status.KILLED, Status.STALE)
CHECKPOINT_DOWNLOADS = "resume"  # folder, in the run's output folder, for logged checkpoints fetched


@dataclass
class ResumePlan:
    action: str = FRESH
    run_id: str | None = None
    checkpoint: Path | None = None
    previous_status: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    wall_s: float | None = None
    parent_run_id: str | None = None  # the sweep parent run the earlier run is nested in
    why_fresh: str = ""  # FRESH: what the store holds of this config

    def describe(self) -> str:
        if self.action == SKIP:
            return skip_note(self.run_id)
        if self.action == RESUME:
            return f"resumed {self.previous_status} run {self.run_id} from {self.checkpoint.name}"
        return f"from scratch: {self.why_fresh}" if self.why_fresh else "from scratch"


def skip_note(run_id: str | None) -> str:
    """How a skipped cell is described everywhere (the sweep's summary, ``foxhunt train status``)."""
    return f"skipped: FINISHED earlier in run {run_id}"


def plan_resume(tracking_uri: str, experiment: str, digest: str, download_dir: Path) -> ResumePlan:
    """The plan for a run with config hash ``digest`` (see the module doc); a checkpoint logged
    to the run but not on this machine is downloaded into ``download_dir``."""
    store = RunStore(tracking_uri)
    runs = store.search(experiment, tags={Tag.CONFIG_HASH: digest})
    for run in runs:
        if run.status == Status.FINISHED:
            wall = (run.end_ms - run.start_ms) / 1000 if run.end_ms else None
            return ResumePlan(SKIP, run.run_id, None, Status.FINISHED, run.metric_values(), wall, run.parent_id)
    if not runs:
        return ResumePlan(why_fresh=f"no earlier run with config_hash {digest} in experiment {experiment!r}")
    left: list[str] = []
    for run in runs:
        state = run_state(run)
        if state not in RESUMABLE_STATES:
            left.append(_left_alone(run, state))
            continue
        checkpoint = resumable_checkpoint(run, lambda r: store.logged_files(r.run_id, "checkpoints"))
        if checkpoint is None:
            left.append(f"{run.run_id} {state} without a checkpoint")
            continue
        path = checkpoint.path
        if checkpoint.artifact is not None:  # a logged copy: fetched next to this attempt
            path = store.download(run.run_id, checkpoint.artifact, download_dir)
        return ResumePlan(RESUME, run.run_id, path, state)
    return ResumePlan(why_fresh=f"no run with config_hash {digest} to continue ({'; '.join(left)})")


def rewind_run(tracking_uri: str, run_id: str, step: int, saved_at_ms: int) -> None:
    """Before a run continues from a checkpoint of step ``step`` taken at ``saved_at_ms``: the
    metric values it logged after it (work lost with a kill) leave the store, so each step is
    logged once."""
    removed = RunStore(tracking_uri).forget_metrics_after(run_id, step, saved_at_ms)
    if removed:
        log.info("run %s: %d metric values logged after step %d (lost with the stop) removed", run_id, removed, step)


def _left_alone(run: RunRecord, state: str) -> str:
    if state == Status.RUNNING:
        return f"{run.run_id} RUNNING on {run.tags.get(Tag.HOST) or 'an unknown host'} (pid {run.tags.get(Tag.PID, '?')})"
    return f"{run.run_id} {state}"
