"""One cell of a sweep (a Hydra job; a background launch is a job of foxhunt.jobs): threads, device, fail-fast check, failure isolation, ``cell.json``.

Hydra's basic launcher lets a job's exception end the whole sweep, and the joblib launcher
re-raises it in the parent. A sweep must go on when one cell fails (bad data, NaN loss, budget
breach), so :func:`run_sweep_cell` catches the error inside the job: the cell's MLflow run is
already FAILED with its error (:class:`~foxhunt.runs.tracked_run.TrackedRun`), the job records
FAILED in ``cell.json`` and returns normally, and the sweep callback turns any failure into a
non-zero exit once every cell has run. A stop request (Ctrl-C, SIGTERM) is not a failure of
the cell: it ends the sweep, whose parent run ends KILLED (the callback's end hook never runs
then), and the process exits non-zero (Lightning's ``SIGTERMException`` is a ``SystemExit``
without a code, which would exit 0: it becomes status 143, as for a process ended by SIGTERM).

In a SLURM job (``strategy=slurm``) a stop need not end the sweep: the notice SLURM sends
before a time limit or a preemption requeues the job through submitit, and SLURM requeues the
job itself after the SIGTERM of ``scontrol requeue`` or a requeueing preemption; the requeued
job continues the cell's run from its checkpoint (:mod:`foxhunt.sweeps.slurm`).

In a search sweep the job is a trial (:mod:`foxhunt.sweeps.search`): its result and run carry
the trial number and its overrides; the sweeper tells the study what its ``cell.json`` says (a
failure: FAILED, and the search goes on). A trial the study's pruner stopped
(:class:`foxhunt.sweeps.pruning.TrialPruned`) is no stop request: its run ends KILLED, tagged
``pruned``, its result says KILLED with the pruner's line as its note, and the search goes on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from foxhunt.errors import error_line
from foxhunt.runs.cell import CellKey, CellResult
from foxhunt.runs.config_hash import config_hash
from foxhunt.runs.environment import PARENT_RUN_ENV
from foxhunt.runs.status import Status, ending_status
from foxhunt.runs.store import RunStore
from foxhunt.runs.tags import Tag
from foxhunt.sweeps.estimates import PackingPlan, check_fits
from foxhunt.sweeps.orphans import EXIT_ORPHANED, orphaned, watch_sweep_process
from foxhunt.sweeps.pruning import TrialPruned
from foxhunt.sweeps.resources import DeviceSlot, configured_threads, cuda_devices
from foxhunt.sweeps.search import job_overrides, trial_number, trial_study
from foxhunt.sweeps.slurm import Preemption, SlurmJob
from foxhunt.training.graceful_stop import stop_exit_status

log = logging.getLogger(__name__)


def current_sweep_dir() -> Path:
    """The sweep folder of the running job (``hydra.sweep.dir``)."""
    return Path(HydraConfig.get().sweep.dir)


# What a stop does to the sweep (_run_cell's on_stop): it ends the sweep (the default); the job
# is requeued and the cell goes on in it (the stop is re-raised, the parent run left RUNNING);
# the cell is left KILLED for the sweep's summary to report (the job returns None).
ENDS_SWEEP, REQUEUED, LEFT_KILLED = "ends the sweep", "requeued", "left killed"


def run_sweep_cell(cfg: DictConfig, run_cell: Callable) -> dict[str, float] | None:
    """Run one cell with ``run_cell`` (:func:`foxhunt.training.cell.run_cell`); a failure returns
    ``None`` instead of raising, a stop request ends the sweep (in a SLURM job, unless the job
    is requeued: :func:`_run_slurm_cell`)."""
    job = SlurmJob.current()
    if job is not None:
        return _run_slurm_cell(cfg, run_cell, job)
    return _run_cell(cfg, run_cell)


def _run_slurm_cell(cfg: DictConfig, run_cell: Callable, job) -> dict[str, float] | None:
    """A cell in a SLURM job (:mod:`foxhunt.sweeps.slurm`): a restarted job resumes the cell's run;
    SLURM's notice (SIGUSR1, SIGUSR2) stops the fit and requeues the job through submitit; the
    SIGTERM of a requeue leaves the sweep's parent run RUNNING."""
    if job.requeued:
        log.warning("SLURM job %s restarted (%d): the cell continues its run (resume=true)", job.job_id, job.restarts)
        with open_dict(cfg):
            cfg.resume = True
    with Preemption() as preemption:

        def on_stop(result: CellResult) -> str:
            if preemption.received is None:
                if not job.being_requeued():
                    return ENDS_SWEEP
                result.note = f"SLURM requeues job {job.job_id}"
                return REQUEUED
            result.note = f"{preemption.received}: job {job.job_id} requeued through submitit"
            why_not = preemption.requeue()  # once requeued, it exits the process
            result.note = f"{preemption.received}: not requeued: {why_not}; resume=true continues the cell"
            log.error("%s", result.note)
            return LEFT_KILLED

        metrics = _run_cell(cfg, run_cell, on_stop)
        if preemption.received is not None and metrics is not None:
            log.warning("%s came after the fit: the cell finished, the job is not requeued", preemption.received)
        return metrics


def _run_cell(cfg: DictConfig, run_cell: Callable, on_stop: Callable[[CellResult], str] = lambda result: ENDS_SWEEP):
    """:func:`run_sweep_cell`'s body. ``on_stop`` decides, once a stop request has ended the cell,
    what it does to the sweep (:data:`ENDS_SWEEP`, :data:`REQUEUED`, :data:`LEFT_KILLED`); it may
    note why on the cell's result."""
    watch_sweep_process(cfg.strategy.get("orphan_grace_s"))  # a worker ends with the sweep's process
    if orphaned():  # ... and one its sweep left before this job began starts nothing
        os._exit(EXIT_ORPHANED)
    started = time.perf_counter()
    sweep_dir = current_sweep_dir()
    parent_run_id = os.environ.get(PARENT_RUN_ENV) or None
    trial = trial_number()
    overrides = job_overrides() if trial is not None else None
    result = CellResult(CellKey.from_config(cfg, _config_hash_or_none(cfg) or ""), trial=trial, overrides=overrides)
    slots = []
    # a trial's run names its study from the start: a pruned, failed or killed one too (the sweep's summary
    # tagged finished ones only, so `runs` filtered on the study missed the rest)
    study = trial_study()
    trial_arg = {"trial": trial, **({"extra_tags": {Tag.STUDY: study}} if study else {})} if trial is not None else {}

    def before_fit() -> None:  # the config is valid and the cell's run exists

        plan = PackingPlan.read(sweep_dir)
        torch.set_num_threads(plan.threads_per_job if plan is not None else configured_threads(cfg))
        slots.append(_take_device(cfg, sweep_dir))
        if plan is not None:
            check_fits(cfg, sweep_dir)

    try:
        outcome = run_cell(cfg, parent_run_id=parent_run_id, before_fit=before_fit, **trial_arg)
        result = dataclasses.replace(outcome, metrics=dict(outcome.metrics), trial=trial, overrides=overrides, scores={})
        return outcome.metrics
    except BaseException as exc:
        result.status = ending_status(exc)
        result.error = error_line(exc)
        if _pruned(exc):  # the study's pruner stopped this trial (run KILLED, tagged pruned): the search goes on
            result.error, result.note = None, str(exc)
            log.warning("trial %s: %s", result.cell, exc)
            return None
        if result.status == Status.KILLED:  # a stop request ends the whole sweep, not only this cell
            fate = on_stop(result)
            if fate == ENDS_SWEEP:
                _end_parent_run_killed(cfg, parent_run_id, type(exc).__name__)
            else:
                log.warning("cell %s stopped (%s): the sweep goes on", result.cell, result.note)
            if fate == LEFT_KILLED:
                return None
            if isinstance(exc, SystemExit) and not exc.code:  # Lightning's SIGTERMException
                raise SystemExit(stop_exit_status(exc)) from exc  # not 0: the run did not finish
            raise
        log.error("%s %s FAILED (the sweep goes on): %s", "trial" if trial is not None else "cell", result.cell, result.error)
        return None
    finally:
        if result.wall_s is None:
            result.wall_s = round(time.perf_counter() - started, 3)
        for slot in slots:
            if slot is not None:
                slot.release()
        result.write(Path(cfg.paths.output_dir))
        if orphaned():  # the sweep is gone: no next cell for this worker
            os._exit(EXIT_ORPHANED)


def _pruned(exc: BaseException) -> bool:
    """A search's pruner stopped the trial (:class:`foxhunt.sweeps.pruning.TrialPruned`): no stop of the sweep."""
    return isinstance(exc, TrialPruned)


def _config_hash_or_none(cfg: DictConfig) -> str | None:
    """The cell's hash for its result; a config too broken to hash has none (its error says why)."""
    try:
        return config_hash(cfg)
    except Exception:
        return None


def _end_parent_run_killed(cfg: DictConfig, parent_run_id: str | None, reason: str) -> None:
    if not parent_run_id or not cfg.logger.enabled:
        return

    try:
        RunStore(cfg.logger.tracking_uri).end(parent_run_id, Status.KILLED, {Tag.STOP_REASON: reason})
    except Exception:  # the stop must go on whatever the store says
        log.warning("could not end the sweep's parent run %s", parent_run_id, exc_info=True)


def _take_device(cfg: DictConfig, sweep_dir: Path):
    """On several GPUs, hold one device for this job (``trainer.devices=[i]``)."""
    devices = cuda_devices(cfg.trainer.accelerator)
    if devices < 2 or cfg.trainer.devices != 1:  # one device, or the user chose several per job
        return None
    slot = DeviceSlot(sweep_dir, devices, preferred=int(HydraConfig.get().job.num or 0))
    index = slot.acquire()
    with open_dict(cfg):
        cfg.trainer.devices = [index]
    log.info("job holds cuda:%d", index)
    return slot
