"""Exact resume: a checkpoint every few steps, holding every random stream, put back on resume.

A fit killed at any point and resumed must end with the weights of the fit never killed. What
a checkpoint holds for that:

- weights, optimizer and scheduler states, the loops' counters and the callbacks' states
  (Lightning's own checkpoint);
- the model's own training state: an agent's envs, observation, episode returns, replay buffer
  and generators (:meth:`foxhunt.models.agent.TradingAgent.on_save_checkpoint`); a forecaster's
  position in its epoch's shuffled windows follows from Lightning's loop counters
  (:class:`foxhunt.data.datamodules.EpochShuffle`);
- every global random stream (this callback, :data:`RNG_KEY`): torch's CPU and CUDA generators,
  numpy's and Python's. They are put back when training starts (``on_train_start``), after
  Lightning has built the loaders and before the first step, so the next step draws what it
  would have drawn. foxhunt's data loaders draw from their own generators, never the global
  ones, so building a loader on resume takes nothing from them.

:class:`ResumePoint` also writes ``last.ckpt`` whenever ``trainer.global_step`` has passed a
multiple of ``every_n_train_steps``, as the next batch starts. Not Lightning's
``ModelCheckpoint(every_n_train_steps=...)``: it saves only on an exact multiple (an agent takes
several optimizer steps per batch), and it saves at the end of the batch, before Lightning logs
that batch's metrics, so the values of the checkpoint's own step would be logged after it and
lost with a kill (a resume does not train that batch again). Written through the run's atomic
checkpoint IO
(:mod:`foxhunt.training.checkpoint`): a kill during the write leaves the previous file whole,
and a kill loses at most that many steps. ``resume=true`` continues from the newest of
``last.ckpt`` and ``interrupted.ckpt`` (:mod:`foxhunt.runs.checkpoints`).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from foxhunt.runs.checkpoints import LAST_CHECKPOINT

RNG_KEY = "foxhunt_rng"  # the checkpoint's key of the global random streams


def rng_state() -> dict[str, Any]:
    """Every global random stream, as plain tensors, numbers and lists (a checkpoint loads with
    ``torch.load(weights_only=True)``)."""
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    version, words, python_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "position": int(position),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": int(version), "words": [int(w) for w in words], "gauss": python_gauss},
    }  # fmt: skip
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Put back what :func:`rng_state` saved."""
    torch.set_rng_state(state["torch"])
    numpy = state["numpy"]
    np.random.set_state(
        (numpy["kind"], numpy["keys"].numpy().astype(np.uint32), numpy["position"], numpy["has_gauss"], numpy["gauss"])
    )
    python = state["python"]
    random.setstate((python["version"], tuple(python["words"]), python["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def as_written_at_batch_end(checkpoint: dict[str, Any]) -> None:
    """Lightning's loop counters of a checkpoint written as a batch starts, rewritten to what
    Lightning itself writes at the end of the batch before (the state is the same: that batch is
    done, the next one not started). Lightning reads a checkpoint's counters to know where it
    was taken; at a batch's start it has counted the batch ready, a point it does not resume
    from exactly (it would log every later step one too far). Rewritten: the new batch not ready,
    the previous one not completed, ``_batches_that_stepped`` not yet counting it, which Lightning
    completes and counts on resume; and the epoch's last batch not flagged as started."""
    loop = checkpoint["loops"]["fit_loop"]
    progress = loop["epoch_loop.batch_progress"]
    for counters in (progress["total"], progress["current"]):
        counters["ready"] -= 1
        counters["completed"] -= 1
    # the batch that starts may be the epoch's last: Lightning flags it as it fetches it, and a
    # checkpoint carrying the flag resumes as if the epoch had ended (its last batch and its
    # validation skipped); at the end of the batch before, the flag is down
    progress["is_last_batch"] = False
    loop["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1


class ResumePoint(pl.Callback):
    """``last.ckpt`` every ``every_n_train_steps`` optimizer steps, and the global random streams
    in every checkpoint, put back on resume (module doc)."""

    def __init__(self, dirpath: str, every_n_train_steps: int) -> None:
        if int(every_n_train_steps) < 1:
            raise ValueError(f"callbacks.resume_point.every_n_train_steps={every_n_train_steps!r}: must be >= 1")
        self.dirpath = Path(dirpath)
        self.every = int(every_n_train_steps)
        self._saved_at = 0  # the global step of the last cadence checkpoint
        self._between_batches = False  # a cadence checkpoint is being written
        self._resumed: dict[str, Any] | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._saved_at = trainer.global_step
        if self._resumed is not None:
            set_rng_state(self._resumed)
            self._resumed = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        """Written as the batch after the crossing starts (module doc): the previous batch's
        metrics are logged by then, so a resume from here loses none of them."""
        step = trainer.global_step
        if (
            batch_idx == 0
        ):  # an epoch's first batch: its counters cannot express the batch before (the epoch's end wrote last.ckpt)
            return
        if step // self.every > self._saved_at // self.every:
            self._saved_at = step
            self._between_batches = True
            try:
                trainer.save_checkpoint(self.dirpath / LAST_CHECKPOINT)
            finally:
                self._between_batches = False

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[RNG_KEY] = rng_state()
        if self._between_batches:
            as_written_at_batch_end(checkpoint)

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        self._resumed = checkpoint.get(RNG_KEY)
