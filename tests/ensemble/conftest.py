"""Fixtures of the ensemble tests."""

from __future__ import annotations

import pytest
from ensemble_helpers import FAST, FIFTH, SMALL

from foxhunt.training.cell import train


@pytest.fixture(scope="session")
def store_root(tmp_path_factory):
    """A store holding a FINISHED smoke run of each family of the default ensemble on ES (two DQN
    runs, the second int8) and one of the fifth family, DLinear (outside the default ensemble)."""
    root = tmp_path_factory.mktemp("ensemble")
    from configs import compose_train_config

    metrics = {}
    for model, extra in [*((m, SMALL[m]) for m in SMALL), (FIFTH, []),
                         ("dqn", [*SMALL["dqn"], "precision=int8", "precision.min_quantized_numel=256",
                                  "precision.compile_optimizer=false"])]:  # fmt: skip
        cfg = compose_train_config([f"model={model}", *FAST, *extra,
                                    f"paths.output_dir={root / 'outputs' / f'{model}{len(metrics)}'}"], root)  # fmt: skip
        metrics[f"{model}{len(metrics)}"] = train(cfg)
    return root
