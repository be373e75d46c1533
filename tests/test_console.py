"""The known third-party noise is dropped; everything else from the same loggers still prints."""

from __future__ import annotations

import logging

import foxhunt  # noqa: F401  (installs the filters)
from foxhunt.console import KNOWN_NOISE, silence_known_noise


def test_known_messages_dropped_and_others_kept(caplog):
    silence_known_noise()  # idempotent
    silence_known_noise()
    for name, fragment in KNOWN_NOISE:
        logger = logging.getLogger(name)
        assert sum(fragment in getattr(f, "fragment", "") for f in logger.filters) == 1
        with caplog.at_level(logging.INFO, logger=name):
            caplog.clear()
            logger.warning("prefix %s suffix", fragment)
            logger.warning("GPU available: False, used: False")
        assert [r.getMessage() for r in caplog.records] == ["GPU available: False, used: False"]


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_lightning_litlogger_tip_is_not_printed():
    """A handler on Lightning's own logger (other tests may change levels or propagation)."""
    from lightning import Trainer

    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    collect, level = _Collect(), logger.level
    logger.addHandler(collect)
    logger.setLevel(logging.INFO)
    try:
        Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    finally:
        logger.removeHandler(collect)
        logger.setLevel(level)
    assert not any("litlogger" in m for m in collect.messages)
    assert any("GPU available" in m for m in collect.messages)  # Lightning's other messages still come
