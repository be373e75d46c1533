"""foxhunt-train logs a TFT run's interpretability on the test split (metrics, table, PNGs in
MLflow); other families log none of it; a bad setting is one line. (That the pass changes no
forecast: tests/models/test_tft_interpret.py; it runs after every figure of the run is made.)"""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from foxhunt.data.features import FEATURE_GROUPS
from foxhunt.evaluation.interpret import ATTENTION_PNG, INTERPRET_DIR, SELECTION_FILE, TABLE_FILE, selection_png
from foxhunt.training.cell import train

TINY_TFT = ["model=tft", "trainer=smoke", "data.source.days=4", "trainer.limit_train_batches=4", "trainer.limit_val_batches=1",
            "trainer.limit_test_batches=1", "evaluation.plot_equity=false", "model.module.hidden_size=16",
            "model.module.lstm_layers=1"]  # fmt: skip
GROUP_NAMES = {"static": FEATURE_GROUPS["static"], "encoder": FEATURE_GROUPS["known"] + FEATURE_GROUPS["observed"],
               "decoder": FEATURE_GROUPS["known"]}  # fmt: skip


def _client(root) -> MlflowClient:
    return MlflowClient(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")


def _only_run(root):
    client = _client(root)
    (run,) = client.search_runs([client.get_experiment_by_name("foxhunt").experiment_id])
    return client, run


def test_a_tft_run_logs_its_test_split_selection_and_attention_once(compose_cfg, tmp_path):
    metrics = train(compose_cfg([*TINY_TFT, "evaluation.interpret.max_windows=100"]))
    client, run = _only_run(tmp_path)
    logged = run.data.metrics
    for group, names in GROUP_NAMES.items():
        keys = [f"test/vsn_{group}/{name}" for name in names]
        assert all(key in logged for key in keys), group
        assert sum(logged[key] for key in keys) == pytest.approx(1.0, abs=1e-5)
        assert sum(metrics[key] for key in keys) == pytest.approx(1.0, abs=1e-5)
    interpreted = [k for k in logged if k.startswith(("test/vsn_", "test/attention/"))]
    assert len(interpreted) == 4 + 12 + 8 + 2
    assert 0 < logged["test/attention/past_share"] <= 1
    for key in interpreted:  # each logged exactly once
        assert len(client.get_metric_history(run.info.run_id, key)) == 1, key
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, INTERPRET_DIR)}
    expected = [TABLE_FILE, SELECTION_FILE, ATTENTION_PNG, *(selection_png(g) for g in GROUP_NAMES)]
    assert {f"{INTERPRET_DIR}/{name}" for name in expected} <= artifacts
    table = json.loads((tmp_path / "outputs" / "run" / INTERPRET_DIR / TABLE_FILE).read_text())
    assert table["windows"] == 100 and table["windows_available"] > 100 and table["source"] == "test split"
    dataset = json.loads((tmp_path / "outputs" / "run" / "dataset.json").read_text())
    encoder = [dataset["feature_names"][i] for i in dataset["groups"]["known"] + dataset["groups"]["observed"]]
    assert list(table["selection"]["encoder"]) == encoder  # the dataset's names, in the encoder's order


def test_disabled_or_without_an_interpret_split_nothing_is_computed(compose_cfg, tmp_path):
    from foxhunt.training.scoring import interpret_test_split

    class Model:  # would fail if asked
        def interpret_split(self, *args):
            raise AssertionError("called")

    assert interpret_test_split(
        compose_cfg(["model=tft", "evaluation.interpret.enabled=false"]), Model(), None, tmp_path, None
    ) == (None, {})
    assert interpret_test_split(compose_cfg(["model=dqn"]), object(), None, tmp_path, None) == (None, {})
    assert not (tmp_path / INTERPRET_DIR).exists()


def test_other_families_log_none_of_it(compose_cfg, tmp_path):
    metrics = train(compose_cfg(["model=dqn", "trainer=smoke", "data.source.days=4", "evaluation.plot_equity=false"]))
    client, run = _only_run(tmp_path)
    assert not any("vsn_" in k or k.startswith("test/attention/") for k in [*metrics, *run.data.metrics])
    assert client.list_artifacts(run.info.run_id, INTERPRET_DIR) == []
    assert not (tmp_path / "outputs" / "run" / INTERPRET_DIR).exists()


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("evaluation.interpret.max_windows=0", "evaluation.interpret.max_windows=0: Input should be greater than or equal to 1"),
        ("evaluation.interpret.enabled=maybe", "evaluation.interpret.enabled='maybe'"),
        ("+evaluation.interpret.top=3", "evaluation.interpret.top: unknown key"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_key(compose_cfg, override, expected):
    from foxhunt.config.schema import ConfigError, validate

    with pytest.raises(ConfigError) as error:
        validate(compose_cfg(["model=tft", override]))
    assert expected in str(error.value) and "\n" not in str(error.value)
