"""Progress reporting: a ``progress`` metric in [0, 1] logged to the run while it trains.

The job CLI reads it from the MLflow store to draw progress bars, so it must be cheap and
regular: fraction of the planned training batches done. ``trainer.estimated_stepping_batches``
is Lightning's own count of the optimizer steps the fit will take; times the gradient
accumulation it is the number of batches. Batches, not ``global_step``, are counted because
manual optimization (PPO: several optimizer steps per batch) advances ``global_step`` faster;
the metric is logged at the run's one step unit (:mod:`foxhunt.runs.steps`).

:class:`LineProgress` stands in for Lightning's terminal progress bar when the output is not a
terminal (:func:`foxhunt.training.fit.build_callbacks`): Lightning ships only bars that redraw
a line (tqdm, rich), which fill a log file with carriage returns.
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


class LineProgress(pl.callbacks.ProgressBar):
    """The progress bar of a run whose output is not a terminal (a log file, a job's output): one
    plain line every ``every_n_batches`` training batches and at each epoch's last, with the
    bar's metrics, where the terminal bar would write carriage returns into the file."""

    def __init__(self, every_n_batches: int) -> None:
        super().__init__()
        if every_n_batches < 1:
            raise ValueError(f"callbacks.progress_bar.refresh_rate={every_n_batches}: must be >= 1")
        self.every_n_batches = every_n_batches
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        total = self.total_train_batches
        done = batch_idx + 1
        if not self._enabled or (done % self.every_n_batches and done != total):
            return
        shown = ", ".join(
            f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}"
            for name, value in self.get_metrics(trainer, pl_module).items()
            if name != "v_num"
        )
        of = f"/{total}" if isinstance(total, int) else ""
        print(f"epoch {trainer.current_epoch}: batch {done}{of}" + (f", {shown}" if shown else ""), flush=True)
