"""``foxhunt memory validate``: the report, its verdict and exit code, and its MLflow run.

The command runs in-process through typer's CliRunner with every family, the four large ones at
reduced sizes (tests/memory/small_models.py); the verdict logic and the bars are also checked on hand-made
measurements."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient
from small_models import CPU, prefixed
from typer.testing import CliRunner

from foxhunt.cli import app
from foxhunt.config.families import family_names
from foxhunt.memory.accounting import BYTES_PER_MB, MemoryBreakdown
from foxhunt.memory.budget import MemoryBudget
from foxhunt.memory.card import judge
from foxhunt.memory.card_report import bar, render_text, stacked_bar
from foxhunt.memory.report import MeasuredFigure
from foxhunt.memory.training_run import RunMeasurement

MODELS = list(family_names())  # the default --models: every family of conf/model/


def validate(*args: str):
    return CliRunner().invoke(app, ["memory", "validate", *args])


@pytest.fixture(scope="module")
def card_run(tmp_path_factory):
    """One validate run of every family (the four large ones small) against the default budget (rtx3050ti)."""
    root = tmp_path_factory.mktemp("validate")
    result = validate("--root", str(root), *CPU, "precision=fp32", *prefixed())  # fp32: the TFT defaults to auto
    return root, result


def test_the_card_passes_against_rtx3050ti_with_the_full_report(card_run):
    root, result = card_run
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "budget     rtx3050ti (gpu): 4096 MB total, 500 MB required headroom -> 3596 MB available" in out
    assert "assumption: all models resident at once" in out
    header = next(line for line in out.splitlines() if line.startswith("model "))
    for column in ("memory MB", "target MB", "% of budget", "% of target", "verdict"):
        assert column in header
    for model in MODELS:
        row = next(line for line in out.splitlines() if line.startswith(f"{model} ") and "PASS" in line)
        assert row.split()[-1] == "PASS"
        assert any(line.startswith(f"{model:<9}[") for line in out.splitlines()), f"no bar for {model}"
        assert f"{model} measured" in out  # its components row
    assert "memory: allocator peak of the first training step" in out  # how the figure was measured (CPU)
    assert "headroom left = total - ensemble" in out and "required headroom (conf/budget headroom_mb)" in out
    assert any(line.startswith("ensemble [") for line in out.splitlines())
    assert "calendar days (model memory does not depend on the amount of data" in out
    assert "measured on the CPU against GPU budget rtx3050ti" in out  # what the figures leave out
    assert out.rstrip().splitlines()[-1].startswith("PASS: every model within its target")


def test_the_report_figures_add_up(card_run):
    root, result = card_run
    (report,) = root.glob("outputs/memory/validate-*/memory_validate.json")
    data = json.loads(report.read_text())
    assert data["verdict"] == "PASS" and [m["name"] for m in data["models"]] == MODELS
    for model in data["models"]:
        assert model["memory_bytes"] == sum(model["components_bytes"].values())  # CPU: the accounted sum
        assert model["memory_mb"] == pytest.approx(model["memory_bytes"] / BYTES_PER_MB)
        assert model["pct_of_budget"] == pytest.approx(100 * model["memory_mb"] / 4096)
        assert model["pct_of_target"] == pytest.approx(100 * model["memory_mb"] / model["target_mb"])
        assert model["components_bytes"]["activations"] > 0 and model["components_bytes"]["params"] > 0
    (dqn,) = [m for m in data["models"] if m["name"] == "dqn"]
    assert dqn["components_bytes"]["model_state"] >= 256 * (2 * 17 * 4 + 8 + 4 + 4)  # DQN's replay
    ensemble = data["ensemble"]
    assert ensemble["memory_bytes"] == sum(m["memory_bytes"] for m in data["models"])
    assert ensemble["headroom_left_mb"] == pytest.approx(4096 - ensemble["memory_mb"])
    assert ensemble["required_headroom_mb"] == 500


def test_the_run_lands_in_mlflow_with_metrics_and_artifacts(card_run):
    root, result = card_run
    client = MlflowClient(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("memory")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "memory-validate-fp32-rtx3050ti" and run.info.status == "FINISHED"
    assert run.data.tags["verdict"] == "PASS"
    assert run.data.tags["mlflow.source.name"] == "foxhunt memory validate"  # the runs table's Source
    report = json.loads(next(root.glob("outputs/memory/validate-*/memory_validate.json")).read_text())
    for model in report["models"]:
        assert run.data.metrics[f"memory/{model['name']}_mb"] == pytest.approx(model["memory_mb"])
    assert run.data.metrics["memory/ensemble_mb"] == pytest.approx(report["ensemble"]["memory_mb"])
    assert run.data.metrics["memory/headroom_mb"] == pytest.approx(report["ensemble"]["headroom_left_mb"])
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id)}
    assert {"memory_validate.md", "memory_validate.json", "memory_validate.png", "configs"} <= artifacts
    assert {item.path for item in client.list_artifacts(run.info.run_id, "configs")} == {f"configs/{m}.yaml" for m in MODELS}


def test_a_1_mb_budget_fails_with_one_clear_line(tmp_path):
    # DQN at its default size (about 2.9 MB) on a 1 MB card with no headroom required
    result = validate(
        "--root", str(tmp_path), "--models", "dqn", "budget.total_mb=1", "budget.headroom_mb=0", "logger=none", *CPU
    )
    assert result.exit_code == 1, result.output
    last = result.stdout.rstrip().splitlines()[-1]
    assert last.startswith("FAIL: the ensemble's ") and "of budget rtx3050ti's 1 MB, below the required 0 MB headroom" in last
    assert "dqn" not in last  # the model itself is within its 150 MB target
    assert "\n" not in last


def test_a_1_mb_budget_below_its_own_headroom_is_a_config_error(tmp_path):
    result = validate("--root", str(tmp_path), "--models", "dqn", "budget.total_mb=1")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "foxhunt memory validate: config error (dqn): budget.headroom_mb=500.0: must be < budget.total_mb (1)"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["model.module.nope=1"], "Could not override 'model.module.nope'"),
        (["budget=nope"], "Could not find 'budget/nope'"),
        (["tft:model.module.hidden_size=0"], "config error (tft): model.module.hidden_size=0: must be an integer >= 1"),
        (["model=tft"], "the models are picked with --models"),
        (["--models", "dqn", "ppo:model.module.rollout_steps=4"], "model 'ppo' is not among --models (dqn)"),
        (["--models", "dqn,lstm"], f"--models: unknown model 'lstm' (available: {', '.join(sorted(family_names()))})"),
        (["seed"], "Error parsing override 'seed'"),
        (["xx:"], "validate: config error: Error parsing override 'xx:'"),  # no model's error: it blamed "(dlinear)"
    ],
)
def test_a_bad_override_or_option_exits_2_with_one_line(args, message, tmp_path):
    result = validate("--root", str(tmp_path), *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("foxhunt memory validate: ") and message in lines[0]


def test_a_root_that_is_not_there_is_refused_not_made(tmp_path):
    missing = tmp_path / "typo"
    result = validate("--root", str(missing), "--models", "dqn")
    assert result.exit_code == 2, result.output
    assert (
        result.stderr.strip()
        == f"foxhunt memory validate: --root {missing}: no such folder (the folder holding mlruns/ and the feature cache)"
    )
    assert not missing.exists()  # it was made, and the models measured into it


def test_predict_shows_the_prediction_beside_the_measurement_as_json(tmp_path):
    models = ["dqn", "mamba2"]
    result = validate("--root", str(tmp_path), "--models", ",".join(models), "--predict", "--json", "logger=none",
                      *CPU, *prefixed(models))  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # --json: the report as JSON, nothing else
    for model in data["models"]:
        predicted = model["predicted"]
        assert abs(predicted["error_pct"]) <= 10.0
        assert [p["batch"] for p in predicted["probes"]] == [4, 8]
        assert predicted["memory_bytes"] == sum(predicted["components_bytes"].values())
        assert predicted["component_methods"]["params"].startswith("meta-device construction")
    assert not (tmp_path / "mlruns").exists()  # logger=none: no MLflow run


# -- the verdict and the bars, on hand-made measurements ---------------------------------
def measurement(name: str, mb: float, target_mb: float | None) -> RunMeasurement:
    nbytes = round(mb * BYTES_PER_MB)
    return RunMeasurement(
        model=name, module="Net", breakdown=MemoryBreakdown(params_bytes=nbytes),
        footprint=MeasuredFigure("footprint", nbytes, "hand-made"), target_mb=target_mb, device="cpu",
        precision="fp32", batch_key=None, batch_size=None, steps=1, seconds=0.0,
    )  # fmt: skip


CARD = MemoryBudget("card", total_mb=100, headroom_mb=10)


def test_verdict_limits_are_inclusive():
    verdict = judge([measurement("a", 40, 40), measurement("b", 50, None)], CARD)
    assert verdict.passed and verdict.total_mb == pytest.approx(90)
    assert verdict.headroom_left_mb == pytest.approx(10) and verdict.headroom_ok  # exactly the required headroom
    assert [m.pct_of_budget for m in verdict.models] == pytest.approx([40, 50])
    assert verdict.models[0].pct_of_target == pytest.approx(100) and verdict.models[1].pct_of_target is None
    assert verdict.summary_line().startswith("PASS:")


def test_verdict_names_every_failure_in_one_line():
    verdict = judge([measurement("a", 41, 40), measurement("b", 50, 60)], CARD)
    assert not verdict.passed and not verdict.headroom_ok
    assert [m.passed for m in verdict.models] == [False, True]
    assert verdict.summary_line() == (
        "FAIL: a 41.00 MB > its target 40 MB (model.memory_target_mb); the ensemble's 91.00 MB leaves "
        "9.00 MB of budget card's 100 MB, below the required 10 MB headroom"
    )
    text = render_text(verdict)
    assert text.rstrip().splitlines()[-1] == verdict.summary_line()


def test_bars_are_scaled_to_the_budget():
    # 100 MB in 10 columns of 10 MB; the available mark (90 MB) is column 9
    assert bar(50, 100, 90, columns=10) == "[#####    |]"
    assert bar(95, 100, 90, columns=10) == "[#########!]"
    assert bar(0.5, 100, 90, columns=10) == "[.        |]"
    assert bar(150, 100, 90, columns=10) == "[#########>]"
    assert stacked_bar([("A", 30), ("B", 20), ("C", 1)], 100, 90, columns=10) == "[AAABB    |]"
