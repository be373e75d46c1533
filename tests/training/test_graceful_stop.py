"""A stop request mid-fit leaves a resumable ``interrupted.ckpt``; any other failure leaves none."""

from __future__ import annotations

import signal

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader, TensorDataset

from foxhunt.runs.checkpoints import INTERRUPTED_CHECKPOINT
from foxhunt.training.graceful_stop import GracefulStop, is_stop_request, stop_between_phases, stop_exit_status


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


def test_a_stop_request_saves_a_checkpoint_at_the_step_reached(tmp_path):
    callback = GracefulStop(dirpath=str(tmp_path / "checkpoints"))
    with pytest.raises(SIGTERMException):  # Lightning re-raises it
        _fit(StopsAt(3, SIGTERMException()), tmp_path, callback)
    assert callback.checkpoint_path == tmp_path / "checkpoints" / INTERRUPTED_CHECKPOINT
    saved = torch.load(callback.checkpoint_path, weights_only=True)
    assert saved["global_step"] == 3 and saved["optimizer_states"]  # resumable: weights, optimizer, loops


class CtrlCAt(StopsAt):
    """Presses Ctrl-C (a real SIGINT to this process) ``times`` times during training step ``at``."""

    def __init__(self, at: int, times: int) -> None:
        super().__init__(at, KeyboardInterrupt())
        self.times = times

    def training_step(self, batch, batch_idx):
        if self.global_step == self.at:
            for _ in range(self.times):
                signal.raise_signal(signal.SIGINT)  # its handler runs here, mid-step, as a terminal's would
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)


def test_ctrl_c_stops_after_the_step_in_flight_and_a_second_stops_at_once_without_a_checkpoint(tmp_path):
    """Ctrl-C is SIGTERM's stop: the step in flight ends, then interrupted.ckpt at that step's end. A
    KeyboardInterrupt raised mid-step saved a checkpoint with a half-done batch's counters, and the
    resume was not exact (found by a helper probing kill and resume). A second Ctrl-C stops at once
    and saves nothing; Ctrl-C is Python's own again once the fit is over."""
    sigint = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, whatever the test runner's worker set
    try:
        once = GracefulStop(dirpath=str(tmp_path / "once"))
        with pytest.raises(SIGTERMException) as stopped, stop_between_phases():  # after the step, in a run as foxhunt-train's
            _fit(CtrlCAt(3, times=1), tmp_path, once)
        assert once.stop_signal == "SIGINT" and once.checkpoint_path == tmp_path / "once" / INTERRUPTED_CHECKPOINT
        assert stop_exit_status(stopped.value) == 130  # the shell's status for Ctrl-C, as foxhunt-train exits (it exited 143)
        assert stop_exit_status(SIGTERMException()) == 143
        saved = torch.load(once.checkpoint_path, weights_only=True)
        assert saved["global_step"] == 4  # step 3 ended: its optimizer step taken
        with pytest.raises(KeyboardInterrupt):  # the fit is over: Ctrl-C is Python's own again
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        twice = GracefulStop(dirpath=str(tmp_path / "twice"))
        with pytest.raises(SystemExit):  # Lightning exits 1 on a KeyboardInterrupt
            _fit(CtrlCAt(3, times=2), tmp_path, twice)
        assert twice.checkpoint_path is None and not (tmp_path / "twice").exists()
    finally:
        signal.signal(signal.SIGINT, sigint)  # Lightning ignores Ctrl-C after a KeyboardInterrupt


def test_a_crash_is_not_a_stop_request_and_leaves_no_checkpoint(tmp_path):
    callback = GracefulStop(dirpath=str(tmp_path / "checkpoints"))
    with pytest.raises(ValueError, match="a bug"):
        _fit(StopsAt(2, ValueError("a bug")), tmp_path, callback)
    assert callback.checkpoint_path is None and not (tmp_path / "checkpoints").exists()
    assert not is_stop_request(RuntimeError()) and is_stop_request(SIGTERMException())
