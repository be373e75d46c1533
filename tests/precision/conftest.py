"""Fixtures of the precision tests: the int8 policy of conf/precision/int8.yaml, models built
from the real configs at small sizes."""

from __future__ import annotations

import pytest
import torch
from precision_helpers import load_policy


@pytest.fixture
def int8_policy():
    """conf/precision/int8.yaml with the eager optimizer step (no per-shape compile in tests)."""
    return load_policy("int8", compile_optimizer=False)


@pytest.fixture
def build(compose_cfg):
    """``build(model, *overrides)`` -> (LightningModule, cfg) built as foxhunt-train builds it."""
    from foxhunt.training.parts import build_model

    def _build(model: str, *overrides: str):
        cfg = compose_cfg([f"model={model}", "logger=none", *overrides])
        torch.manual_seed(0)
        return build_model(cfg), cfg

    return _build
