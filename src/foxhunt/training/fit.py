"""One cell's fit: parts built once (:func:`foxhunt.training.parts.build_parts`), Lightning's
``fit`` and ``test``, the shared backtest of the scored splits (:mod:`foxhunt.training.scoring`)
and the checkpoint files the run wrote itself (stamped for it: :mod:`foxhunt.training.checkpoint`)."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from foxhunt.runs.steps import logging_step
from foxhunt.training.provenance import bars_datasets, log_dataset_manifest
from foxhunt.training.scoring import SCORED, interpret_test_split, print_summary, score_split, scoring_datamodule

log = logging.getLogger("foxhunt.train")


def fit_and_score(cfg: DictConfig, callbacks, run, out_dir: Path, ckpt_path: str | None) -> tuple[dict[str, float], dict]:
    import lightning.pytorch as pl
    from hydra.utils import instantiate

    from foxhunt.training.parts import build_parts

    parts = build_parts(cfg)
    if run is not None:
        run.log_datasets(bars_datasets(cfg, parts))
    model, datamodule, asset = parts.model, parts.datamodule, parts.asset
    log_dataset_manifest(parts.dataset, out_dir, run)
    trainer: pl.Trainer = instantiate(
        cfg.trainer,
        callbacks=callbacks,
        logger=run.logger() if run is not None else False,
        plugins=[parts.precision],
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
    interpretation, interpreted = interpret_test_split(cfg, model, scoring, out_dir, run)
    metrics.update(interpreted)
    if run is not None:  # only these: what Lightning and the callbacks logged is in the run already
        run.log_metrics({**backtest, **interpreted}, step=logging_step(trainer))
    print_summary(cfg, {k: v for k, v in metrics.items() if k not in interpreted}, asset)
    if interpretation is not None:
        print(f"  {interpretation.summary_line()}")
    return metrics, scores


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


def checkpoint_files(callbacks, run_id: str) -> list[Path]:
    """The checkpoint files this run wrote (best, last, interrupted, a memory breach's), each
    once: as the stamp callback's checkpoint IO saw them written (never found by listing a
    folder), and each stamped for ``run_id`` (a file stamped for another run is left out, said in
    the log). Without the stamp callback or with another checkpoint IO: the files the checkpoint
    and stop callbacks name."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from foxhunt.training.checkpoint import RUN_ID, CheckpointStamp, read_stamp
    from foxhunt.training.graceful_stop import GracefulStop

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
