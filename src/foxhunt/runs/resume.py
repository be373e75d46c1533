"""``resume=true``: what to do with a run whose config (same ``config_hash``) was tried before.

- a FINISHED run exists: skip, and report that run's metrics;
- else a run still RUNNING (on this host with its process alive, or on another host, which
  cannot be checked from here: :mod:`foxhunt.runs.liveness`, the rule of the job views): the
  cell is busy; it is not started a second time, and the line names the run, host and pid;
- else the most recent FAILED, KILLED or stale RUNNING run with a resumable checkpoint
  (:mod:`foxhunt.runs.checkpoints`: the rule ``foxhunt train status`` shows too): reopen that
  MLflow run and fit from the checkpoint. A cell run made of folds or seeds
  (``needs_checkpoint=False``: its children hold the checkpoints) is reopened without one;
- else train from scratch in a new run.

Every stale run of the config that is not continued (its process gone, the store still saying
RUNNING) is settled KILLED on the way, so no run stays RUNNING after its process is gone.

A run resumed from a logged copy of its checkpoint gets its logged ``best.ckpt`` beside it: the
fit carries it into its new folder, so the best checkpoint and score are the best over every
attempt (:func:`foxhunt.training.checkpoint.carry_best_checkpoints`).

A resumed run continues from its checkpoint's step: :func:`rewind_run` first removes the metric
values logged after that step (a ``kill -9`` lost their training), so no step is logged twice.
The step is the run's one logging unit (:mod:`foxhunt.runs.steps`).

:meth:`ResumePlan.describe` says which, in one line, for the log and the sweep's summary;
when the store holds no run of the config, or none that can be continued, the line says so
and names the hash, so that a changed setting is not silently a new training.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from foxhunt.runs.checkpoints import BEST_CHECKPOINT, CHECKPOINT_ARTIFACTS, CHECKPOINTS_FOLDER, resumable_checkpoint
from foxhunt.runs.liveness import run_state
from foxhunt.runs.status import Status
from foxhunt.runs.store import RunStore
from foxhunt.runs.stored import StoredRun
from foxhunt.runs.tags import Tag

log = logging.getLogger(__name__)

FRESH, SKIP, RESUME, BUSY = "fresh", "skip", "resume", "busy"
RESUMABLE_STATES = (Status.FAILED, Status.KILLED, Status.STALE)
SETTLED_REASON = "process gone; settled KILLED by resume=true"


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
    folder: Path | None = None  # RESUME: the earlier attempt's output folder, on this machine, holding the checkpoint

    busy: str = ""  # BUSY: where the cell is still running

    def describe(self) -> str:
        if self.action == SKIP:
            return skip_note(self.run_id)
        if self.action == BUSY:
            return f"skipped: still running ({self.busy}); not started a second time"
        if self.action == RESUME:
            source = (
                f"from {self.checkpoint.name}" if self.checkpoint is not None else "(its folds and seeds resume on their own)"
            )
            return f"resumed {self.previous_status} run {self.run_id} {source}"
        return f"from scratch: {self.why_fresh}" if self.why_fresh else "from scratch"


def skip_note(run_id: str | None) -> str:
    """How a skipped cell is described everywhere (the sweep's summary, ``foxhunt train status``)."""
    return f"skipped: FINISHED earlier in run {run_id}"


def plan_resume(tracking_uri: str, experiment: str, digest: str, download_dir: Path,
                needs_checkpoint: bool = True) -> ResumePlan:  # fmt: skip
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
    states = {run.run_id: run_state(run) for run in runs}
    running = [run for run in runs if states[run.run_id] == Status.RUNNING]
    if running:
        return ResumePlan(BUSY, running[0].run_id, previous_status=Status.RUNNING, busy=_where(running[0]))
    plan, left = None, []
    for run in runs:
        state = states[run.run_id]
        if plan is not None or state not in RESUMABLE_STATES:
            left.append(f"{run.run_id} {state}")
            continue
        checkpoint = resumable_checkpoint(run, lambda r: store.logged_files(r.run_id, CHECKPOINT_ARTIFACTS))
        if checkpoint is None and needs_checkpoint:
            left.append(f"{run.run_id} {state} without a checkpoint")
            continue
        path = checkpoint.path if checkpoint is not None else None
        if checkpoint is not None and checkpoint.artifact is not None:  # a logged copy: fetched next to this attempt
            path = store.download(run.run_id, checkpoint.artifact, download_dir)
            if BEST_CHECKPOINT in store.logged_files(run.run_id, CHECKPOINT_ARTIFACTS):  # its best beside it: the
                store.download(run.run_id, f"{CHECKPOINT_ARTIFACTS}/{BEST_CHECKPOINT}", path.parent)  # best score continues
        plan = ResumePlan(RESUME, run.run_id, path, state, folder=_attempt_folder(run, checkpoint))
    for run in runs:  # the stale runs not continued: their process is gone, so they end
        if states[run.run_id] == Status.STALE and (plan is None or run.run_id != plan.run_id):
            store.end(run.run_id, Status.KILLED, {Tag.STOP_REASON: SETTLED_REASON})
            log.info("run %s: RUNNING without its process (pid %s): ended KILLED", run.run_id, run.tags.get(Tag.PID, "?"))
    if plan is not None:
        return plan
    return ResumePlan(why_fresh=f"no run with config_hash {digest} to continue ({'; '.join(left)})")


def settle_refused(tracking_uri: str, plan: ResumePlan) -> None:
    """A resume refused after it was planned (its checkpoint damaged or another run's): a stale
    run it would have continued ends KILLED, as one not continued does, rather than staying
    RUNNING with its process gone (found by a helper probing resume)."""
    if plan.previous_status != Status.STALE or plan.run_id is None:
        return
    RunStore(tracking_uri).end(plan.run_id, Status.KILLED, {Tag.STOP_REASON: SETTLED_REASON})
    log.info("run %s: RUNNING without its process, its resume refused: ended KILLED", plan.run_id)


def rewind_run(tracking_uri: str, run_id: str, step: int, saved_at_ms: int) -> None:
    """Before a run continues from a checkpoint of step ``step`` taken at ``saved_at_ms``: the
    metric values it logged after it (work lost with a kill) leave the store, so each step is
    logged once."""
    removed = RunStore(tracking_uri).forget_metrics_after(run_id, step, saved_at_ms)
    if removed:
        log.info("run %s: %d metric values logged after step %d (lost with the stop) removed", run_id, removed, step)


def _attempt_folder(run: StoredRun, checkpoint) -> Path | None:
    """The earlier attempt's output folder when the checkpoint is the one in its ``checkpoints``
    folder on this machine (a resumed fit continues there: its best checkpoint and score too)."""
    output_dir = run.tags.get(Tag.OUTPUT_DIR)
    if checkpoint is None or checkpoint.artifact is not None or checkpoint.path is None or not output_dir:
        return None
    folder = Path(output_dir)
    return folder if checkpoint.path.parent == folder / CHECKPOINTS_FOLDER else None


def _where(run: StoredRun) -> str:
    return f"run {run.run_id} on {run.tags.get(Tag.HOST) or 'an unknown host'}, pid {run.tags.get(Tag.PID, '?')}"
