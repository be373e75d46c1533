"""Graceful stop: on SIGTERM or Ctrl-C, save a checkpoint before the run ends.

Lightning already turns SIGTERM into a ``SIGTERMException`` raised at the next step boundary
and Ctrl-C into a ``KeyboardInterrupt``; both reach callbacks through ``on_exception``. This
callback writes ``interrupted.ckpt`` there (weights, optimizer and loop state, resumable with
``ckpt=<path>``; ``resume=true`` finds it: :mod:`foxhunt.runs.checkpoints`), so a stopped run
loses at most the step in flight. The run's :class:`~foxhunt.runs.tracked_run.TrackedRun` then
ends it KILLED.
"""

from __future__ import annotations

import logging
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import SIGTERMException

from foxhunt.runs.checkpoints import INTERRUPTED_CHECKPOINT

log = logging.getLogger(__name__)


def is_stop_request(exception: BaseException) -> bool:
    """True for the exceptions that mean "the user asked the run to stop"."""
    return isinstance(exception, (SIGTERMException, KeyboardInterrupt))


class GracefulStop(pl.Callback):
    def __init__(self, dirpath: str) -> None:
        self.dirpath = Path(dirpath)
        self.checkpoint_path: Path | None = None

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if not is_stop_request(exception) or trainer.state.fn != "fit":
            return
        self.dirpath.mkdir(parents=True, exist_ok=True)
        path = self.dirpath / INTERRUPTED_CHECKPOINT
        trainer.save_checkpoint(path)
        self.checkpoint_path = path
        log.warning("stop requested (%s): checkpoint saved to %s", type(exception).__name__, path)
