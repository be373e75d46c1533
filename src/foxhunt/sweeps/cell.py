"""One job of a sweep: resources, resume, fail-fast check, failure isolation, result record.

Hydra's basic launcher lets a job's exception end the whole sweep, and the joblib launcher
re-raises it in the parent. A sweep must go on when one cell fails (bad data, NaN loss, budget
breach), so :func:`run_cell` catches the error inside the job: the cell's MLflow run is already
FAILED with its error (:class:`~foxhunt.tracking.mlflow_store.TrackedRun`), the job records
FAILED in ``cell.json`` and returns normally, and the sweep callback turns any failure into a
non-zero exit once every cell has run. A stop request (Ctrl-C, SIGTERM) is not a failure of
the cell: it ends the sweep, whose parent run ends KILLED (the callback's end hook never runs
then), and the process exits non-zero (Lightning's ``SIGTERMException`` is a ``SystemExit``
without a code, which would exit 0: it becomes status 143, as for a process ended by SIGTERM).

Outside a sweep (``foxhunt-train`` without ``-m``) errors propagate as before; ``resume=true``
works the same there.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, open_dict

from foxhunt.sweeps.cells import FAILED, FINISHED, KILLED, SKIPPED, CellRecord, config_hash, current_sweep_dir, in_multirun

log = logging.getLogger(__name__)

PARENT_RUN_ENV = "FOXHUNT_PARENT_RUN_ID"  # set by the sweep callback before any job starts
EXIT_ON_SIGTERM = 128 + 15  # the shell's status for a process ended by SIGTERM


@dataclass
class CellContext:
    """What a sweep job hands to :func:`foxhunt.train.train`."""

    config_hash: str
    parent_run_id: str | None = None
    resume_run_id: str | None = None  # reopen this MLflow run ...
    ckpt_path: str | None = None  # ... and fit from this checkpoint
    preflight: Callable[[], None] | None = None  # raises before training when the cell cannot fit
    run_id: str | None = None  # set by train once the MLflow run exists


def configured_threads(cfg: DictConfig) -> int:
    """``strategy.torch_threads``: a number, or ``auto`` = every core this process may use."""
    from foxhunt.sweeps.resources import AUTO, available_cores

    value = cfg.strategy.get("torch_threads", AUTO)
    return available_cores() if str(value) == AUTO else int(value)


def run_cell(cfg: DictConfig, train_fn: Callable[[DictConfig, CellContext], dict[str, float]]) -> dict[str, float] | None:
    """Run one cell; in a sweep, a failure returns ``None`` instead of raising."""
    import torch

    from foxhunt.config.schema import validate
    from foxhunt.jobs.graceful_stop import is_stop_request
    from foxhunt.sweeps.estimates import PackingPlan, check_fits
    from foxhunt.tracking.mlflow_store import one_line

    started = time.perf_counter()
    sweeping = in_multirun()
    sweep_dir = current_sweep_dir() if sweeping else None
    record = CellRecord.for_config(cfg, "")
    context = CellContext("", parent_run_id=(os.environ.get(PARENT_RUN_ENV) or None) if sweeping else None)
    slot = None
    try:
        validate(cfg)  # first: a bad value is one line, in a sweep and outside
        record.config_hash = context.config_hash = config_hash(cfg)
        plan = PackingPlan.read(sweep_dir) if sweep_dir is not None else None
        torch.set_num_threads(plan.threads_per_job if plan is not None else configured_threads(cfg))
        slot = _take_device(cfg, sweep_dir) if sweep_dir is not None else None
        if plan is not None:
            context.preflight = lambda: check_fits(cfg, sweep_dir)
        if cfg.resume:
            resumed = _apply_resume(cfg, context, record)
            if resumed is not None:  # skipped: finished earlier
                return resumed
        metrics = train_fn(cfg, context)
        record.status, record.run_id, record.metrics = FINISHED, context.run_id, dict(metrics)
        return metrics
    except BaseException as exc:
        stopped = is_stop_request(exc) or isinstance(exc, SystemExit)
        record.status = KILLED if stopped else FAILED
        record.run_id = record.run_id or context.run_id
        record.error = one_line(f"{type(exc).__name__}: {exc}")
        if stopped:
            if sweeping:  # a stop request ends the whole sweep, not only this cell
                _end_parent_run_killed(cfg, type(exc).__name__)
            if isinstance(exc, SystemExit) and not exc.code:  # Lightning's SIGTERMException
                raise SystemExit(EXIT_ON_SIGTERM) from exc  # not 0: the run did not finish
            raise
        if not sweeping:
            raise
        log.error("cell %s FAILED (the sweep goes on): %s", record.cell, record.error)
        return None
    finally:
        record.wall_s = round(time.perf_counter() - started, 3) if record.wall_s is None else record.wall_s
        if slot is not None:
            slot.release()
        if sweeping:
            record.write(Path(cfg.paths.output_dir))


def _end_parent_run_killed(cfg: DictConfig, reason: str) -> None:
    parent = os.environ.get(PARENT_RUN_ENV)
    if not parent or not cfg.logger.enabled:
        return
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(cfg.logger.tracking_uri)
        client.set_tag(parent, "stop_reason", reason)
        client.set_terminated(parent, KILLED)
    except Exception:  # the stop must go on whatever the store says
        log.warning("could not end the sweep's parent run %s", parent, exc_info=True)


def _apply_resume(cfg: DictConfig, context: CellContext, record: CellRecord) -> dict[str, float] | None:
    """Fill ``context`` (or ``record``, for a skipped cell) from the resume plan."""
    from foxhunt.sweeps.resume import RESUME, SKIP, plan_resume

    download = Path(cfg.paths.output_dir) / "resume"
    resume = plan_resume(cfg.logger.tracking_uri, cfg.logger.experiment, context.config_hash, download)
    log.info("%s: %s", record.cell, resume.describe())
    record.note = resume.describe()
    if resume.action == SKIP:
        record.status, record.run_id, record.metrics, record.wall_s = SKIPPED, resume.run_id, resume.metrics, resume.wall_s
        if context.parent_run_id and resume.parent_run_id != context.parent_run_id:
            _tag_skipped(cfg, context.parent_run_id, resume)
        return resume.metrics
    if resume.action == RESUME:
        context.resume_run_id, context.ckpt_path = resume.run_id, str(resume.checkpoint)
    return None


def _tag_skipped(cfg: DictConfig, parent_run_id: str, resume) -> None:
    """Record a skip on the sweep's parent run: the cell has no run of its own in this sweep,
    and ``foxhunt train status`` shows it SKIPPED, pointing at the earlier run, from this tag."""
    from mlflow.tracking import MlflowClient

    from foxhunt.jobs.records import SkippedCell

    skipped = SkippedCell(
        model=str(cfg.model.name), asset=str(cfg.asset.key), precision=str(cfg.precision.name), seed=str(cfg.seed),
        run_id=resume.run_id, metrics=dict(resume.metrics), wall_s=resume.wall_s,
    )  # fmt: skip
    try:
        MlflowClient(cfg.logger.tracking_uri).set_tag(parent_run_id, *skipped.tag())
    except Exception:  # the cell's result stands; only the job display would miss it
        log.warning("could not record the skip of %s on the parent run %s", skipped.name, parent_run_id, exc_info=True)


def _take_device(cfg: DictConfig, sweep_dir: Path):
    """On several GPUs, hold one device for this job (``trainer.devices=[i]``)."""
    from hydra.core.hydra_config import HydraConfig

    from foxhunt.sweeps.resources import DeviceSlot, cuda_devices

    devices = cuda_devices(cfg.trainer.accelerator)
    if devices < 2 or cfg.trainer.devices != 1:  # one device, or the user chose several per job
        return None
    slot = DeviceSlot(sweep_dir, devices, preferred=int(HydraConfig.get().job.num or 0))
    index = slot.acquire()
    with open_dict(cfg):
        cfg.trainer.devices = [index]
    log.info("job holds cuda:%d", index)
    return slot
