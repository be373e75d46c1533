"""``foxhunt-train``: train one cell of the model x asset grid.

Data flow (README, "Data flow of a run"): compose -> validate -> data -> model -> fit -> test
-> shared backtest -> MLflow. :func:`train_run` does the work and returns the run's outcome
(:func:`train`: its metrics); ``main`` is the ``@hydra.main`` entry that turns a config error
into one line and a non-zero exit.

The value ``train`` returns for a sweeper to optimize is ``val/sharpe``: the shared backtest of
the validation split, comparable across all four model families (their own validation losses
are not), and never the test split, which stays unseen until the final report.

A single run (``foxhunt-train`` without ``-m``) is just :func:`train_run`. In a sweep each
Hydra job goes through :func:`foxhunt.sweeps.job.run_sweep_job`, which isolates a failing
cell, nests the run under the sweep's parent run and applies the strategy's threads, device
and packing check. ``resume=true`` works the same in both: a cell that finished earlier (same
config hash) is skipped, an interrupted one resumed from its checkpoint in its own MLflow run
(:mod:`foxhunt.runs.resume`), and the log says which, in one line.

With ``evaluation.protocol=walk_forward`` or ``evaluation.seeds=[...]`` the cell's run holds one
nested run per fold and seed (:mod:`foxhunt.protocol`), and what the cell returns is their
aggregate: ``val/sharpe`` of the pooled validation blocks, the mean across seeds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from foxhunt.checkpoint import check_checkpoint
from foxhunt.config.schema import resolved_config, validate
from foxhunt.errors import EXIT_USER_ERROR, FolderError, debug_requested, is_user_error, reported, strip_debug_flag
from foxhunt.runs.cell import CellKey, CellResult, cell_name
from foxhunt.runs.checkpoints import CHECKPOINT_ARTIFACTS, check_folder_owner
from foxhunt.runs.config_hash import config_hash
from foxhunt.runs.resume import BUSY, FRESH, RESUME, SKIP, ResumePlan, rewind_run
from foxhunt.runs.steps import logging_step
from foxhunt.runs.status import Status
from foxhunt.runs.tags import Tag

log = logging.getLogger("foxhunt.train")

OBJECTIVE = "val/sharpe"
SOURCE = "foxhunt-train"  # the runs table's Source column (foxhunt.runs.provenance)
EXIT_CONFIG_ERROR = EXIT_USER_ERROR  # any error in the input: config, data, checkpoint, store
PROG = "foxhunt-train"
_DEBUG = False  # --debug / FOXHUNT_DEBUG=1 / HYDRA_FULL_ERROR=1: input errors keep their traceback
_ENTERED = False  # the Hydra job started (its folder exists)
EXIT_ON_SIGTERM = 128 + 15  # the shell's status for a process ended by SIGTERM
SPLITS = ("train", "val", "test")
SCORED = ("val", "test")  # the splits the shared backtest scores
SCORES_DIR = "scores"  # artifacts: each scored split's backtests (foxhunt.evaluation.scoring.SplitScore)


def scores_file(split: str) -> str:
    return f"{split}.npz"


@dataclass
class RunOutcome:
    """What became of a run: FINISHED (trained here) or SKIPPED (``resume=true`` found it
    FINISHED earlier: ``run_id`` and ``metrics`` are that run's)."""

    key: CellKey
    status: str
    run_id: str | None
    metrics: dict[str, float] = field(default_factory=dict)
    note: str | None = None  # what resume did
    wall_s: float | None = None  # a skipped cell: its earlier run's duration
    scores: dict = field(default_factory=dict)  # split -> SplitScore (a run trained here)


def run_tags(cfg: DictConfig, key: CellKey) -> dict[str, str]:
    from hydra.core.hydra_config import HydraConfig

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


def scoring_datamodule(cfg: DictConfig, datamodule):
    """The datamodule the shared backtest scores: ``datamodule`` itself, or with
    ``evaluation.max_bars`` set, one over the first ``max_bars`` bars of the val and test splits
    (same features, normalization and costs; the train split, which is not scored, whole, as the
    datamodule checks its episodes against it; a new datamodule, so training's is left as it was)."""
    max_bars = cfg.evaluation.get("max_bars")
    if max_bars is None:
        return datamodule
    import dataclasses

    from foxhunt.build import build_datamodule

    dataset = datamodule.dataset
    splits = {name: arrays.head(max_bars) if name in SCORED else arrays for name, arrays in dataset.splits.items()}
    return build_datamodule(cfg, dataclasses.replace(dataset, splits=splits))


def score_split(model, datamodule, split: str, cfg: DictConfig, asset, out_dir: Path, run):
    """The shared backtest of one split, the model's and the baselines' (the same metrics for
    every model family, :mod:`foxhunt.evaluation.scoring`): returns the ``<split>/...``
    metrics and the :class:`~foxhunt.evaluation.scoring.SplitScore`, saved as an artifact."""
    from foxhunt.evaluation.plots import plot_equity
    from foxhunt.evaluation.scoring import ScoringSettings, score_positions

    arrays = datamodule.dataset.splits[split]
    settings = ScoringSettings.from_config(cfg, asset)
    score = score_positions(model.trading_positions(datamodule, split), arrays.close, arrays.timestamps, asset,
                            settings, roll_price=arrays.roll_price)  # fmt: skip
    metrics = {f"{split}/{name}": float(value) for name, value in score.metrics(settings).items()}
    folder = out_dir / SCORES_DIR
    folder.mkdir(exist_ok=True)
    saved = score.save(folder / scores_file(split))
    if run is not None:
        run.log_artifact(saved, SCORES_DIR)
    if cfg.evaluation.plot_equity and split == "test":
        png = out_dir / f"equity_{split}.png"
        plot_equity(score.model, arrays.timestamps, png, title=f"{CellKey.from_config(cfg).name} {split} split")
        if run is not None:
            run.log_artifact(png)
    return metrics, score


def train(cfg: DictConfig, parent_run_id: str | None = None, before_fit: Callable[[], None] | None = None) -> dict[str, float]:
    """Train and score one run; return every metric (``OBJECTIVE`` among them). See :func:`train_run`."""
    return train_run(cfg, parent_run_id=parent_run_id, before_fit=before_fit).metrics


def train_run(
    cfg: DictConfig,
    parent_run_id: str | None = None,
    before_fit: Callable[[], None] | None = None,
    trial: int | None = None,
    extra_tags: dict[str, str] | None = None,
    run_name: str | None = None,
) -> RunOutcome:
    """Validate, apply ``resume=true``, train and score one run in its MLflow run (a cell with
    folds or seeds: its children under the cell's run, :mod:`foxhunt.protocol`).

    ``parent_run_id`` nests the run under a sweep's parent run; ``before_fit`` runs once the
    config is valid and the run exists, before the data and the model are built (a sweep job
    sets its threads and device there, and raises when the cell cannot fit); ``trial``, a
    search sweep's trial number, names the run ``<cell>-trial<N>`` and tags it; ``extra_tags``
    and ``run_name`` are a protocol child's."""
    validate(cfg)  # before anything heavy: one clear line on a bad value
    lineage = {}
    if cfg.ckpt:  # and a checkpoint that cannot start this run, before the data and the model
        started_from = check_checkpoint(cfg, cfg.ckpt)
        if cfg.logger.enabled:
            check_folder_owner(cfg.logger.tracking_uri, cfg.ckpt, started_from.run_id)
        if started_from.run_id:
            lineage[Tag.CKPT_RUN] = started_from.run_id
    key = CellKey.from_config(cfg, config_hash(cfg))
    from foxhunt.protocol import needs_protocol, run_cell_protocol

    protocol = needs_protocol(cfg)
    plan = _resume_plan(cfg, key, needs_checkpoint=not protocol) if cfg.resume else None
    if plan is not None and plan.action == SKIP:
        return _skipped(cfg, key, plan, parent_run_id, trial)
    if plan is not None and plan.action == BUSY:  # never a second process on one cell
        return RunOutcome(key, Status.SKIPPED, plan.run_id, {}, plan.describe())
    resumed = plan is not None and plan.action == RESUME
    if resumed and plan.checkpoint is not None:  # the steps logged after its checkpoint died with it
        checked = check_checkpoint(cfg, plan.checkpoint, key=f"resume of run {plan.run_id}: checkpoint", run_id=plan.run_id)
        rewind_run(cfg.logger.tracking_uri, plan.run_id, checked.logging_step, checked.saved_at_ms)
    elif resumed:  # a cell run of folds and seeds logs only its aggregate, recomputed now
        rewind_run(cfg.logger.tracking_uri, plan.run_id, 0, 0)
    name = run_name or cell_name(key, trial)
    tags = {**run_tags(cfg, key), **({Tag.TRIAL: str(trial)} if trial is not None else {}), **lineage, **(extra_tags or {})}

    if protocol:
        metrics, run_id = run_cell_protocol(cfg, name, train_run, tags, parent_run_id, before_fit, SOURCE,
                                            resume_run_id=plan.run_id if resumed else None)  # fmt: skip
        note = plan.describe() if plan is not None else None
        return RunOutcome(key, Status.FINISHED, run_id, metrics, note)

    import lightning.pytorch as pl
    from hydra.utils import instantiate

    from foxhunt.runs.tracked_run import TrackedRun

    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    resolved = resolved_config(cfg)
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(resolved))

    run = None
    if cfg.logger.enabled:
        run = TrackedRun(
            tracking_uri=cfg.logger.tracking_uri,
            experiment=cfg.logger.experiment,
            artifact_location=cfg.logger.artifact_location,
            run_name=name,
            tags=tags,
            parent_run_id=parent_run_id,
            resume_run_id=plan.run_id if resumed else None,
            source=SOURCE,
        )
    with run if run is not None else contextlib.nullcontext():
        if run is not None:
            run.log_config(resolved, OmegaConf.to_yaml(resolved))
        if before_fit is not None:
            before_fit()
        ckpt_path = str(plan.checkpoint) if resumed else cfg.ckpt
        callbacks = [instantiate(node) for node in cfg.callbacks.values()]
        try:
            metrics, scores = _fit_and_score(cfg, callbacks, run, out_dir, ckpt_path)
        finally:  # checkpoints reach the run whatever happened (an interrupted run's too)
            if run is not None and cfg.logger.log_checkpoints:
                for path in _checkpoint_files(callbacks, run.run_id):
                    run.log_artifact(path, CHECKPOINT_ARTIFACTS)
    note = plan.describe() if plan is not None else None
    return RunOutcome(key, Status.FINISHED, run.run_id if run is not None else None, metrics, note, scores=scores)


def _resume_plan(cfg: DictConfig, key: CellKey, needs_checkpoint: bool) -> ResumePlan:
    """What ``resume=true`` does with this run, said in one line in the log."""
    from foxhunt.runs.resume import plan_resume

    if not cfg.logger.enabled:
        plan = ResumePlan(why_fresh="the MLflow store is off (logger.enabled=false)")
    else:
        download = Path(cfg.paths.output_dir) / "resume"
        plan = plan_resume(cfg.logger.tracking_uri, cfg.logger.experiment, key.config_hash, download, needs_checkpoint)
    (log.warning if plan.action in (FRESH, BUSY) else log.info)("%s: resume=true: %s", key.name, plan.describe())
    return plan


def _skipped(cfg: DictConfig, key: CellKey, plan: ResumePlan, parent_run_id: str | None, trial: int | None = None) -> RunOutcome:
    """A cell FINISHED earlier: its result is that run's. Inside a sweep whose parent run is not
    that run's, the skip is recorded on the parent (the cell has no run of its own there, and
    ``foxhunt train status`` shows it SKIPPED from that tag)."""
    outcome = RunOutcome(key, Status.SKIPPED, plan.run_id, dict(plan.metrics), plan.describe(), plan.wall_s)
    if parent_run_id and plan.parent_run_id != parent_run_id:
        from foxhunt.runs.store import RunStore

        result = CellResult(key, Status.SKIPPED, plan.run_id, wall_s=plan.wall_s, metrics=dict(plan.metrics), trial=trial)
        try:
            RunStore(cfg.logger.tracking_uri).tag(parent_run_id, dict([result.skip_tag()]))
        except Exception:  # the cell's result stands; only the job display would miss it
            log.warning("could not record the skip of %s on the parent run %s", key.name, parent_run_id, exc_info=True)
    return outcome


def _fit_and_score(cfg: DictConfig, callbacks, run, out_dir: Path, ckpt_path: str | None) -> tuple[dict[str, float], dict]:
    import lightning.pytorch as pl
    from hydra.utils import instantiate

    from foxhunt.build import build_parts

    parts = build_parts(cfg)
    if run is not None:
        run.log_datasets(bars_datasets(cfg, parts))
    model, datamodule, asset = parts.model, parts.datamodule, parts.asset
    _log_dataset_record(parts.dataset, out_dir, run)
    trainer: pl.Trainer = instantiate(
        cfg.trainer,
        callbacks=callbacks,
        logger=run.logger() if run is not None else False,
        precision=parts.precision.trainer_precision,
        default_root_dir=str(out_dir),
    )
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    if trainer.interrupted:  # Lightning turned a stop request into a clean return
        raise KeyboardInterrupt("training interrupted")
    # fit's last values (val/loss, ...): Lightning resets callback_metrics when test starts
    metrics: dict[str, float] = {k: float(v) for k, v in trainer.callback_metrics.items()}

    test_results = trainer.test(model, datamodule=datamodule, ckpt_path=_best_checkpoint(callbacks), verbose=False)
    metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})
    metrics.update(_memory_peaks(callbacks))
    for result in test_results:
        metrics.update({k: float(v) for k, v in result.items()})
    scoring = scoring_datamodule(cfg, datamodule)
    scores, backtest = {}, {}
    for split in SCORED:
        split_metrics, scores[split] = score_split(model, scoring, split, cfg, asset, out_dir, run)
        backtest.update(split_metrics)
    metrics.update(backtest)
    interpretation, interpreted = _interpret(cfg, model, scoring, out_dir, run)
    metrics.update(interpreted)
    if run is not None:  # only these: what Lightning and the callbacks logged is in the run already
        run.log_metrics({**backtest, **interpreted}, step=logging_step(trainer))
    _print_summary(cfg, {k: v for k, v in metrics.items() if k not in interpreted}, asset)
    if interpretation is not None:
        print(f"  {interpretation.summary_line()}")
    return metrics, scores


def _interpret(cfg: DictConfig, model, datamodule, out_dir: Path, run):
    """A TFT run's interpretability on the test split (:mod:`foxhunt.evaluation.interpret`):
    after the backtest, from the same windows (at most ``evaluation.interpret.max_windows``,
    spread over the split), without gradients; the table and PNGs under ``interpretability/``
    beside the run and in MLflow. Returns the result and its ``test/vsn_*``, ``test/attention/*``
    metrics; a model family that has nothing to say (``interpret_split`` absent or ``None``),
    or ``evaluation.interpret.enabled=false``: ``(None, {})``."""
    settings = cfg.evaluation.get("interpret")
    method = getattr(model, "interpret_split", None)
    if settings is None or not settings.enabled or method is None:
        return None, {}
    from foxhunt.evaluation.interpret import INTERPRET_DIR, write_interpretation

    result = method(datamodule, "test", settings.max_windows)
    if result is None:
        return None, {}
    for path in write_interpretation(result, out_dir / INTERPRET_DIR, title=f"{CellKey.from_config(cfg).name} test split"):
        if run is not None:
            run.log_artifact(path, INTERPRET_DIR)
    return result, result.metrics("test/")


def _log_dataset_record(dataset, out_dir: Path, run) -> None:
    """``dataset.json``: the normalization statistics and feature settings the model reads bars
    with (what ``foxhunt ensemble register`` stores with the model), beside the run and in MLflow;
    for a source that rolls contracts, ``roll_schedule.csv`` (one row per roll, and why)."""
    import json

    from foxhunt.data.dataset import DATASET_RECORD_FILE

    path = out_dir / DATASET_RECORD_FILE
    path.write_text(json.dumps(dataset.record(), indent=1))
    paths = [path]
    if any(arrays.roll_price is not None for arrays in dataset.splits.values()):  # a source that rolls
        from foxhunt.data.roll import ROLL_SCHEDULE_FILE, write_schedule

        paths.append(write_schedule(dataset.rolls, out_dir / ROLL_SCHEDULE_FILE))
    if run is not None:
        for saved in paths:
            run.log_artifact(saved)


def bars_datasets(cfg: DictConfig, parts) -> list:
    """The run's bars as MLflow dataset inputs, one per split (:mod:`foxhunt.runs.provenance`):
    the source and its files, the feature cache key as the digest, each split's extent."""
    import hashlib

    import numpy as np

    from foxhunt.runs.provenance import DIGEST_LENGTH, DatasetRecord

    source_cfg = OmegaConf.to_container(cfg.data.source, resolve=True)
    target = str(source_cfg.pop("_target_"))
    kind = target.rsplit(".", 1)[-1]
    path = source_cfg.get("path")
    source = {"class": target, "asset": parts.asset.key}
    if path:
        source.update(path=str(path), files=[str(p) for p in _source_files(parts.source, path)])
    else:  # generated: its settings are the data
        source["settings"] = source_cfg
    dataset = parts.dataset
    digest = (dataset.cache_key or hashlib.sha256(repr(sorted(source.items())).encode()).hexdigest())[:DIGEST_LENGTH]
    records = []
    for split in SPLITS:
        arrays = dataset.splits.get(split)
        if arrays is None:
            continue
        profile = {"rows": len(arrays), "features": int(arrays.features.shape[1]) if len(arrays) else 0}
        if len(arrays):
            first, last = np.datetime_as_string(arrays.timestamps[[0, -1]], unit="s")
            profile.update(first_bar=f"{first}Z", last_bar=f"{last}Z")
        records.append(
            DatasetRecord(f"{parts.asset.key}-{kind}-{split}", digest, "local" if path else "code", source, split, profile)
        )
    return records


def _source_files(source, path) -> list[Path]:
    """The files a file source reads (its own listing when it has one)."""
    from foxhunt.data.bars import resolve_files
    from foxhunt.data.errors import BarDataError

    try:
        listing = getattr(source, "files", None)
        return list(listing()) if callable(listing) else resolve_files(path, ("",), "bar files")
    except (BarDataError, OSError):
        return []


def _best_checkpoint(callbacks) -> str | None:
    """The best checkpoint's path; ``None`` (the final weights) when there is none, or when a
    resumed run's best checkpoint, restored from its first attempt, is no longer on disk."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    for callback in callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.best_model_path:
            if Path(callback.best_model_path).is_file():
                return callback.best_model_path
            log.warning("best checkpoint %s is gone: testing the final weights", callback.best_model_path)
    return None


def _memory_peaks(callbacks) -> dict[str, float]:
    """The two checked memory peaks of the run (already logged by the memory callback)."""
    from foxhunt.memory.callback import METRIC_PREFIX, MemoryBudgetCallback

    keys = (f"{METRIC_PREFIX}peak_mb", f"{METRIC_PREFIX}device_peak_mb")
    for callback in callbacks:
        if isinstance(callback, MemoryBudgetCallback):
            measured = callback.metrics()
            return {key: float(measured[key]) for key in keys if key in measured}
    return {}


def _checkpoint_files(callbacks, run_id: str) -> list[Path]:
    """The checkpoint files this run wrote (best, last, interrupted, a memory breach's), each
    once: as the stamp callback's checkpoint IO saw them written (never found by listing a
    folder), and each stamped for ``run_id`` (a file stamped for another run is left out, said in
    the log). Without the stamp callback or with another checkpoint IO: the files the checkpoint
    and stop callbacks name."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from foxhunt.checkpoint import RUN_ID, CheckpointStamp, read_stamp
    from foxhunt.jobs.graceful_stop import GracefulStop

    written = next((c.written() for c in callbacks if isinstance(c, CheckpointStamp)), None)
    if written is None:
        named = [p for c in callbacks if isinstance(c, ModelCheckpoint) for p in (c.best_model_path, c.last_model_path)]
        named += [str(c.checkpoint_path or "") for c in callbacks if isinstance(c, GracefulStop)]
        written = [Path(p) for p in named if p and Path(p).is_file()]
    files = sorted({p.resolve() for p in written})
    kept = []
    for path in files:
        stamped = (read_stamp(path) or {}).get(RUN_ID)
        if stamped and stamped != run_id:
            log.warning("%s: stamped for run %s, not this run %s: not logged", path, stamped, run_id)
            continue
        kept.append(path)
    return kept


def _print_summary(cfg: DictConfig, metrics: dict[str, float], asset) -> None:
    from foxhunt.evaluation.backtest import evaluation_annualization
    from foxhunt.evaluation.scoring import summary_lines

    name = CellKey.from_config(cfg).name
    print("\n".join([f"{name}: test split, shared backtest (net of costs)", *summary_lines(metrics, "test/"),
                     f"  {evaluation_annualization(asset, cfg.evaluation).note}"]))  # fmt: skip


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def _hydra_entry(cfg: DictConfig) -> float | None:
    global _ENTERED
    _ENTERED = True  # from here on an OSError is this job's, not Hydra's making of its folder
    import lightning.pytorch  # noqa: F401  (imported now so that its handlers exist to remove)

    from foxhunt.sweeps.job import in_multirun, run_sweep_job

    # Lightning adds console handlers of its own (to `lightning` and `lightning.pytorch`); under
    # Hydra the root logger prints already, so each message would appear twice.
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).handlers.clear()

    if in_multirun():
        metrics = run_sweep_job(cfg, train_run)  # a failing cell returns None
        return None if metrics is None else metrics.get(OBJECTIVE)
    try:  # an input error: one line and exit 2 from here (Hydra would print its job line first)
        with reported(PROG, debug=_DEBUG):
            outcome = train_run(cfg, before_fit=lambda: _use_configured_threads(cfg))
    except SystemExit as exc:
        if not exc.code:  # Lightning's SIGTERMException carries no code, which would exit 0
            raise SystemExit(EXIT_ON_SIGTERM) from exc
        raise
    return outcome.metrics.get(OBJECTIVE)


def _use_configured_threads(cfg: DictConfig) -> None:
    import torch

    from foxhunt.sweeps.resources import configured_threads

    torch.set_num_threads(configured_threads(cfg))


def main() -> None:
    """``foxhunt-train``: an error in the input (a bad override, a config group option that does not
    exist, a bad value, data file, checkpoint or store) is one line on stderr and exit status 2,
    without a traceback unless asked for (``--debug``, ``FOXHUNT_DEBUG=1`` or ``HYDRA_FULL_ERROR=1``:
    :mod:`foxhunt.errors`); a bug keeps its traceback."""
    global _DEBUG, _ENTERED
    _ENTERED = False
    sys.argv, flag = strip_debug_flag(sys.argv)
    _DEBUG = flag or debug_requested()
    # Hydra prints its own report of an error raised while composing the config (and exits 1);
    # with HYDRA_FULL_ERROR set it raises instead, and the error reaches `reported` here.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # not its table-creation notes on stderr
    with reported(PROG, debug=_DEBUG):
        try:
            _hydra_entry()
        except OSError as exc:  # raised before the job ran: Hydra could not make the run folder
            if _ENTERED or is_user_error(exc) or not exc.filename:  # (Hydra's missing-config error is an OSError too)
                raise
            raise FolderError.of(exc, "paths.root_dir or hydra.run.dir") from None


if __name__ == "__main__":
    main()
