"""foxhunt-train end to end: a run lands in MLflow with everything a user looks for."""

from __future__ import annotations

import getpass
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from configs import synthetic_source
from foxhunt.config.families import family_names
from foxhunt.training.cell import OBJECTIVE, train
from train_entry import run_foxhunt_train

MODELS = family_names()  # every family of conf/model/, a new one included
ASSETS = ["es", "nq", "6e", "zn"]


def _store(root: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")


def _runs(root: Path):
    client = _store(root)
    experiment = client.get_experiment_by_name("foxhunt")
    return [] if experiment is None else client.search_runs([experiment.experiment_id])


def _artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> list[str]:
    found = []
    for item in client.list_artifacts(run_id, path):
        found += _artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return found


def test_smoke_run_lands_in_mlflow_with_params_metrics_and_artifacts(compose_cfg, tmp_path):
    cfg = compose_cfg(["model=dqn", "asset=nq", "trainer=smoke"])
    metrics = train(cfg)

    assert OBJECTIVE in metrics and "test/sharpe" in metrics
    (run,) = _runs(tmp_path)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "dqn-nq-fp32"
    tags = run.data.tags
    assert {tags[k] for k in ("model", "asset", "precision", "strategy")} == {"dqn", "nq", "fp32", "sequential"}
    assert run.data.params["model.module.lr"] == "0.001"
    assert run.data.params["asset.tick_size"] == "0.25"
    for key in ("test/sharpe", "test/pnl", "test/max_drawdown", "test/hit_rate", "val/sharpe", "progress"):
        assert key in run.data.metrics, key
    assert run.data.metrics["test/sharpe"] == pytest.approx(metrics["test/sharpe"])
    artifacts = _artifacts(_store(tmp_path), run.info.run_id)
    assert "config.yaml" in artifacts and "equity_test.png" in artifacts
    # logger.log_checkpoints=best: a finished run stores its best checkpoint once (it stored a
    # second, identical-sized last.ckpt before); its last.ckpt stays in its folder
    assert "checkpoints/best.ckpt" in artifacts and "checkpoints/last.ckpt" not in artifacts
    assert (Path(run.data.tags["output_dir"]) / "checkpoints" / "last.ckpt").is_file()


def test_a_run_says_where_it_came_from_source_commit_and_bars(compose_cfg, tmp_path):
    """The runs table's Source and Dataset columns: the entry point, the git commit of this
    checkout, and one dataset input per split with the feature cache key as its digest."""
    from foxhunt.training.parts import build_parts

    cfg = compose_cfg(["model=dqn", "trainer=smoke", "data.source.days=7", "evaluation.plot_equity=false"])
    train(cfg)
    (run,) = _runs(tmp_path)
    assert run.data.tags["mlflow.source.name"] == "foxhunt-train"
    assert run.data.tags["mlflow.source.type"] == "LOCAL"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True)
    if head.returncode == 0:  # a git checkout (a copy without .git has no commit to name)
        assert run.data.tags["mlflow.source.git.commit"] == head.stdout.strip()
    inputs = {i.tags[0].value: i.dataset for i in run.inputs.dataset_inputs}
    assert sorted(inputs) == ["test", "train", "val"]
    dataset = build_parts(cfg).dataset
    for split, found in inputs.items():
        profile = json.loads(found.profile)
        # the digest is the split's own bars (all three splits carried one digest, the feature cache key's)
        assert found.name == f"es-SyntheticBarSource-{split}" and found.digest == profile["sha256"][:16]
        assert profile["rows"] == len(dataset.splits[split])
        assert json.loads(found.source)["settings"]["days"] == 7
    assert len({found.digest for found in inputs.values()}) == 3
    assert run.data.tags["mlflow.user"] == run.info.user_id == getpass.getuser()  # user_id was "unknown"


def test_resume_says_in_one_line_that_it_found_nothing_then_skips_the_finished_run(compose_cfg, tmp_path, caplog):
    from foxhunt.runs.config_hash import config_hash
    from foxhunt.training.cell import run_cell

    cfg = compose_cfg(["model=dqn", "trainer=smoke", "data.source.days=7", "evaluation.plot_equity=false", "resume=true"])
    with caplog.at_level(logging.INFO, logger="foxhunt.train"):
        first = run_cell(cfg)
    said = [r for r in caplog.records if "resume=true" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and "\n" not in said[0].getMessage()
    assert f"from scratch: no earlier run with config_hash {config_hash(cfg)}" in said[0].getMessage()
    assert first.status == "FINISHED"
    again = run_cell(cfg)
    assert (again.status, again.run_id, again.note) == (
        "SKIPPED",
        first.run_id,
        f"skipped: FINISHED earlier in run {first.run_id}",
    )
    assert again.metrics["test/sharpe"] == pytest.approx(first.metrics["test/sharpe"])
    assert len(_runs(tmp_path)) == 1


def test_checkpoint_loads_with_weights_only(compose_cfg, tmp_path):
    import torch

    train(compose_cfg(["model=dqn", "trainer=smoke", "logger=none"]))
    (checkpoint,) = (tmp_path / "outputs" / "run" / "checkpoints").glob("best.ckpt")
    state = torch.load(checkpoint, weights_only=True)
    assert "state_dict" in state and state["hyper_parameters"]["hidden_sizes"] == [256, 256]


# Each model on two assets, every asset for at least two models (a Latin pairing: the whole grid
# costs four times as much and checks nothing more; every model x precision through the CLI:
# test_run_records).
PAIRS = [(model, ASSETS[(i + shift) % len(ASSETS)]) for shift in (0, 1) for i, model in enumerate(MODELS)]
# The forecasters at a small width (both took 3-4 times DQN's seconds at their default sizes): what
# is checked is that each asset's data reaches the model and the scores, and which bars are
# scored, not a size.
SMALLER = {
    "tft": ["model.module.hidden_size=16", "model.module.lstm_layers=1"],
    "mamba2": ["model.module.d_model=32", "model.module.n_layers=1"],
}


@pytest.mark.parametrize(("model", "asset"), PAIRS)
def test_every_model_trains_on_two_assets_and_every_asset_for_two_models(compose_cfg, model, asset):
    overrides = [f"model={model}", f"asset={asset}", "trainer=smoke", "logger=none", "data.source.days=7"]
    metrics = train(compose_cfg([*overrides, *SMALLER.get(model, [])]))
    assert {"test/sharpe", "test/pnl", "val/sharpe"} <= set(metrics)
    assert all(value == value for value in metrics.values()), metrics  # no NaN


@pytest.mark.parametrize("model", ["tft", "dqn"])
def test_max_bars_scores_the_first_bars_of_each_split_and_leaves_training_data(compose_cfg, model):
    from foxhunt.training.parts import build_parts
    from foxhunt.training.scoring import scoring_datamodule

    cfg = compose_cfg(
        [f"model={model}", "trainer=smoke", "data.source.days=30", "evaluation.max_bars=700", *SMALLER.get(model, [])]
    )
    assert compose_cfg(["trainer=smoke"]).evaluation.max_bars == 2000  # smoke's own limit
    assert compose_cfg([]).evaluation.max_bars is None  # a real run scores whole splits
    parts = build_parts(cfg)
    scoring = scoring_datamodule(cfg, parts.datamodule)
    for split in ("val", "test"):
        full, limited = parts.dataset.splits[split], scoring.dataset.splits[split]
        assert len(full) > 700 and len(limited) == 700
        assert (limited.close == full.close[:700]).all() and (limited.features == full.features[:700]).all()
        assert (limited.timestamps == full.timestamps[:700]).all()
        assert len(parts.datamodule.dataset.splits[split]) == len(full)  # training's data untouched
        positions = parts.model.trading_positions(scoring, split)
        assert positions.shape == (700,)
    assert len(scoring.dataset.splits["train"]) == len(parts.dataset.splits["train"])  # train is not scored: whole


def test_an_agent_scored_on_fewer_bars_than_its_episode_finishes(compose_cfg):
    """evaluation.max_bars below the agent's episode length: the scoring datamodule keeps the
    train split whole (its episodes are checked against it), so the run scores 200 bars."""
    cfg = compose_cfg(["model=dqn", "trainer=smoke", "data.source.days=7", "logger=none", "evaluation.max_bars=200"])
    assert cfg.model.env.episode_len > 200
    metrics = train(cfg)
    assert metrics["test/steps"] == 199  # 200 bars, 199 position changes scored


def test_a_failing_run_is_marked_failed_with_its_error(compose_cfg, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp_utc,open,high,low,close,volume\n2024-01-02 00:01:00,1.1,1.09,1.1,1.1,5\n")
    cfg = compose_cfg(["model=dqn", "asset=6e", "data=csv", f"data.source.path={bad}", "trainer=smoke"])
    with pytest.raises(ValueError, match="bad.csv"):
        train(cfg)
    (run,) = _runs(tmp_path)
    assert run.info.status == "FAILED"
    assert "bad.csv" in run.data.tags["error"]


@pytest.mark.realdata
def test_trains_on_real_6e_bars_through_the_csv_source(compose_cfg, real_data_dir, tmp_path):
    path = real_data_dir / "6e_minute" / "6EH4_1min_bars_20240101_20240131.csv.gz"
    metrics = train(compose_cfg(["model=dqn", "asset=6e", "data=csv", f"data.source.path={path}", "trainer=smoke"]))
    assert "test/sharpe" in metrics
    (run,) = _runs(tmp_path)
    assert run.info.status == "FINISHED" and run.data.tags["data_source"] == "CsvBarSource"


def test_trains_on_a_databento_dbn_file(compose_cfg, tmp_path):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from foxhunt.data.sources.databento import write_ohlcv_1m

    asset = instantiate(OmegaConf.load(Path(__file__).parents[2] / "conf" / "asset" / "es.yaml"))
    bars = synthetic_source(days=30, seed=3).load(asset)
    dbn = tmp_path / "glbx-es-ohlcv-1m.dbn.zst"
    write_ohlcv_1m(bars, dbn, symbol="ESH4", instrument_id=4242)
    cfg = compose_cfg(["model=dqn", "asset=es", "data=databento", f"data.source.path={dbn}", "trainer=smoke"])
    assert "test/sharpe" in train(cfg)
    (run,) = _runs(tmp_path)
    assert run.info.status == "FINISHED" and run.data.tags["data_source"] == "DatabentoBarSource"


def _cli(args: list[str], root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FOXHUNT_ROOT": str(root), "HYDRA_FULL_ERROR": "0"}
    command = [str(Path(sys.executable).parent / "foxhunt-train"), *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=root, timeout=120)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.module.learning_rate=-0.001", "model.module.learning_rate=-0.001: must be a number > 0"),
        ("model.window.horizon=60", "model.window.horizon=60: must be < model.window.seq_len (50)"),
        ("data.split.train=0.9", "data.split.train=0.9: train + val + test must sum to 1"),
        ("seed=-1", "seed=-1: Input should be greater than or equal to 0"),
        ("precision.trainer_precision=fp8", "precision.trainer_precision='fp8': Input should be"),
        ("+model.module.hidden_sise=64", "model.module.hidden_sise: not a parameter of TemporalFusionTransformer"),
        ("model.module.num_heads=3", "model.module.num_heads=3: must divide model.module.hidden_size (256)"),
        ("evaluation.max_bars=0", "evaluation.max_bars=0: Input should be greater than or equal to 2"),
        ("model.module.horizon=500", "model.module.horizon=500: the model's horizon is model.window.horizon (10); set that key"),
    ],
)
def test_impossible_values_fail_with_one_line_and_leave_no_run(tmp_path, monkeypatch, capsys, override, expected):
    """foxhunt-train's entry in this process (an interpreter start each cost 5-7 s; the console
    script's own exit and stderr: test_unknown_group_option_fails_with_hydras_message below)."""
    code = run_foxhunt_train(monkeypatch, tmp_path, ["model=tft", override])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], err
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize("under", ["", "sub"])
def test_a_feature_cache_under_a_file_fails_with_one_line_and_leaves_no_run(tmp_path, monkeypatch, capsys, under):
    """data.cache_dir naming a file (or a folder under one) was an OSError traceback after the run
    had begun and the data had loaded, leaving a FAILED run (found by a helper probing the data)."""
    (tmp_path / "afile").write_text("")
    target = tmp_path / "afile" / under if under else tmp_path / "afile"
    code = run_foxhunt_train(monkeypatch, tmp_path, ["model=dqn", "trainer=smoke", f"data.cache_dir={target}"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert f"data.cache_dir={target}: {tmp_path / 'afile'} is not a folder" in lines[0]
    assert not (tmp_path / "mlruns").exists()


def test_unknown_group_option_fails_with_hydras_message(tmp_path):
    """The real console script, as a shell runs it."""
    result = _cli(["model=nope"], tmp_path)
    assert result.returncode != 0
    assert "Could not find 'model/nope'" in result.stderr
    assert "Available options" in result.stderr and "tft" in result.stderr
    assert not (tmp_path / "mlruns").exists()
