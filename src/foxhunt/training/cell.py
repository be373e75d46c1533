"""One cell of the model x asset grid, through one door: :func:`run_cell`.

Data flow (docs, "Data flow of a run"), as :func:`run_cell` reads top to bottom: validate ->
starting checkpoint -> resume plan -> (folds and seeds: each child a cell of its own, then their
aggregate) or MLflow run -> data -> model -> fit -> test -> shared backtest -> MLflow. :func:`run_cell` returns the run's outcome
(:func:`train`: its metrics). The value a sweeper optimizes is ``val/sharpe`` (:data:`OBJECTIVE`):
the shared backtest of the validation split, comparable across all four model families (their
own validation losses are not), and never the test split.

``resume=true``: a cell that finished earlier (same config hash) is skipped, an interrupted one
resumed from its checkpoint in its own MLflow run (:mod:`foxhunt.runs.resume`), and the log says
which, in one line. With ``evaluation.protocol=walk_forward`` or ``evaluation.seeds=[...]`` the
cell's run holds one nested run per fold and seed (:mod:`foxhunt.training.folds`), and what the
cell returns is their aggregate. The Hydra entry (``foxhunt-train``) is :mod:`foxhunt.train`; a
sweep's cell goes through :func:`foxhunt.sweeps.sweep_cell.run_sweep_cell`.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import lightning.pytorch as pl
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from foxhunt.config.instantiate import check_instantiable
from foxhunt.config.schema import validate
from foxhunt.runs.cell import CellKey, CellResult, cell_name
from foxhunt.runs.checkpoints import (
    BEST_CHECKPOINT,
    CHECKPOINT_ARTIFACTS,
    check_folder_owner,
    drop_superseded_checkpoints,
    stored_checkpoints,
)
from foxhunt.runs.config_hash import config_hash
from foxhunt.runs.environment import sqlite_path
from foxhunt.runs.resume import BUSY, FRESH, RESUME, SKIP, ResumePlan, plan_resume, rewind_run, settle_refused
from foxhunt.runs.status import Status
from foxhunt.runs.store import RunStore
from foxhunt.runs.tags import ROLE_CELL, Tag
from foxhunt.training.checkpoint import CheckpointError, check_checkpoint
from foxhunt.training.fit import (
    best_checkpoint,
    build_callbacks,
    check_accelerator,
    check_cache_dir,
    checkpoint_files,
    fit_and_score,
)
from foxhunt.training.folds import ChildResult, child_tags, children, describe_protocol, needs_protocol, record_protocol
from foxhunt.training.graceful_stop import check_stop, stop_between_phases
from foxhunt.training.memory_plan import plan_activation_checkpointing
from foxhunt.training.provenance import opened_run

log = logging.getLogger("foxhunt.train")

OBJECTIVE = "val/sharpe"


SOURCE = "foxhunt-train"  # the runs table's Source column (foxhunt.runs.provenance)


def run_tags(cfg: DictConfig, key: CellKey) -> dict[str, str]:
    sweep_id = ""
    if HydraConfig.initialized() and str(HydraConfig.get().mode) == "RunMode.MULTIRUN":
        sweep_id = Path(HydraConfig.get().sweep.dir).name
    return {
        **key.tags(),
        Tag.STRATEGY: cfg.strategy.name,
        Tag.SWEEP_ID: sweep_id,
        Tag.DATA_SOURCE: cfg.data.source._target_.rsplit(".", 1)[-1],
        Tag.OUTPUT_DIR: str(Path(cfg.paths.output_dir).resolve()),
        **({Tag.PRECISION_CHOICE: str(cfg.precision.choice)} if cfg.precision.get("choice") else {}),
    }


def train(cfg: DictConfig, parent_run_id: str | None = None, before_fit: Callable[[], None] | None = None) -> dict[str, float]:
    """Train and score one run; return every metric (``OBJECTIVE`` among them). See :func:`run_cell`."""
    return run_cell(cfg, parent_run_id=parent_run_id, before_fit=before_fit).metrics


def run_cell(
    cfg: DictConfig,
    parent_run_id: str | None = None,
    before_fit: Callable[[], None] | None = None,
    trial: int | None = None,
    extra_tags: dict[str, str] | None = None,
    run_name: str | None = None,
) -> CellResult:
    """Validate, plan ``resume=true``, then train and score one run in its MLflow run, or, for a
    cell with folds or seeds, run each child as a cell under the cell's run and record their
    aggregate (:mod:`foxhunt.training.folds`).

    ``parent_run_id`` nests the run under a sweep's parent run; ``before_fit`` runs once the
    config is valid and the run exists, before the data and the model are built (a sweep job
    sets its threads and device there, and raises when the cell cannot fit); ``trial``, a
    search sweep's trial number, names the run ``<cell>-trial<N>`` and tags it; ``extra_tags``
    and ``run_name`` are a protocol child's. A SIGTERM outside a fit stops the run at its next
    phase boundary (:func:`foxhunt.training.graceful_stop.stop_between_phases`)."""
    with stop_between_phases():
        check_stop()  # asked for before this run began (a fold of a cell, the next cell of a sweep)
        return _run_cell(cfg, parent_run_id, before_fit, trial, extra_tags, run_name)


def _run_cell(cfg: DictConfig, parent_run_id: str | None, before_fit: Callable[[], None] | None, trial: int | None,
              extra_tags: dict[str, str] | None, run_name: str | None) -> CellResult:  # fmt: skip
    validate(cfg)  # before anything heavy: one clear line on a bad value
    check_accelerator(cfg)  # ... and on a device this machine lacks
    check_cache_dir(cfg)  # ... and on a feature cache that cannot be written
    check_instantiable(cfg)  # ... and on a value only the object it builds refuses
    lineage = _starting_checkpoint(cfg)  # a ckpt= that cannot start this run fails here too
    key = CellKey.from_config(cfg, config_hash(cfg))
    protocol = needs_protocol(cfg)
    plan = _resume_plan(cfg, key, needs_checkpoint=not protocol) if cfg.resume else None
    if plan is not None and plan.action == SKIP:
        return _skipped(cfg, key, plan, parent_run_id, trial)
    if plan is not None and plan.action == BUSY:  # never a second process on one cell
        return CellResult(key, Status.SKIPPED, plan.run_id, note=plan.describe())
    resumed = plan if plan is not None and plan.action == RESUME else None
    cfg = _resumed(cfg, resumed) if resumed is not None else cfg
    name = run_name or cell_name(key, trial)
    tags = {**run_tags(cfg, key), **({Tag.TRIAL: str(trial)} if trial is not None else {}), **lineage, **(extra_tags or {})}
    note = plan.describe() if plan is not None else None
    reopened = resumed.run_id if resumed is not None else None
    if protocol:
        metrics, run_id = _run_children(cfg, name, tags, parent_run_id, reopened, before_fit)
        return CellResult(key, Status.FINISHED, run_id, note=note, metrics=metrics)
    metrics, scores, run_id = _fit(
        cfg, name, tags, parent_run_id, reopened, before_fit, resumed.checkpoint if resumed is not None else None
    )
    return CellResult(key, Status.FINISHED, run_id, note=note, metrics=metrics, scores=scores)


def _starting_checkpoint(cfg: DictConfig) -> dict[str, str]:
    """``ckpt=``'s checkpoint checked against the config (and its folder's owner); the tag of the
    run it came from."""
    if not cfg.ckpt:
        return {}
    started_from = check_checkpoint(cfg, cfg.ckpt)
    if cfg.logger.enabled:
        check_folder_owner(cfg.logger.tracking_uri, cfg.ckpt, started_from.run_id)
    return {Tag.CKPT_RUN: started_from.run_id} if started_from.run_id else {}


def _resumed(cfg: DictConfig, plan: ResumePlan) -> DictConfig:
    """The config of an interrupted run resumed: in its own folder (its best checkpoint and score
    stay its own), its MLflow run rewound to its checkpoint (the steps logged after it died with
    it; a cell of folds and seeds logs only its aggregate, recomputed now)."""
    run_id = plan.run_id
    assert run_id is not None  # a RESUME plan names the run it resumes
    if plan.folder is not None:
        cfg = continued_in(cfg, plan.folder)
    if plan.checkpoint is not None:
        try:
            checked = check_checkpoint(cfg, plan.checkpoint, key=f"resume of run {run_id}: checkpoint", run_id=run_id)
        except CheckpointError:
            settle_refused(cfg.logger.tracking_uri, plan)
            raise
        rewind_run(cfg.logger.tracking_uri, run_id, checked.logging_step, checked.saved_at_ms)
    else:
        rewind_run(cfg.logger.tracking_uri, run_id, 0, 0)
    return cfg


def _run_children(cfg: DictConfig, name: str, tags: dict[str, str], parent_run_id: str | None, reopened: str | None,
                  before_fit: Callable[[], None] | None) -> tuple[dict[str, float], str | None]:  # fmt: skip
    """Each fold and seed of the cell as a cell of its own, nested under the cell's run
    (``reopened``: the interrupted cell run), and their aggregate recorded on it."""
    tags = {**tags, Tag.ROLE: ROLE_CELL, Tag.PROTOCOL: describe_protocol(cfg)}
    with opened_run(cfg, name, tags, parent_run_id, reopened, SOURCE, before_fit) as (out_dir, run):
        results = []
        for child in children(cfg, out_dir):
            log.info("%s: %s (%s)", name, child.label, describe_protocol(cfg))
            outcome = run_cell(child.cfg, parent_run_id=run.run_id if run is not None else None,
                               extra_tags=child_tags(child), run_name=f"{name} {child.label}")  # fmt: skip
            results.append(ChildResult.of(child, outcome, cfg))
        metrics = record_protocol(results, cfg, name, out_dir, run)
    return metrics, (run.run_id if run is not None else None)


def _fit(cfg: DictConfig, name: str, tags: dict[str, str], parent_run_id: str | None, reopened: str | None,
         before_fit: Callable[[], None] | None, checkpoint: Path | None) -> tuple[dict[str, float], dict, str | None]:  # fmt: skip
    """Fit, test and score one run in its MLflow run (``reopened``: the interrupted run, resumed
    from ``checkpoint``); its checkpoints reach the run whatever happened."""
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    with opened_run(cfg, name, tags, parent_run_id, reopened, SOURCE, before_fit) as (out_dir, run):
        cfg, choice = plan_activation_checkpointing(cfg)  # the run's config stays as it was (its hash, its record)
        if choice is not None and run is not None:
            run.set_tags({Tag.CHECKPOINTING_CHOICE: choice.line})
        callbacks = build_callbacks(cfg)
        finished = False
        try:
            metrics, scores = fit_and_score(cfg, callbacks, run, out_dir, str(checkpoint) if checkpoint is not None else cfg.ckpt)
            finished = True
        finally:  # an interrupted run's checkpoints too (logger.log_checkpoints: which ones)
            if run is not None:
                best = best_checkpoint(callbacks)
                names = []
                for path in stored_checkpoints(
                    checkpoint_files(callbacks, run.run_id), cfg.logger.log_checkpoints, finished, best
                ):
                    names.append(BEST_CHECKPOINT if path == best else path.name)
                    _log_checkpoint(run, path, names[-1])
                if finished and reopened is not None:  # what the stopped attempts logged, superseded now
                    _drop_superseded(cfg, run.run_id, names)
    return metrics, scores, (run.run_id if run is not None else None)


def _drop_superseded(cfg: DictConfig, run_id: str, kept: list[str]) -> None:
    """A resumed run that finished stores what a run never stopped stores
    (:func:`foxhunt.runs.checkpoints.drop_superseded_checkpoints`; a SQLite store's own files only)."""
    database = sqlite_path(cfg.logger.tracking_uri)
    if database is None:
        return
    removed = drop_superseded_checkpoints(RunStore(cfg.logger.tracking_uri).get(run_id), database.parent, kept)
    if removed:
        log.info("run %s finished: its stopped attempts' %s removed from its stored checkpoints", run_id, ", ".join(removed))


def _log_checkpoint(run, path: Path, name: str) -> None:
    """``path`` stored as ``checkpoints/<name>`` (the best under ``best.ckpt``, the name
    registration and reproduction read, whatever Lightning named the file)."""
    if path.name == name:
        run.log_artifact(path, CHECKPOINT_ARTIFACTS)
        return
    with tempfile.TemporaryDirectory(dir=path.parent) as folder:
        named = Path(folder) / name
        os.link(path, named)  # the same file under the stored name: no copy of a large checkpoint
        run.log_artifact(named, CHECKPOINT_ARTIFACTS)


def continued_in(cfg: DictConfig, folder: Path) -> DictConfig:
    """``cfg`` writing into ``folder`` (``paths.output_dir``): a resumed run's earlier folder,
    where its checkpoints are (Lightning restores the best checkpoint's score only in the folder
    it was written to, so the best checkpoint of a resumed fit is the fit's, as if never stopped)."""
    cfg = cfg.copy()
    OmegaConf.update(cfg, "paths.output_dir", str(folder), merge=False)
    return cfg


def _resume_plan(cfg: DictConfig, key: CellKey, needs_checkpoint: bool) -> ResumePlan:
    """What ``resume=true`` does with this run, said in one line in the log."""
    if not cfg.logger.enabled:
        plan = ResumePlan(why_fresh="the MLflow store is off (logger.enabled=false)")
    else:
        download = Path(cfg.paths.output_dir) / "resume"
        plan = plan_resume(cfg.logger.tracking_uri, cfg.logger.experiment, key.config_hash, download, needs_checkpoint)
    (log.warning if plan.action in (FRESH, BUSY) else log.info)("%s: resume=true: %s", key.name, plan.describe())
    return plan


def _skipped(cfg: DictConfig, key: CellKey, plan: ResumePlan, parent_run_id: str | None, trial: int | None = None) -> CellResult:
    """A cell FINISHED earlier: its result is that run's. Inside a sweep whose parent run is not
    that run's, the skip is recorded on the parent (the cell has no run of its own there, and
    ``foxhunt train status`` shows it SKIPPED from that tag)."""
    outcome = CellResult(
        key, Status.SKIPPED, plan.run_id, wall_s=plan.wall_s, note=plan.describe(), metrics=dict(plan.metrics), trial=trial
    )
    if parent_run_id and plan.parent_run_id != parent_run_id:
        try:
            RunStore(cfg.logger.tracking_uri).tag(parent_run_id, dict([outcome.skip_tag()]))
        except Exception:  # the cell's result stands; only the job display would miss it
            log.warning("could not record the skip of %s on the parent run %s", key.name, parent_run_id, exc_info=True)
    return outcome
