"""Helpers of the ensemble tests: the small models, the CLI run in a store root, the client."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from foxhunt.cli import app

SMALL = {
    # 5 agent steps a batch (a divisor of the default trainer.log_every_n_steps): FAST's 4 batches train
    # about the 16-step versions these tests were built on (two seeds decide differently; at 25 a batch,
    # 100 steps, they converge to one position)
    "dqn": ["model.module.hidden_sizes=[32,32]", "model.module.min_replay_size=8", "model.module.steps_per_call=5"],
    "ppo": ["model.module.policy_hidden_sizes=[32]", "model.module.value_hidden_sizes=[32]", "model.module.update_epochs=1"],
    "mamba2": ["model.module.d_model=32", "model.module.n_layers=1"],
    "tft": ["model.module.hidden_size=16", "model.module.lstm_layers=1"],
}  # fmt: skip
FIFTH = "dlinear"  # a family outside the default ensemble (ensemble.models), trained into the store too
STREAMING_SMALL = {  # the streaming tests' sizes (engine, parity): big enough for two layers, a zero threshold
    "dqn": ["model.module.hidden_sizes=[64,64]"],
    "ppo": ["model.module.policy_hidden_sizes=[64]", "model.module.value_hidden_sizes=[64]"],
    "mamba2": ["model.module.d_model=32", "model.module.n_layers=2", "model.module.position_threshold=0.0"],
    "tft": ["model.module.hidden_size=32", "model.module.lstm_layers=2", "model.module.position_threshold=0.0"],
    "dlinear": ["model.module.position_threshold=0.0"],
}  # fmt: skip
FAST = ["trainer=smoke", "data.source.days=4", "trainer.limit_train_batches=4", "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1", "evaluation.plot_equity=false"]  # fmt: skip
DATA = ["data.source.days=4"]


def cli(root: Path, *args: str):
    old = os.getcwd()
    os.chdir(root)
    try:
        return CliRunner().invoke(app, list(args), catch_exceptions=False, env={"FOXHUNT_ROOT": str(root)})
    finally:
        os.chdir(old)


@contextmanager
def tracking(root: Path):
    """MLflow's tracking URI (the global one MLflow's loaders read) set to ``root``'s store for
    the block, then what it was: Lightning's MLflow logger leaves the last run's store set."""
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    with _use_tracking_uri(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"):
        yield


def client(root: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")
