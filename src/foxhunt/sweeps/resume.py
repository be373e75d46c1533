"""``resume=true``: what to do with a cell that earlier runs (same ``config_hash``) already tried.

- a FINISHED run exists: skip the cell and report that run's metrics;
- else the most recent FAILED, KILLED or stale RUNNING run that left a checkpoint: reopen
  that MLflow run and fit from its newest checkpoint (``interrupted.ckpt`` written on a stop
  request, or ``last.ckpt``), looked up first in the run's output folder (tag ``output_dir``),
  then among the run's ``checkpoints/`` artifacts;
- else train from scratch in a new run.

A RUNNING run is stale (its process died without ending it: killed, out of memory, node lost)
unless its ``pid`` is alive on this host (tags ``host``, ``pid``); a RUNNING run of another host
is taken as stale, since rerunning a sweep declares the earlier attempt over.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

FRESH, SKIP, RESUME = "fresh", "skip", "resume"
RESUMABLE_CHECKPOINTS = ("interrupted.ckpt", "last.ckpt")
RESUMABLE_STATUSES = ("FAILED", "KILLED", "RUNNING")
OUTPUT_DIR_TAG = "output_dir"
PARENT_RUN_TAG = "mlflow.parentRunId"


@dataclass
class ResumePlan:
    action: str = FRESH
    run_id: str | None = None
    checkpoint: Path | None = None
    previous_status: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    wall_s: float | None = None
    parent_run_id: str | None = None  # the sweep parent run the earlier run is nested in

    def describe(self) -> str:
        if self.action == SKIP:
            return f"skipped: FINISHED earlier in run {self.run_id}"
        if self.action == RESUME:
            return f"resumed {self.previous_status} run {self.run_id} from {self.checkpoint.name}"
        return "trained from scratch"


def plan_resume(tracking_uri: str, experiment: str, digest: str, download_dir: Path) -> ResumePlan:
    """The plan for a cell with config hash ``digest`` (see the module doc)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return ResumePlan()
    runs = client.search_runs(
        [found.experiment_id], filter_string=f"tags.config_hash = '{digest}'", order_by=["attributes.start_time DESC"]
    )
    for run in runs:
        if run.info.status == "FINISHED":
            wall = (run.info.end_time - run.info.start_time) / 1000 if run.info.end_time else None
            parent = run.data.tags.get(PARENT_RUN_TAG) or None
            return ResumePlan(SKIP, run.info.run_id, None, "FINISHED", dict(run.data.metrics), wall, parent)
    for run in runs:
        if run.info.status not in RESUMABLE_STATUSES or (run.info.status == "RUNNING" and _alive(run.data.tags)):
            continue
        checkpoint = _checkpoint(client, run, download_dir)
        if checkpoint is not None:
            return ResumePlan(RESUME, run.info.run_id, checkpoint, run.info.status)
    return ResumePlan()


def _alive(tags: dict[str, str]) -> bool:
    if tags.get("host") != socket.gethostname():
        return False
    try:
        pid = int(tags.get("pid", ""))
    except ValueError:
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _checkpoint(client, run, download_dir: Path) -> Path | None:
    folder = run.data.tags.get(OUTPUT_DIR_TAG)
    if folder:
        local = [Path(folder) / "checkpoints" / name for name in RESUMABLE_CHECKPOINTS]
        local = [path for path in local if path.is_file()]
        if local:
            return max(local, key=lambda p: p.stat().st_mtime)
    logged = {item.path.rsplit("/", 1)[-1] for item in client.list_artifacts(run.info.run_id, "checkpoints")}
    for name in RESUMABLE_CHECKPOINTS:
        if name in logged:
            download_dir.mkdir(parents=True, exist_ok=True)
            path = client.download_artifacts(run.info.run_id, f"checkpoints/{name}", str(download_dir))
            return Path(path)
    return None
