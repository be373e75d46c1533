"""A stop request mid-fit leaves a resumable ``interrupted.ckpt``; any other failure leaves none."""

from __future__ import annotations

import signal

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader, TensorDataset

from foxhunt.runs.checkpoints import INTERRUPTED_CHECKPOINT
from foxhunt.training.graceful_stop import GracefulStop, is_stop_request


class StopsAt(pl.LightningModule):
    """A linear regressor that raises ``error`` at training step ``at``."""

    def __init__(self, at: int, error: BaseException) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.at, self.error = at, error

    def training_step(self, batch, batch_idx):
        if self.global_step == self.at:
            raise self.error
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(model, tmp_path, callback):
    data = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4)
    trainer = pl.Trainer(accelerator="cpu", max_steps=20, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
                         default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(model, data)
    return trainer


@pytest.mark.parametrize("error", [SIGTERMException(), KeyboardInterrupt()], ids=["sigterm", "ctrl-c"])
def test_a_stop_request_saves_a_checkpoint_at_the_step_reached(tmp_path, error):
    callback = GracefulStop(dirpath=str(tmp_path / "checkpoints"))
    sigint = signal.getsignal(signal.SIGINT)
    try:
        _fit(StopsAt(3, error), tmp_path, callback)
    except (SIGTERMException, SystemExit):
        pass  # Lightning re-raises a SIGTERMException; after Ctrl-C it exits 1
    finally:
        signal.signal(signal.SIGINT, sigint)  # Lightning ignores Ctrl-C from a KeyboardInterrupt on
    assert callback.checkpoint_path == tmp_path / "checkpoints" / INTERRUPTED_CHECKPOINT
    saved = torch.load(callback.checkpoint_path, weights_only=True)
    assert saved["global_step"] == 3 and saved["optimizer_states"]  # resumable: weights, optimizer, loops


def test_a_crash_is_not_a_stop_request_and_leaves_no_checkpoint(tmp_path):
    callback = GracefulStop(dirpath=str(tmp_path / "checkpoints"))
    with pytest.raises(ValueError, match="a bug"):
        _fit(StopsAt(2, ValueError("a bug")), tmp_path, callback)
    assert callback.checkpoint_path is None and not (tmp_path / "checkpoints").exists()
    assert not is_stop_request(RuntimeError()) and is_stop_request(SIGTERMException())
