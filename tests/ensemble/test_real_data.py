"""The ensemble on real bars: a smoke run trained on the real 6E file, registered and replayed bar by
bar over its test split, gives the training run's own backtest."""

from __future__ import annotations

import os

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from foxhunt.cli import app
from foxhunt.training.cell import train


@pytest.mark.realdata
def test_a_6e_ensemble_replays_the_real_file_as_its_runs_scored_it(real_data_dir, tmp_path):
    from configs import compose_train_config

    data = ["asset=6e", "data=csv", f"data.source.path={real_data_dir / '6e_minute'}"]
    for model, small in (("dqn", ["model.module.hidden_sizes=[32,32]", "model.module.min_replay_size=8"]),
                         ("tft", ["model.module.hidden_size=16", "model.module.lstm_layers=1"])):  # fmt: skip
        cfg = compose_train_config([f"model={model}", *data, *small, "trainer=smoke", "trainer.limit_train_batches=4",
                                    "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "evaluation.max_bars=null",
                                    "evaluation.plot_equity=false", f"paths.output_dir={tmp_path / model}"], tmp_path)  # fmt: skip
        train(cfg)
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        runner = CliRunner()
        env = {"FOXHUNT_ROOT": str(tmp_path)}
        models = ["ensemble.models=[dqn,tft]", *data]
        registered = runner.invoke(app, ["ensemble", "register", *models, "ensemble.gate=none"], env=env, catch_exceptions=False)
        assert registered.exit_code == 0, registered.output
        replayed = runner.invoke(app, ["ensemble", "replay", *models], env=env, catch_exceptions=False)
        assert replayed.exit_code == 0, replayed.output
    finally:
        os.chdir(old)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ensemble").experiment_id])
    for family in ("dqn", "tft"):
        trained = client.get_run(client.get_model_version_by_alias(f"foxhunt-{family}-6e", "champion").run_id).data.metrics
        assert run.data.metrics[f"foxhunt-{family}-6e/pnl"] == pytest.approx(trained["test/pnl"])
        assert run.data.metrics[f"foxhunt-{family}-6e/trades"] == trained["test/trades"]
    assert "the test split" in replayed.output
