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


def test_lightning_litlogger_tip_is_not_printed(caplog):
    from lightning import Trainer

    with caplog.at_level(logging.INFO):
        Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    messages = [r.getMessage() for r in caplog.records]
    assert not any("litlogger" in m for m in messages)
    assert any("GPU available" in m for m in messages)  # Lightning's other messages still come
