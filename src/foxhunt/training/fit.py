"""One cell's fit: parts built once (:func:`foxhunt.training.parts.build_parts`), Lightning's
``fit`` and ``test``, the shared backtest of the scored splits (:mod:`foxhunt.training.scoring`)
and the checkpoint files the run wrote itself (stamped for it: :mod:`foxhunt.training.checkpoint`)."""

from __future__ import annotations

import logging
import os
import sys
from contextlib import nullcontext
from pathlib import Path

import lightning.pytorch as pl
import torch
from hydra.utils import instantiate
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from omegaconf import DictConfig, OmegaConf

from foxhunt.errors import ConfigError, raised_in
from foxhunt.memory.callback import METRIC_PREFIX, MemoryBudgetCallback
from foxhunt.runs.steps import logging_step
from foxhunt.training.checkpoint import RUN_ID, CheckpointStamp, read_stamp
from foxhunt.training.graceful_stop import GracefulStop, check_stop
from foxhunt.training.parts import build_parts
from foxhunt.training.progress import LineProgress
from foxhunt.training.provenance import bars_datasets, check_resumed_data, log_dataset_manifest
from foxhunt.training.scoring import SCORED, interpret_test_split, print_summary, score_split, scoring_datamodule

log = logging.getLogger("foxhunt.train")

SYSTEM_METRICS_KEY = "logger.system_metrics_s"  # seconds between samples of the machine's use (system/*)


def build_callbacks(cfg: DictConfig, terminal: bool | None = None) -> list:
    """The configured callbacks (``cfg.callbacks``) as Lightning's switches expect them: no
    progress bar with ``trainer.enable_progress_bar=false`` (Lightning refuses a bar it was told
    not to show), and, when the output is not a terminal (``terminal``: ``sys.stdout.isatty()``),
    plain progress lines (:class:`foxhunt.training.progress.LineProgress`) in place of the bar."""
    terminal = sys.stdout.isatty() if terminal is None else terminal
    shown = cfg.trainer.get("enable_progress_bar", True) is not False
    callbacks = []
    for node in cfg.callbacks.values():
        callback = instantiate(node)
        if isinstance(callback, ProgressBar):
            if not shown:
                continue
            if not terminal:
                callback = LineProgress(int(getattr(callback, "refresh_rate", 1) or 1))
        callbacks.append(callback)
    return callbacks


def check_accelerator(cfg: DictConfig) -> None:
    """``trainer.accelerator`` asks for a device this machine has (and a precision it can train
    in), and the trainer trains and validates at least one batch, or one line (before the data
    and the model are built; Lightning's own refusal comes later, as a traceback)."""
    accelerator = str(cfg.trainer.get("accelerator") or "auto")
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.accelerator={accelerator}: this machine has no CUDA device that torch "
                          f"{torch.__version__} can use; use trainer.accelerator=cpu (or auto)")  # fmt: skip
    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    trainer_precision = str(cfg.precision.get("trainer_precision") or "")
    if trainer_precision.startswith("16") and not on_gpu:  # fp16 with a loss scaler: a 102-line AssertionError mid-fit
        raise ConfigError(f"precision.trainer_precision={trainer_precision}: float16 training (its loss scaler) needs a "
                          "CUDA device, and this run is on the CPU; use precision=bf16 (bf16-mixed)")  # fmt: skip  # (a helper)
    for key, what in (
        ("limit_train_batches", "trains nothing (the untrained model is tested and scored)"),
        ("limit_val_batches", "validates nothing (the val/ metric chooses the best checkpoint and the champion)"),
    ):
        value = cfg.trainer.get(key)  # 0 ran to FINISHED (found by a helper); checked for training only: a stored config
        if value is not None and value == 0:  # of a registered version validates as it was written
            raise ConfigError(f"trainer.{key}=0: 0 batches {what}: at least one batch, or a fraction in (0.0, 1.0]")
    devices, nodes = cfg.trainer.get("devices", 1), int(cfg.trainer.get("num_nodes", 1) or 1)
    if _device_count(devices, accelerator) > 1 or nodes > 1:
        what = f"trainer.devices={devices}" if nodes <= 1 else f"trainer.num_nodes={nodes}"
        raise ConfigError(f"{what}: foxhunt trains a run in one process on one device (Lightning's DDP would run the "
                          "whole cell once per device: as many MLflow runs); to use several devices, train several "
                          "cells at once (strategy=parallel: one device per job)")  # fmt: skip


def check_cache_dir(cfg: DictConfig) -> None:
    """``data.cache_dir`` is a folder or can be made one, or one line before the run is made: a
    file there (or above it) was an OSError traceback after the run had begun and the data had
    loaded (found by a helper probing the data)."""
    folder = Path(str(cfg.data.cache_dir)).expanduser()
    part = folder
    while not part.exists() and part != part.parent:
        part = part.parent
    if not part.is_dir():
        raise ConfigError(f"data.cache_dir={folder}: {part} is not a folder (the feature cache is written under it)")


def _device_count(devices, accelerator: str) -> int:
    """How many devices ``trainer.devices`` asks Lightning for (``auto`` and -1: every device of
    the accelerator it picks; a CPU counts as one for ``auto``, as Lightning's, and as its cores for -1)."""
    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if devices == "auto":
        return torch.cuda.device_count() if on_gpu else 1
    if devices == -1:
        return torch.cuda.device_count() if on_gpu else (os.cpu_count() or 1)
    if isinstance(devices, str):
        return len([part for part in devices.split(",") if part.strip()])
    if isinstance(devices, int):
        return devices
    return len(list(devices))


def fit_and_score(cfg: DictConfig, callbacks, run, out_dir: Path, ckpt_path: str | None) -> tuple[dict[str, float], dict]:
    """Build, fit, test and score, with the machine's use sampled into the run's ``system/*``
    metrics meanwhile every ``logger.system_metrics_s`` seconds (absent, as in a config stored
    before the setting, or null: not sampled)."""
    interval = OmegaConf.select(cfg, SYSTEM_METRICS_KEY, default=None)
    with run.system_metrics(interval) if run is not None else nullcontext():
        return _fit_and_score(cfg, callbacks, run, out_dir, ckpt_path)


def _fit_and_score(cfg: DictConfig, callbacks, run, out_dir: Path, ckpt_path: str | None) -> tuple[dict[str, float], dict]:
    parts = build_parts(cfg)
    if run is not None:
        inputs = bars_datasets(cfg, parts)  # writes provenance/data.json
        check_resumed_data(out_dir, run)  # before anything of this attempt is logged or trained
        run.log_datasets(inputs)
    model, datamodule, asset = parts.model, parts.datamodule, parts.asset
    log_dataset_manifest(parts.dataset, out_dir, run)
    try:
        trainer: pl.Trainer = instantiate(
            cfg.trainer,
            callbacks=callbacks,
            logger=run.logger() if run is not None else False,
            plugins=[parts.precision],
            default_root_dir=str(out_dir),
        )
    except Exception as exc:  # Lightning refusing a combination of its switches (or a value): the user's config
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        if isinstance(cause, MisconfigurationException) or raised_in(cause).startswith("lightning"):
            raise _refused(cfg, str(cause).strip().splitlines()[0]) from None  # accelerator='', strategy=foo: tracebacks
        raise
    check_stop()  # a SIGTERM while the data and the model were built: stop before the fit
    try:
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    except (MisconfigurationException, ValueError, RuntimeError) as exc:
        refusal = lightning_refusal(exc, trainer)
        if refusal is None:
            raise
        raise _refused(cfg, refusal) from None
    if trainer.interrupted:  # Lightning turned a stop request into a clean return
        raise KeyboardInterrupt("training interrupted")
    # fit's last values (val/loss, ...): Lightning resets callback_metrics when test starts
    metrics: dict[str, float] = {k: float(v) for k, v in trainer.callback_metrics.items()}

    test_results = trainer.test(model, datamodule=datamodule, ckpt_path=_best_checkpoint(callbacks), verbose=False)
    check_stop()  # a SIGTERM in the test stage: Lightning noted it and went on
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


def _refused(cfg: DictConfig, said: str) -> ConfigError:
    """What Lightning said when it refused its settings (building the Trainer, or at fit), one line."""
    return ConfigError(f"Lightning refuses the trainer and callback settings for model={cfg.model.name}: {said}")


def lightning_refusal(exc: BaseException, trainer: pl.Trainer) -> str | None:
    """The first line of an error Lightning raised about the settings it was given, None for any
    other (a bug keeps its traceback). It is the settings' when Lightning's own code raised it
    (the innermost frame is Lightning's) and it is Lightning's word for a bad setting
    (``MisconfigurationException``: gradient clipping or accumulation on a family that steps
    its optimizer itself, a monitor no metric matches), a ``ValueError`` before the first step
    (``val_check_interval`` past the epoch's batches), or early stopping on a metric no one logs.
    Each was a traceback of 60-80 lines (found by a helper probing Lightning's switches)."""
    module = raised_in(exc)
    if not module.startswith("lightning."):
        return None
    text = str(exc).strip().splitlines()[0].strip() if str(exc).strip() else type(exc).__name__
    if isinstance(exc, MisconfigurationException):
        return text
    if isinstance(exc, ValueError) and trainer.global_step == 0:
        return text
    if isinstance(exc, RuntimeError) and module.startswith("lightning.pytorch.callbacks.early_stopping"):
        return text
    return None


def _best_checkpoint(callbacks) -> str | None:
    """The best checkpoint's path; ``None`` (the final weights) when there is none, or when a
    resumed run's best checkpoint, restored from its first attempt, is no longer on disk."""
    for callback in callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.best_model_path:
            if Path(callback.best_model_path).is_file():
                return callback.best_model_path
            log.warning("best checkpoint %s is gone: testing the final weights", callback.best_model_path)
    return None


def _memory_peaks(callbacks) -> dict[str, float]:
    """The two checked memory peaks of the run (already logged by the memory callback)."""
    keys = (f"{METRIC_PREFIX}peak_mb", f"{METRIC_PREFIX}device_peak_mb")
    for callback in callbacks:
        if isinstance(callback, MemoryBudgetCallback):
            measured = callback.metrics()
            return {key: float(measured[key]) for key in keys if key in measured}
    return {}


def best_checkpoint(callbacks) -> Path | None:
    """The file the monitoring checkpoint callback holds the run's best in: ``best.ckpt``, or
    ``best-v1.ckpt`` when a resumed fit's new best found its killed attempt's file in the way
    (Lightning names it apart); None before a best was written."""
    for callback in callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.monitor is not None and callback.best_model_path:
            return Path(callback.best_model_path).resolve()
    return None


def checkpoint_files(callbacks, run_id: str) -> list[Path]:
    """The checkpoint files this run wrote (best, last, interrupted, a memory breach's), each
    once: as the stamp callback's checkpoint IO saw them written, and the best and last files the
    checkpoint callbacks point at when stamped for ``run_id`` (a resumed fit whose best stayed
    its first attempt's, killed before it logged anything); never found by listing a folder, and
    each stamped for ``run_id`` (a file stamped for another run is left out, said in the log).
    Without the stamp callback or with another checkpoint IO: the files the checkpoint and stop
    callbacks name."""
    written = next((c.written() for c in callbacks if isinstance(c, CheckpointStamp)), None)
    named = [Path(p) for c in callbacks if isinstance(c, ModelCheckpoint) for p in (c.best_model_path, c.last_model_path) if p]
    if written is None:
        named += [Path(str(c.checkpoint_path)) for c in callbacks if isinstance(c, GracefulStop) and c.checkpoint_path]
        written = [p for p in named if p.is_file()]
    else:  # a resumed fit's best (and last) may be its first attempt's, written before a kill -9 nothing logged
        written = [*written, *(p for p in named if p.is_file() and (read_stamp(p) or {}).get(RUN_ID) == run_id)]
    files = sorted({p.resolve() for p in written})
    kept = []
    for path in files:
        stamped = (read_stamp(path) or {}).get(RUN_ID)
        if stamped and stamped != run_id:
            log.warning("%s: stamped for run %s, not this run %s: not logged", path, stamped, run_id)
            continue
        kept.append(path)
    return kept
