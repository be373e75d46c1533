"""Fixtures of the paper tests: a small DQN + Mamba-2 ensemble on ES, registered as champions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ensemble"))

from ensemble_helpers import FAST, SMALL, cli  # noqa: E402

ENSEMBLE = ["asset=es", "ensemble.models=[dqn,mamba2]", "ensemble.runtime=numpy", "data.source.days=4"]


@pytest.fixture(scope="session")
def paper_store(tmp_path_factory):
    from configs import compose_train_config
    from foxhunt.training.cell import train

    root = tmp_path_factory.mktemp("paper-ensemble")
    for model in ("dqn", "mamba2"):
        train(
            compose_train_config([f"model={model}", *FAST, *SMALL[model], f"paths.output_dir={root / 'outputs' / model}"], root)
        )
    registered = cli(root, "ensemble", "register", "asset=es", "ensemble.models=[dqn,mamba2]", "ensemble.gate=none")
    assert registered.exit_code == 0, registered.output
    return root
