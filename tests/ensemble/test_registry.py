"""From runs to an ensemble: registration into a real SQLite store, weights-only loading of fp32 and
int8 versions, the ensemble's replay equal to the training runs' own backtest, bad inputs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from ensemble_helpers import DATA, SMALL, cli, client


def _versions(root) -> dict[str, list[str]]:
    c = client(root)
    return {m.name: sorted(v.version for v in c.search_model_versions(f"name='{m.name}'")) for m in c.search_registered_models()}


def test_dry_run_prints_the_choice_and_registers_nothing(store_root):
    before = _versions(store_root)
    result = cli(store_root, "ensemble", "register", "asset=es", "ensemble.gate=none", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "dry run: nothing registered" in result.output
    rows = {line.split()[0]: line.split() for line in result.output.splitlines() if line.split()[:1] in (["dqn"], ["ppo"])}
    assert rows["dqn"][-2] == "2" and rows["ppo"][-2] == "1"  # runs considered: two DQN runs
    assert _versions(store_root) == before


def test_register_picks_the_best_by_the_validation_metric_and_moves_the_alias(store_root, tmp_path):
    from foxhunt.runs.store import RunStore

    result = cli(store_root, "ensemble", "register", "asset=es", "ensemble.gate=none")
    assert result.exit_code == 0, result.output
    c = client(store_root)
    experiment = c.get_experiment_by_name("foxhunt").experiment_id
    for family in SMALL:
        version = c.get_model_version_by_alias(f"foxhunt-{family}-es", "champion")
        runs = c.search_runs([experiment], f"tags.model = '{family}' and attributes.status = 'FINISHED'")
        best = max(runs, key=lambda r: (r.data.metrics["val/sharpe"], r.info.start_time))
        assert version.run_id == best.info.run_id and version.tags["metric"] == "val/sharpe"
        # an MLflow 3 logged model of the training run: the runs table's Models column, the Models tab
        assert version.source.startswith("models:/m-")
        model_id = version.source.removeprefix("models:/")
        logged = c.get_logged_model(model_id)
        assert logged.source_run_id == best.info.run_id and logged.experiment_id == experiment
        assert str(logged.status).endswith("READY") and logged.model_type == "foxhunt-member"
        run = c.get_run(best.info.run_id)
        assert run.info.status == "FINISHED"  # the training run itself is not reopened
        assert [o.model_id for o in run.outputs.model_outputs] == [model_id]
        linked = {m.key: m.value for m in logged.metrics}
        assert linked["val/sharpe"] == best.data.metrics["val/sharpe"] and "test/sharpe" in linked
        assert len(c.get_metric_history(best.info.run_id, "val/sharpe")) == 1  # each metric once in the run
        store = RunStore(f"sqlite:///{store_root / 'mlruns' / 'mlflow.db'}")
        folder = store.download_uri(f"models:/{model_id}", tmp_path / family)  # MLflow reads models:/ on the global store
        files = {str(p.relative_to(folder)) for p in __import__("pathlib").Path(folder).rglob("*") if p.is_file()}
        assert {"artifacts/weights.pt", "artifacts/config.yaml", "artifacts/dataset.json", "artifacts/member.json",
                "pyfunc_entry.py", "MLmodel", "input_example.json", "requirements.txt"} <= files  # fmt: skip
        assert not any(name.endswith(".pkl") for name in files)  # models from code: no pickle
        requirements = (__import__("pathlib").Path(folder) / "requirements.txt").read_text().split()
        wheel = next(r for r in requirements if r.endswith(".whl"))
        assert wheel.startswith("artifacts/foxhunt-") and wheel in files  # foxhunt itself travels with the model
        assert any(r.startswith("torch==") for r in requirements)
    again = cli(store_root, "ensemble", "register", "asset=es", "ensemble.gate=none")
    assert again.exit_code == 0 and again.output.count("unchanged") == 4  # the same choice: no new version


def test_a_registered_version_rebuilds_weights_only_without_its_run_folder(store_root, tmp_path):
    import mlflow
    import mlflow.pyfunc

    from foxhunt.ensemble.registry import download_version

    cli(store_root, "ensemble", "register", "asset=es", "ensemble.gate=none")
    uri = f"sqlite:///{store_root / 'mlruns' / 'mlflow.db'}"
    for family in SMALL:
        folder, _ = download_version(uri, f"foxhunt-{family}-es", "champion", None, tmp_path / family)
        state = torch.load(folder / "artifacts" / "weights.pt", weights_only=True)
        assert all(isinstance(v, torch.Tensor) for v in state.values())
    # the int8-trained DQN run, registered by explicit version, loads through its int8 layers
    c = client(store_root)
    int8_run = next(r for r in c.search_runs([c.get_experiment_by_name("foxhunt").experiment_id], "tags.precision = 'int8'"))
    from foxhunt.ensemble.registry import Choice, prepare, register_prepared
    from foxhunt.runs.store import RunStore

    store = RunStore(uri)
    choice = Choice("dqn", int8_run.info.run_id, int8_run.info.run_name, int8_run.data.metrics["val/sharpe"], 1, 0)
    from foxhunt.ensemble.model_env import model_environment

    (tmp_path / "int8").mkdir()
    environment = model_environment(tmp_path / "int8", "artifacts")
    prepared = prepare(store, choice, "foxhunt-dqn-es", "val/sharpe", tmp_path / "int8", environment, example_decided=4)
    registered = register_prepared(store, prepared, "int8-trained", gate="none")
    folder, _ = download_version(uri, "foxhunt-dqn-es", "int8-trained", None, tmp_path / "int8-download")
    state = torch.load(folder / "artifacts" / "weights.pt", weights_only=True)
    assert any(t.dtype == torch.int8 for t in state.values())
    mlflow.set_tracking_uri(uri)  # what an MLflow user does before loading models:/
    model = mlflow.pyfunc.load_model(f"models:/foxhunt-dqn-es/{registered.version}")
    assert model.metadata.get_input_schema().input_names() == ["ts", "open", "high", "low", "close", "volume"]


def test_pyfunc_predict_streams_bars(store_root):
    import mlflow
    import mlflow.pyfunc
    from hydra.utils import instantiate

    from configs import compose_train_config

    cli(store_root, "ensemble", "register", "asset=es", "ensemble.gate=none")
    mlflow.set_tracking_uri(f"sqlite:///{store_root / 'mlruns' / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model("models:/foxhunt-dqn-es@champion")
    cfg = compose_train_config(["model=dqn", *DATA], store_root)
    bars = instantiate(cfg.data.source).load(instantiate(cfg.asset)).iloc[:300]
    frame = bars.reset_index().rename(columns={"ts": "ts"})
    frame["ts"] = bars.index.as_unit("ns").asi8
    out = model.predict(frame)
    assert list(out.columns) == ["position", "signal"] and len(out) == 300
    assert set(out["position"].unique()) <= {-1, 0, 1}
    warmup = 59  # max(momentum 15, volatility 30, volume 60 - 1) bars of conf/data/pipeline/default.yaml
    assert (out["position"].iloc[:warmup] == 0).all() and out["signal"].isna().all()  # an agent: no signal
    assert (out["position"].iloc[warmup:] != 0).any()


def test_replay_scores_members_and_ensemble_as_their_runs_did(store_root):
    cli(store_root, "ensemble", "register", "asset=es", "ensemble.gate=none")
    result = cli(store_root, "ensemble", "replay", "asset=es", *DATA)
    assert result.exit_code == 0, result.output
    for family in SMALL:
        assert f"foxhunt-{family}-es" in result.output
    assert "ensemble (whole bar)" in result.output and "p50 us" in result.output
    c = client(store_root)
    experiment = c.get_experiment_by_name("ensemble")
    (run,) = c.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    champions = {f: c.get_model_version_by_alias(f"foxhunt-{f}-es", "champion").run_id for f in SMALL}
    for family, run_id in champions.items():  # the ensemble's backtest of the test split = the training run's
        trained = c.get_run(run_id).data.metrics
        assert run.data.metrics[f"foxhunt-{family}-es/pnl"] == pytest.approx(trained["test/pnl"])
        assert run.data.metrics[f"foxhunt-{family}-es/sharpe"] == pytest.approx(trained["test/sharpe"])
    assert "latency/ensemble_p99_us" in run.data.metrics
    artifacts = {a.path for a in c.list_artifacts(run.info.run_id)}
    assert {"replay.md", "equity_replay.png", "members.json", "config.yaml"} <= artifacts


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ensemble", "replay", "asset=nq", *DATA], "models:/foxhunt-dqn-nq@champion: not in the registry"),
        (["ensemble", "replay", "asset=es", "ensemble.versions.tft=99", *DATA], "models:/foxhunt-tft-es/99: not in the registry"),
        (["ensemble", "register", "asset=es", "ensemble.gate=none", "ensemble.metric=test/sharpe"], "a test metric cannot select members"),
        (["ensemble", "register", "asset=zn"], "no FINISHED zn run with val/sharpe for dqn, ppo, mamba2, tft"),
        (["ensemble", "register", "asset=es", "ensemble.gate=none", "ensemble.metric=val/wobble"], "ensemble.metric=val/wobble: unknown direction"),
        (["ensemble", "replay", "asset=es", "ensemble.models=[dqn,ppo]", "ensemble.rule=mean_forecast", *DATA], "the ensemble has no forecaster"),
        (["ensemble", "replay", "asset=es", "ensemble.rule=vote"], "ensemble.rule='vote': Input should be"),
        (["ensemble", "replay", "logger=none"], "logger.tracking_uri is null"),
    ],
)  # fmt: skip
def test_bad_input_gets_one_line_and_registers_nothing_half_way(store_root, args, message):
    before = {m.name: [v.version for v in client(store_root).search_model_versions(f"name='{m.name}'")]
              for m in client(store_root).search_registered_models()}  # fmt: skip
    result = cli(store_root, *args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith("foxhunt ensemble ") and message in lines[-1], result.output
    assert "Traceback" not in result.output
    after = {m.name: [v.version for v in client(store_root).search_model_versions(f"name='{m.name}'")]
             for m in client(store_root).search_registered_models()}  # fmt: skip
    assert after == before


def test_the_cli_subprocess_answers_help_without_heavy_imports():
    code = "import sys; from foxhunt.cli import app; print(sorted(m for m in ('torch', 'mlflow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_version_without_a_verdict_loads_fp32_and_says_why():
    from foxhunt.ensemble.registry import weights_to_load
    from foxhunt.runs.store import ModelVersion

    weights, why = weights_to_load("auto", ModelVersion("foxhunt-dqn-es", "1", "r", "s"))
    assert weights == "fp32" and "no int8 verdict recorded" in why


def test_validate_measures_fp32_and_int8_footprints_and_capacity(store_root):
    cli(store_root, "ensemble", "register", "asset=es", "ensemble.gate=none")
    result = cli(store_root, "ensemble", "footprint", "asset=es", *DATA, "ensemble.footprint.probe_calls=5")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "ensemble fp32:" in out and "(PASS: 500 MB headroom required)" in out
    assert "capacity int8 / fp32 (whole ensemble):" in out and "int8 where it pays" in out
    rows = {line.split()[0] + " " + line.split()[1]: line.split() for line in out.splitlines()
            if line.startswith("foxhunt-") and len(line.split()) > 10}  # fmt: skip
    for family in SMALL:
        fp32, int8 = rows[f"foxhunt-{family}-es fp32"], rows[f"foxhunt-{family}-es int8"]
        assert float(int8[6]) <= float(fp32[6])  # tensors: these layers are below min_quantized_numel, so equal
        for row in (fp32, int8):  # MB = tensors + runtime + state + peak
            assert float(row[2]) == pytest.approx(sum(float(row[i]) for i in (6, 7, 8, 9)), abs=0.003)
    c = client(store_root)
    runs = c.search_runs([c.get_experiment_by_name("ensemble").experiment_id], "tags.budget = 'rtx3050ti'")
    assert runs and "capacity/ensemble_fp32" in runs[0].data.metrics
    assert "ensemble auto (each member's choice):" in out and "recorded on each version" in out
    from foxhunt.ensemble.registry import WEIGHTS_CHOICE, WEIGHTS_REASON, weights_to_load
    from foxhunt.runs.store import RunStore

    store = RunStore(f"sqlite:///{store_root / 'mlruns' / 'mlflow.db'}")
    for family in SMALL:
        version = store.get_version_by_alias(f"foxhunt-{family}-es", "champion")
        assert version.tags[WEIGHTS_CHOICE] in ("fp32", "int8") and "x (at most" in version.tags[WEIGHTS_REASON]
        assert f"foxhunt-{family}-es: {version.tags[WEIGHTS_CHOICE]} (" in out  # the verdict line is what was recorded
        weights, why = weights_to_load("auto", version)
        assert weights == version.tags[WEIGHTS_CHOICE] and why.startswith("measured by foxhunt ensemble footprint")
        assert weights_to_load("int8", version) == ("int8", "ensemble.weights=int8")
    tiny = cli(store_root, "ensemble", "footprint", "asset=es", *DATA, "ensemble.footprint.probe_calls=5", "budget.total_mb=0.01",
               "budget.headroom_mb=0.005", "logger.enabled=false")  # fmt: skip
    assert tiny.exit_code == 1 and "FAIL" in tiny.output


def _shift_means(manifest):
    return {**manifest, "observed_mean": [m + 50 for m in manifest["observed_mean"]]}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_shift_means, "dataset.json: observed_mean differs from the dataset its config yields now"),
        (lambda manifest: [1, 2], "dataset.json: not a dataset manifest"),
        (lambda manifest: {**manifest, "feature_config": 5}, "dataset.json: feature_config differs"),
    ],
)
def test_a_runs_edited_dataset_manifest_is_refused_not_registered(store_root, edit, message):
    """A run's dataset.json is an artifact of the store: register took its normalization
    statistics on trust (shifted means were registered as a verified version, found by a helper
    probing the registry) and a damaged one was a TypeError traceback. It must say what the run's
    config and data yield now; the refusal is one line and registers nothing."""
    import json

    _refused_with_edited_artifact(store_root, "dataset.json", lambda text: json.dumps(edit(json.loads(text))),
                                  f"edited{len(message)}", message)  # fmt: skip


def _refused_with_edited_artifact(store_root, name: str, edit, prefix: str, message: str) -> None:
    """Every FINISHED DQN run's artifact ``name`` edited (``edit``: its text to the new text), then
    register refused in one line naming ``message``, nothing registered; the files put back."""
    from pathlib import Path

    c = client(store_root)
    experiment = c.get_experiment_by_name("foxhunt").experiment_id
    runs = c.search_runs([experiment], "tags.model = 'dqn' and attributes.status = 'FINISHED'")
    files = [Path(r.info.artifact_uri.removeprefix("file://")) / name for r in runs]  # local: edited, then put back
    saved = {path: path.read_text() for path in files}
    try:
        for path, text in saved.items():
            path.write_text(edit(text))
        test_bad_input_gets_one_line_and_registers_nothing_half_way(
            store_root, ["ensemble", "register", "asset=es", "ensemble.gate=none", "ensemble.models=[dqn]",
                         f"ensemble.registry_prefix={prefix}"], message)  # fmt: skip
    finally:
        for path, text in saved.items():
            path.write_text(text)


def test_a_runs_config_edited_after_the_run_is_refused_not_registered(store_root):
    """A run's config.yaml is an artifact of the store; register copied an edited one into the
    version, and a roll's challenger trained from it wrote where it said (a checkpoint folder in
    another run's artifacts: found by a helper probing stored files). It must be the file its run
    logged (its config.sha256 tag, the tracking store's record); the refusal is one line and
    registers nothing."""
    import yaml

    def elsewhere(text: str) -> str:
        config = yaml.safe_load(text)
        config["callbacks"]["model_checkpoint"]["dirpath"] = "/tmp/elsewhere"
        return yaml.safe_dump(config)

    _refused_with_edited_artifact(store_root, "config.yaml", elsewhere, "edited-config", "the file was changed after the run")
