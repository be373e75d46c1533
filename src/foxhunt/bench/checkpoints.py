"""Section 7: what exact resume costs, a checkpoint's size and its writes' share of a fit.

For each family of ``checkpoint.models`` at its ``conf/model`` size and the default callbacks
(``callbacks.resume_point.every_n_train_steps``, the default cadence, unless the settings' own
overrides change it), one fit of ``checkpoint.crossings`` cadences' worth of optimizer steps (or
``checkpoint.steps`` of the family: the DQN's fit runs past its replay buffer's fill, so its
checkpoints hold the buffer full), then:

- the size of ``last.ckpt`` as the cadence last wrote it (``os.stat``): weights, optimizer
  states, and everything exact resume keeps (an agent's envs, the DQN's replay buffer as filled
  at that step, every random stream);
- the writes' share of the fit: the wall time inside ``Trainer.save_checkpoint`` (gathering the
  state and the atomic write: ``time.perf_counter`` around each call, the cadence's and the
  epoch end's) over the fit's wall time (``Trainer.fit``, validation included). Goal: at most
  ``goals.checkpoint_share_pct`` %.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import lightning.pytorch as pl
from hydra.utils import instantiate
from omegaconf import open_dict

from foxhunt.bench.context import BenchContext
from foxhunt.bench.measure import torch_threads
from foxhunt.bench.report import Row
from foxhunt.training.parts import build_parts

SECTION = "checkpoint"
MB = 1024 * 1024


class WriteTimer(pl.Callback):
    """Times every ``Trainer.save_checkpoint`` of the fit (set up last: after the stamp callback
    has put the atomic checkpoint IO in place)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.writes = 0

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        save = trainer.save_checkpoint

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return save(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                self.writes += 1

        trainer.save_checkpoint = timed  # type: ignore[method-assign]  # this Trainer's own writes, timed on the instance


def measure(ctx: BenchContext, model: str) -> dict[str, float]:
    """One fit of ``model`` (module doc): checkpoint bytes, seconds writing, seconds fitting."""
    s = ctx.settings.checkpoint
    out_dir = ctx.work_dir / "outputs" / SECTION / model
    cfg = ctx.compose(model, [*s.train_overrides], output_dir=out_dir)
    cadence = int(cfg.callbacks.resume_point.every_n_train_steps)
    with open_dict(cfg):
        cfg.trainer.max_steps = int(s.steps.get(model) or cadence * int(s.crossings) + 1)
        cfg.trainer.max_epochs = -1
    parts = build_parts(cfg)
    timer = WriteTimer()
    callbacks = [instantiate(node) for name, node in cfg.callbacks.items() if name not in s.skip_callbacks]
    trainer = instantiate(cfg.trainer, callbacks=[*callbacks, timer], logger=False, plugins=[parts.precision],
                          default_root_dir=str(out_dir), enable_progress_bar=False)  # fmt: skip
    started = time.perf_counter()
    trainer.fit(parts.model, datamodule=parts.datamodule)
    fit_seconds = time.perf_counter() - started
    last = Path(cfg.callbacks.resume_point.dirpath) / "last.ckpt"
    return {"bytes": float(os.stat(last).st_size), "write_s": timer.seconds, "writes": float(timer.writes),
            "fit_s": fit_seconds, "steps": float(trainer.global_step), "cadence": float(cadence)}  # fmt: skip


def run_section(ctx: BenchContext) -> tuple[list[Row], list[str]]:
    s, goal = ctx.settings.checkpoint, float(ctx.settings.goals.checkpoint_share_pct)
    rows: list[Row] = []
    with torch_threads(int(s.threads)):
        for model in s.models:
            ctx.log(f"{SECTION}: {model}")
            got = measure(ctx, str(model))
            share = 100.0 * got["write_s"] / got["fit_s"]
            how = (f"{int(got['writes'])} writes in a fit of {int(got['steps'])} optimizer steps (cadence "
                   f"{int(got['cadence'])}, conf/callbacks/default.yaml), {got['fit_s']:.1f} s of Trainer.fit")  # fmt: skip
            rows += [
                Row(SECTION, f"{model} last.ckpt size", int(s.threads), "MB", got["bytes"] / MB, None, got["bytes"] / MB,
                    "value", None, None, note="os.stat of the cadence's last write: weights, optimizer, resume state"),
                Row(SECTION, f"{model} checkpoint writes' share of the fit", int(s.threads), "%", share, None, share, "value",
                    "<=", goal, note=f"time.perf_counter around each Trainer.save_checkpoint; {how}"),
            ]  # fmt: skip
    return rows, [f"{int(s.threads)} torch thread(s); each family at its conf/model size, the default callbacks"]
