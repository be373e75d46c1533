"""Progress reporting: a ``progress`` metric in [0, 1] logged to the run while it trains.

The job CLI reads it from the MLflow store to draw progress bars, so it must be cheap and
regular: fraction of the planned training batches done. ``trainer.estimated_stepping_batches``
is Lightning's own count of the optimizer steps the fit will take; times the gradient
accumulation it is the number of batches. Batches, not ``global_step``, are counted because
manual optimization (PPO: several optimizer steps per batch) advances ``global_step`` faster;
the metric is logged at the run's one step unit (:mod:`foxhunt.runs.steps`).
"""

from __future__ import annotations

import math

import lightning.pytorch as pl

from foxhunt.runs.steps import logging_step


class ProgressReporter(pl.Callback):
    def __init__(self, every_n_steps: int) -> None:
        if every_n_steps < 1:
            raise ValueError(f"callbacks.progress.every_n_steps={every_n_steps}: must be >= 1")
        self.every_n_steps = every_n_steps

    def _log(self, trainer: pl.Trainer, fraction: float) -> None:
        for logger in trainer.loggers:
            logger.log_metrics({"progress": fraction}, step=logging_step(trainer))

    @staticmethod
    def fraction_done(trainer: pl.Trainer) -> float:
        total = trainer.estimated_stepping_batches * trainer.accumulate_grad_batches
        if not total or math.isinf(total):
            return 0.0
        done = trainer.fit_loop.epoch_loop.total_batch_idx + 1
        return min(1.0, done / total)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if (trainer.fit_loop.epoch_loop.total_batch_idx + 1) % self.every_n_steps == 0:
            self._log(trainer, self.fraction_done(trainer))

    def on_train_end(self, trainer: pl.Trainer, pl_module) -> None:
        self._log(trainer, self.fraction_done(trainer))
