"""A config node built into its object, a bad value in it one line naming its key.

Hydra wraps whatever a ``_target_`` raises in an ``InstantiationException`` whose message is the
whole chain, and foxhunt's own one-line errors inside it (a warm-start path that is not there,
an asset's session time) came out as 70-100 line tracebacks after the run was made (found by a
helper probing the CLI). :func:`instantiate_setting` unwraps them: foxhunt's own input error is
raised as it is; an error raised by a library's own check of what it was given (Hydra locating a
target, Lightning refusing an accelerator, ``zoneinfo`` an unknown zone) is a :class:`ConfigError`
naming the key; any other (a bug in foxhunt's code) keeps its traceback.
"""

from __future__ import annotations

import logging
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate

from foxhunt.errors import ConfigError, UserError, one_line, raised_in

SAID_LIMIT = 300  # characters of what the library said
LIGHTNING_NOTES = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")  # its INFO lines


def instantiate_setting(node: Any, key: str, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate(node, **kwargs)``; a bad value in it one line naming ``key`` (module doc)."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as exc:
        error = config_error(exc, key)
        if error is exc:  # a bug: its whole chain, the target's own traceback in it
            raise
        raise error from None


def check_instantiable(cfg) -> None:
    """Build what a run builds from its config's own ``_target_`` nodes that costs nothing (the
    asset, the precision policy, the budget, each callback, a Trainer of the trainer section)
    before the run is made: a bad value is one line there, not a traceback after (module doc)."""
    for key in ("asset", "precision", "budget"):
        if cfg.get(key) is not None:
            instantiate_setting(cfg[key], key)
    for name, node in (cfg.get("callbacks") or {}).items():
        if node is not None:
            instantiate_setting(node, f"callbacks.{name}")
    if cfg.get("trainer") is not None:  # Lightning's own refusal (strategy=foo, accelerator='') came after the run was
        # made (found by a helper reviewing the change): a Trainer of the section alone costs milliseconds, writes nothing
        quiet = [logging.getLogger(name) for name in LIGHTNING_NOTES]
        levels = [logger.level for logger in quiet]
        for logger in quiet:
            logger.setLevel(logging.WARNING)  # its device lines and tips, said again by the run's own Trainer
        try:
            instantiate_setting(cfg.trainer, "trainer", logger=False, callbacks=[], enable_checkpointing=False)
        finally:
            for logger, level in zip(quiet, levels):
                logger.setLevel(level)


def config_error(exc: BaseException, key: str) -> BaseException:
    """What ``exc`` (raised building ``key``) stands for: the user's error, or ``exc`` itself (a bug)."""
    cause = exc.__cause__ if isinstance(exc, InstantiationException) and exc.__cause__ is not None else exc
    if isinstance(cause, UserError):
        return cause
    if raised_in(cause).startswith("foxhunt."):
        return exc
    said = one_line(str(cause), SAID_LIMIT) or type(cause).__name__  # Hydra's "Error loading 'x':" says why on its next lines
    return ConfigError(f"{key}: {said}")
