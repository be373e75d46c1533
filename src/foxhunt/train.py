"""``foxhunt-train``: train one cell of the model x asset grid.

Data flow (../shared/DESIGN.md): compose -> validate -> data -> model -> fit -> test ->
shared backtest -> MLflow. ``train(cfg)`` does the work and returns the metrics; ``main`` is
the ``@hydra.main`` entry that turns a config error into one line and a non-zero exit.

The value ``train`` returns for a sweeper to optimize is ``val/sharpe``: the shared backtest of
the validation split, comparable across all four model families (their own validation losses
are not), and never the test split, which stays unseen until the final report.

Every run goes through :func:`foxhunt.sweeps.cell.run_cell`: in a sweep (``-m``) it isolates a
failing cell, nests the run under the sweep's parent run and applies the strategy's threads,
device and packing check; with ``resume=true`` it skips cells that finished earlier and resumes
interrupted ones from their checkpoint into their own MLflow run.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig, OmegaConf

from foxhunt.config.schema import ConfigError, resolved_config, validate
from foxhunt.sweeps.cells import cell_name, config_hash

if TYPE_CHECKING:
    from foxhunt.sweeps.cell import CellContext

log = logging.getLogger("foxhunt.train")

OBJECTIVE = "val/sharpe"


def run_name(cfg: DictConfig) -> str:
    return cell_name(cfg)


def run_tags(cfg: DictConfig, digest: str | None = None) -> dict[str, str]:
    from hydra.core.hydra_config import HydraConfig

    sweep_id = ""
    if HydraConfig.initialized() and str(HydraConfig.get().mode) == "RunMode.MULTIRUN":
        sweep_id = Path(HydraConfig.get().sweep.dir).name
    return {
        "model": cfg.model.name,
        "asset": cfg.asset.key,
        "precision": cfg.precision.name,
        "strategy": cfg.strategy.name,
        "sweep_id": sweep_id,
        "seed": str(cfg.seed),
        "data_source": cfg.data.source._target_.rsplit(".", 1)[-1],
        "config_hash": digest or config_hash(cfg),
        "output_dir": str(Path(cfg.paths.output_dir).resolve()),
    }


def scoring_datamodule(cfg: DictConfig, datamodule):
    """The datamodule the shared backtest scores: ``datamodule`` itself, or with
    ``evaluation.max_bars`` set, one over the first ``max_bars`` bars of each split (same
    features, normalization and costs; a new datamodule, so training's is left as it was)."""
    max_bars = cfg.evaluation.get("max_bars")
    if max_bars is None:
        return datamodule
    import dataclasses

    from foxhunt.build import build_datamodule

    dataset = datamodule.dataset
    splits = {
        name: dataclasses.replace(
            arrays, timestamps=arrays.timestamps[:max_bars], features=arrays.features[:max_bars],
            close=arrays.close[:max_bars],
        )
        for name, arrays in dataset.splits.items()
    }
    return build_datamodule(cfg, dataclasses.replace(dataset, splits=splits))


def score_split(model, datamodule, split: str, cfg: DictConfig, asset, out_dir: Path, run) -> dict[str, float]:
    """The shared backtest of one split: the same metrics for every model family."""
    from foxhunt.evaluation.backtest import backtest
    from foxhunt.evaluation.plots import plot_equity

    arrays = datamodule.dataset.splits[split]
    positions = model.trading_positions(datamodule, split)
    result = backtest(
        positions,
        arrays.close,
        arrays.timestamps,
        asset,
        commission_usd=cfg.execution.commission_usd,
        slippage_ticks=cfg.execution.slippage_ticks,
    )
    metrics = {f"{split}/{name}": float(value) for name, value in result.metrics.items()}
    if cfg.evaluation.plot_equity and split == "test":
        png = out_dir / f"equity_{split}.png"
        plot_equity(result, arrays.timestamps, png, title=f"{run_name(cfg)} {split} split")
        if run is not None:
            run.log_artifact(png)
    return metrics


def train(cfg: DictConfig, cell: CellContext | None = None) -> dict[str, float]:
    """Train and score one cell; return every metric (``OBJECTIVE`` among them).

    ``cell`` (from :func:`foxhunt.sweeps.cell.run_cell`): the sweep's parent run, the run and
    checkpoint to resume, and the check that must pass before training.
    """
    validate(cfg)  # before anything heavy: one clear line on a bad value

    import lightning.pytorch as pl
    from hydra.utils import instantiate

    from foxhunt.tracking.mlflow_store import TrackedRun

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
            run_name=run_name(cfg),
            tags=run_tags(cfg, cell.config_hash if cell else None),
            parent_run_id=cell.parent_run_id if cell else None,
            resume_run_id=cell.resume_run_id if cell else None,
        )
    with run if run is not None else _NoRun():
        if run is not None:
            run.log_config(resolved, OmegaConf.to_yaml(resolved))
        if cell is not None:
            cell.run_id = run.run_id if run is not None else None
            if cell.preflight is not None:
                cell.preflight()
        ckpt_path = (cell.ckpt_path if cell else None) or cfg.ckpt
        callbacks = [instantiate(node) for node in cfg.callbacks.values()]
        try:
            return _fit_and_score(cfg, callbacks, run, out_dir, ckpt_path)
        finally:  # checkpoints reach the run whatever happened (an interrupted run's too)
            if run is not None and cfg.logger.log_checkpoints:
                for path in _checkpoint_files(callbacks):
                    run.log_artifact(path, "checkpoints")


def _fit_and_score(cfg: DictConfig, callbacks, run, out_dir: Path, ckpt_path: str | None) -> dict[str, float]:
    import lightning.pytorch as pl
    from hydra.utils import instantiate

    from foxhunt.build import build_parts

    parts = build_parts(cfg)
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
    for split in ("val", "test"):
        metrics.update(score_split(model, scoring, split, cfg, asset, out_dir, run))
    if run is not None:
        scored = {k: v for k, v in metrics.items() if k.startswith(("val/", "test/"))}
        run.log_metrics(scored, step=trainer.global_step)
    _print_summary(cfg, metrics)
    return metrics


def _log_dataset_record(dataset, out_dir: Path, run) -> None:
    """``dataset.json``: the normalization statistics and feature settings the model reads bars
    with (what ``foxhunt ensemble register`` stores with the model), beside the run and in MLflow."""
    import json

    from foxhunt.data.dataset import DATASET_RECORD_FILE

    path = out_dir / DATASET_RECORD_FILE
    path.write_text(json.dumps(dataset.record(), indent=1))
    if run is not None:
        run.log_artifact(path)


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


def _checkpoint_files(callbacks) -> list[Path]:
    """Checkpoint files the run's callbacks wrote (best, last, interrupted), each once."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from foxhunt.jobs.graceful_stop import GracefulStop

    folders = {
        Path(c.dirpath) for c in callbacks if isinstance(c, (ModelCheckpoint, GracefulStop)) and c.dirpath
    }
    return sorted({p.resolve() for folder in folders if folder.is_dir() for p in folder.glob("*.ckpt")})


def _print_summary(cfg: DictConfig, metrics: dict[str, float]) -> None:
    keys = [k for k in sorted(metrics) if k.startswith("test/")]
    width = max((len(k) for k in keys), default=0)
    lines = [f"{run_name(cfg)}: test split, shared backtest (net of costs)"]
    lines += [f"  {k:<{width}}  {metrics[k]:.6g}" for k in keys]
    print("\n".join(lines))


class _NoRun:
    def __enter__(self):
        return None

    def __exit__(self, *exc) -> bool:
        return False


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def _hydra_entry(cfg: DictConfig) -> float | None:
    import lightning.pytorch  # noqa: F401  (imported now so that its handlers exist to remove)

    from foxhunt.sweeps.cell import run_cell

    # Lightning adds console handlers of its own (to `lightning` and `lightning.pytorch`); under
    # Hydra the root logger prints already, so each message would appear twice.
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).handlers.clear()

    try:
        metrics = run_cell(cfg, train)  # in a sweep, a failing cell returns None
    except ConfigError as exc:
        print(f"foxhunt-train: config error: {exc}", file=sys.stderr)
        sys.exit(2)
    return None if metrics is None else metrics.get(OBJECTIVE)


def main() -> None:
    _hydra_entry()


if __name__ == "__main__":
    main()
