"""The ``progress`` metric: the fraction of planned training batches done, every n batches and at
the end, at the run's logging step."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers.logger import Logger
from torch.utils.data import DataLoader, TensorDataset

from foxhunt.training.progress import ProgressReporter
from tiny_lightning import Regressor


class Collecting(Logger):
    """A Lightning logger that keeps what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, float]] = []

    name, version = "collecting", "0"

    def log_metrics(self, metrics, step=None) -> None:
        if "progress" in metrics:
            self.rows.append((step, metrics["progress"]))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


@pytest.mark.parametrize("accumulate", [1, 2])
def test_progress_counts_batches_and_ends_at_one(accumulate):
    logger = Collecting()
    data = DataLoader(TensorDataset(torch.randn(40, 4), torch.randn(40, 1)), batch_size=4)  # 10 batches an epoch
    trainer = pl.Trainer(accelerator="cpu", max_epochs=2, logger=logger, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                         accumulate_grad_batches=accumulate, callbacks=[ProgressReporter(every_n_steps=5)])  # fmt: skip
    trainer.fit(Regressor(), data)
    fractions = [fraction for _, fraction in logger.rows]
    assert fractions == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])  # every 5 of 20 batches, then the end
    steps = [step for step, _ in logger.rows]
    assert steps == sorted(steps) and steps[-1] == trainer.global_step  # optimizer steps, not batches


def test_every_n_steps_below_one_is_refused_with_its_key():
    with pytest.raises(ValueError, match=r"^callbacks.progress.every_n_steps=0: must be >= 1$"):
        ProgressReporter(every_n_steps=0)
