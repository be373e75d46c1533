"""The step every metric of a run is logged at: one unit for every writer, and for resume.

Lightning logs ``self.log`` values at the count of training batches that stepped
(``fit_loop.epoch_loop._batches_that_stepped``), not at ``trainer.global_step``: the two differ
for manual optimization (PPO takes one optimizer step per minibatch of every epoch over its
rollout, and logs per rollout). foxhunt's own writers (the memory callback, the progress metric,
the backtest's figures) log at the same count, so a run's history has one step axis, and
``resume=true`` rewinds it by the count the checkpoint was taken at (:func:`checkpoint_logging_step`).

A module whose ``training_step`` runs several steps of its own that a user counts as one each
(DQN's ``steps_per_call`` agent steps) keeps the axis on them with :func:`log_on_step`: its
history, its logging cadence (``trainer.log_every_n_steps``, Lightning's gate on this count) and
its checkpoints' counts are then those of a fit with one step per call.
"""

from __future__ import annotations

from typing import Any

# Where Lightning keeps the count in a checkpoint (loops -> fit_loop -> epoch_loop's state).
_LOOP_KEYS = ("loops", "fit_loop", "epoch_loop.state_dict", "_batches_that_stepped")


def logging_step(trainer: Any) -> int:
    """The step Lightning logs the trainer's metrics at now (training batches that stepped, or
    the steps :func:`log_on_step` counts)."""
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def log_on_step(trainer: Any, steps_done: int) -> None:
    """Put the logging step of the training batch in progress at ``steps_done`` (steps completed,
    this batch's included), as it is where each batch is one step: called at the end of
    ``training_step``, before Lightning's logging gate reads the count and before
    ``on_train_batch_end`` (where a checkpoint saves it); Lightning adds this batch's one after
    ``on_train_batch_end``, and a fit resumed from such a checkpoint adds it on restart, as for any
    batch."""
    trainer.fit_loop.epoch_loop._batches_that_stepped = int(steps_done) - 1


def checkpoint_logging_step(checkpoint: dict[str, Any]) -> int | None:
    """The logging step a Lightning checkpoint was saved at; None when it does not say (no
    count there, or one that is no number: a damaged or hand-edited checkpoint)."""
    value: Any = checkpoint
    for key in _LOOP_KEYS:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None
