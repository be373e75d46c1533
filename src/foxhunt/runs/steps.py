"""The step every metric of a run is logged at: one unit for every writer, and for resume.

Lightning logs ``self.log`` values at the count of training batches that stepped
(``fit_loop.epoch_loop._batches_that_stepped``), not at ``trainer.global_step``: the two differ
for manual optimization (DQN takes ``steps_per_call`` optimizer steps per batch, PPO one per
minibatch of every epoch over its rollout). foxhunt's own writers (the memory callback, the
progress metric, the backtest's figures) log at the same batch count, so a run's history has one
step axis, and ``resume=true`` rewinds it by the count the checkpoint was taken at
(:func:`checkpoint_logging_step`).
"""

from __future__ import annotations

from typing import Any

# Where Lightning keeps the count in a checkpoint (loops -> fit_loop -> epoch_loop's state).
_LOOP_KEYS = ("loops", "fit_loop", "epoch_loop.state_dict", "_batches_that_stepped")


def logging_step(trainer: Any) -> int:
    """The step Lightning logs the trainer's metrics at now (training batches that stepped)."""
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


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
