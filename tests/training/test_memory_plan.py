"""activation_checkpointing=auto: the run's predicted footprint against its memory target decides,
the choice is said and tagged, and it changes no weight (foxhunt.training.memory_plan)."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from foxhunt.models import tft
from foxhunt.runs.tags import Tag
from foxhunt.training import memory_plan
from foxhunt.training.cell import train
from run_records_helpers import TINY

KEY = memory_plan.CHECKPOINTING_KEY


def _predicting(monkeypatch, mb: float, calls: list) -> None:
    def predicted(cfg, workdir):
        calls.append(bool(cfg.model.module.activation_checkpointing))
        return mb, "2 probe fits (stub)"

    monkeypatch.setattr(memory_plan, "_predict", predicted)


@pytest.mark.parametrize(("target", "on"), [(100.0, True), (500.0, False), (120.0, False)])
def test_auto_is_on_only_where_the_footprint_without_it_exceeds_the_target(compose_cfg, monkeypatch, target, on):
    cfg, calls = compose_cfg(["model=tft", f"{KEY}=auto", f"model.memory_target_mb={target}"]), []
    _predicting(monkeypatch, 120.0, calls)

    chosen, choice = memory_plan.plan_activation_checkpointing(cfg)

    assert calls == [False]  # the footprint predicted is the one without recomputation
    assert choice is not None and choice.on is on and chosen.model.module.activation_checkpointing is on
    assert cfg.model.module.activation_checkpointing == "auto"  # the run's own config (its hash, its record) as it was
    verdict = ">" if on else "<="
    assert choice.line.startswith(f"activation_checkpointing=auto: {'on' if on else 'off'} (the training footprint")
    assert f"120.00 MB {verdict} {target:.2f} MB (model.memory_target_mb)" in choice.line


def test_without_a_target_the_budget_decides(compose_cfg, monkeypatch):
    cfg = compose_cfg(["model=tft", f"{KEY}=auto", "model.memory_target_mb=null", "budget=rtx3050ti"])
    _predicting(monkeypatch, 3700.0, [])

    _, choice = memory_plan.plan_activation_checkpointing(cfg)

    assert choice is not None and choice.on
    assert "3700.00 MB > 3596.00 MB (budget rtx3050ti: 4096 MB total - 500 MB headroom)" in choice.line


@pytest.mark.parametrize("value", ["false", "true", None])
def test_a_decided_value_or_a_model_without_the_key_is_left_alone(compose_cfg, monkeypatch, value):
    cfg = compose_cfg(["model=tft", f"{KEY}={value}"] if value else ["model=dqn"])
    calls: list = []
    _predicting(monkeypatch, 1e9, calls)

    chosen, choice = memory_plan.plan_activation_checkpointing(cfg)

    assert chosen is cfg and choice is None and calls == []


def test_a_prediction_that_cannot_run_leaves_it_off_and_says_why(compose_cfg, monkeypatch, caplog):
    cfg = compose_cfg(["model=tft", f"{KEY}=auto"])

    def fails(cfg, workdir):
        raise RuntimeError("no bars\nsecond line")

    monkeypatch.setattr(memory_plan, "_predict", fails)
    with caplog.at_level(logging.WARNING, logger=memory_plan.__name__):
        chosen, choice = memory_plan.plan_activation_checkpointing(cfg)

    assert choice is not None and not choice.on and chosen.model.module.activation_checkpointing is False
    assert "activation_checkpointing=auto: off (no prediction of its memory (RuntimeError: no bars" in caplog.text


def test_the_prediction_leaves_every_random_stream_as_it_found_it(compose_cfg, monkeypatch):
    """Probe fits seed and draw; the run after them draws what it would have drawn without them."""
    cfg = compose_cfg(["model=tft", f"{KEY}=auto"])

    def draws(cfg, workdir):
        random.seed(1), np.random.seed(1), torch.manual_seed(1)
        random.random(), np.random.rand(), torch.rand(3)
        return 1.0, "drew"

    monkeypatch.setattr(memory_plan, "_predict", draws)
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(7), np.random.seed(7), torch.manual_seed(7)

    memory_plan.plan_activation_checkpointing(cfg)

    assert (random.random(), np.random.rand()) == expected[:2] and torch.equal(torch.rand(3), expected[2])


def test_a_bad_value_is_one_line_naming_the_key(compose_cfg):
    from foxhunt.config.schema import ConfigError, validate

    with pytest.raises(ConfigError) as caught:
        validate(compose_cfg(["model=tft", f"{KEY}=sometimes"]))
    assert "model.module.activation_checkpointing" in str(caught.value) and "\n" not in str(caught.value)


def _last_weights(folder) -> dict[str, torch.Tensor]:
    return torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


COMMON = ["model=tft", "precision=fp32", *TINY["tft"], "trainer=smoke", "trainer.limit_train_batches=4", "data.source.days=7",
          "evaluation.plot_equity=false", "evaluation.max_bars=200", "evaluation.bootstrap.samples=20"]  # fmt: skip


@pytest.fixture
def recomputed(monkeypatch) -> list[str]:
    """The names of the segments the TFT recomputes in backward, as it runs them."""
    names: list[str] = []

    def counting(function, *args, **kwargs):
        names.append(function.__name__)
        return torch.utils.checkpoint.checkpoint(function, *args, **kwargs)

    monkeypatch.setattr(tft, "checkpoint", counting)
    return names


def _runs(root):
    client = MlflowClient(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")
    return client.search_runs([client.get_experiment_by_name("foxhunt").experiment_id])


def test_a_run_over_its_target_recomputes_and_says_so(compose_cfg, tmp_path, monkeypatch, recomputed):
    """foxhunt-train's path (train): the choice made before the model is built, the model built
    with it, the run tagged and its config stored as given."""
    _predicting(monkeypatch, 1e6, [])
    train(compose_cfg([*COMMON, f"{KEY}=auto"]))

    assert recomputed and set(recomputed) == {"_select_variables"}
    (run,) = _runs(tmp_path)
    assert run.data.tags[Tag.CHECKPOINTING_CHOICE].startswith("activation_checkpointing=auto: on (the training footprint")
    assert run.data.params["model.module.activation_checkpointing"] == "auto"


def _fit_weights(compose_cfg, on: bool) -> dict[str, torch.Tensor]:
    import lightning.pytorch as pl

    from foxhunt.training.parts import build_parts

    pl.seed_everything(0, workers=True, verbose=False)
    parts = build_parts(compose_cfg([*COMMON, f"{KEY}={str(on).lower()}"]))
    trainer = pl.Trainer(max_steps=4, limit_val_batches=0, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(parts.model, datamodule=parts.datamodule)
    return parts.model.state_dict()


def test_recomputing_changes_no_weight(compose_cfg, recomputed):
    """The choice is free to follow the budget: four steps with recomputation (dropout's draws
    replayed in the backward pass) end on the weights of four steps without, bit for bit."""
    off = _fit_weights(compose_cfg, False)
    assert not recomputed
    on = _fit_weights(compose_cfg, True)
    assert recomputed
    assert on.keys() == off.keys() and all(torch.equal(on[k], off[k]) for k in on)


@pytest.mark.slow
def test_a_run_with_probe_fits_trains_the_weights_of_a_run_without(compose_cfg, tmp_path, recomputed):
    """End to end with a real prediction (its probe fits in the run's process): a target below the
    tiny TFT's footprint turns recomputation on, and the run ends on the weights of the same run
    with it off (the probes left every random stream as they found it)."""
    train(compose_cfg([*COMMON, f"{KEY}=auto", "model.memory_target_mb=1", f"paths.output_dir={tmp_path / 'auto'}"]))
    assert recomputed  # the fit recomputed (the probes, with it off, did not)
    probed = len(recomputed)
    train(compose_cfg([*COMMON, f"{KEY}=false", f"paths.output_dir={tmp_path / 'off'}"]))
    assert len(recomputed) == probed  # the run with it off did not

    (auto_run,) = [run for run in _runs(tmp_path) if Tag.CHECKPOINTING_CHOICE in run.data.tags]
    choice = auto_run.data.tags[Tag.CHECKPOINTING_CHOICE]
    assert "> 1.00 MB (model.memory_target_mb); predicted (predict_footprint" in choice
    auto, off = (
        torch.load(tmp_path / side / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"] for side in ("auto", "off")
    )
    assert auto.keys() == off.keys() and all(torch.equal(auto[k], off[k]) for k in auto)
    assert list((tmp_path / ".cache" / "memory_predictions").glob("tft-fp32-*.json"))  # cached for the next run
