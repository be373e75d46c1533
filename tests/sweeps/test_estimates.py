"""Memory estimates of sweep cells and the packing of cells into concurrent jobs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from foxhunt.errors import error_line, is_user_error
from foxhunt.runs.config_hash import config_hash
from foxhunt.runs.tracked_run import TrackedRun
from foxhunt.sweeps.estimates import (
    CellExceedsBudget,
    PackingPlan,
    PeakEstimate,
    PlanFileError,
    check_fits,
    estimate_peak,
    pack,
    plan_packing,
)
from foxhunt.training import memory_plan


@pytest.mark.parametrize(
    ("peaks", "available", "cap", "expected"),
    [
        ([100, 100, 100, 100], 1000, 2, 2),  # the cores limit
        ([100, 100, 100, 100], 1000, 8, 4),  # all cells at once
        ([600, 500, 100, 100], 1000, 4, 1),  # 600 + 500 > 1000: the two largest cannot overlap
        ([400, 300, 200, 100], 1000, 4, 4),  # 400 + 300 + 200 + 100 = 1000 fits exactly
        ([400, 300, 200, 101], 1000, 4, 3),  # one MB more: the four together do not fit
        ([2000, 300, 300], 1000, 4, 2),  # the cell over the budget is left out (it fails alone)
        ([2000], 1000, 4, 1),  # nothing fits: one job, the cell fails fast
    ],
)
def test_pack_takes_the_largest_peaks_that_fit_together(peaks, available, cap, expected):
    assert pack(peaks, available, cap) == expected


def _estimates(*mbs: float) -> dict[str, PeakEstimate]:
    return {f"c{i}": PeakEstimate(f"c{i}", mb, "test") for i, mb in enumerate(mbs)}


def test_plan_never_exceeds_the_cores_and_splits_threads():
    plan = plan_packing(_estimates(10, 10, 10, 10), available=1000, budget="b", cores=2, devices=0, requested="auto")
    assert (plan.n_jobs, plan.threads_per_job, plan.limited_by) == (2, 1, "cores: 2")
    plan = plan_packing(_estimates(10, 10), available=1000, budget="b", cores=8, devices=0, requested="auto")
    assert (plan.n_jobs, plan.threads_per_job) == (2, 4)


def test_plan_is_limited_by_memory_and_names_the_cells_over_budget():
    plan = plan_packing(_estimates(700, 600, 5000, 100), available=1000, budget="b", cores=16, devices=0, requested="auto")
    assert plan.n_jobs == 1 and plan.limited_by.startswith("memory")
    assert plan.too_big == ["c2"]
    assert "will fail: c2" in plan.describe()


def test_plan_on_several_gpus_runs_one_job_per_device():
    plan = plan_packing(_estimates(3000, 3000, 3000), available=3500, budget="b", cores=16, devices=2, requested="auto")
    assert (plan.n_jobs, plan.limited_by, plan.threads_per_job) == (2, "devices: 2", 8)


def test_a_requested_n_jobs_is_kept_but_capped_by_the_cores():
    assert plan_packing(_estimates(1, 1, 1), 100, "b", cores=4, devices=0, requested=2).n_jobs == 2
    assert plan_packing(_estimates(1, 1, 1), 100, "b", cores=2, devices=0, requested=5).n_jobs == 2


def _finished_run(cfg, peak_mb: float, digest: str) -> str:
    from foxhunt.config.schema import resolved_config

    tags = {"model": cfg.model.name, "asset": cfg.asset.key, "precision": cfg.precision.name, "config_hash": digest}
    with TrackedRun(cfg.logger.tracking_uri, cfg.logger.experiment, cfg.logger.artifact_location, "r", tags) as run:
        run.log_config(resolved_config(cfg), "")
        run.log_metrics({"memory/device_peak_mb": peak_mb, "memory/peak_mb": 1.0})
    return run.run_id


def test_estimate_order_measured_config_then_prediction_then_measured_cell_then_target(compose_cfg, monkeypatch):
    cfg = compose_cfg(["strategy=parallel", "model=dqn", "asset=es"])
    digest = config_hash(cfg)
    calls = []

    def fake_predict(cell_cfg, workdir):
        calls.append(workdir)
        return 321.0, "fake prediction"

    monkeypatch.setattr(memory_plan, "_predict", fake_predict)
    first = estimate_peak(cfg, digest)
    assert (first.mb, first.source) == (321.0, "predicted (fake prediction)")
    again = estimate_peak(cfg, digest)  # cached per model config: no second probe
    assert again.mb == 321.0 and "cached" in again.source and len(calls) == 1

    other = _finished_run(cfg, 111.0, "another-config")
    assert estimate_peak(cfg, digest).mb == 321.0  # a prediction of this config beats another config's run

    cfg.strategy.predict_memory = False
    loose = estimate_peak(cfg, digest)
    assert loose.mb == 111.0 and other in loose.source and "same model, asset" in loose.source

    same = _finished_run(cfg, 222.0, digest)
    cfg.strategy.predict_memory = True
    exact = estimate_peak(cfg, digest)
    assert exact.mb == 222.0 and same in exact.source and "same config" in exact.source


def test_fallback_is_the_models_memory_target(compose_cfg):
    cfg = compose_cfg(["strategy=parallel", "strategy.predict_memory=false", "model=ppo"])
    estimate = estimate_peak(cfg, config_hash(cfg))
    assert estimate.mb == 200.0 and estimate.source.startswith("fallback: model.memory_target_mb")


def test_a_cell_over_the_budget_fails_with_one_line(compose_cfg, tmp_path):
    cfg = compose_cfg(["model=tft", "precision=fp32", "budget=rtx3050ti"])  # fp32: the TFT defaults to auto
    PackingPlan(
        1, 2, 2, 0, "rtx3050ti", 3596.0, "cores: 2", {"tft-es-fp32": PeakEstimate("tft-es-fp32", 5000.0, "measured: x")}
    ).write(tmp_path)
    with pytest.raises(CellExceedsBudget) as error:
        check_fits(cfg, tmp_path)
    assert str(error.value) == (
        "cell tft-es-fp32 needs 5000 MB (measured: x) > 3596 MB available on budget rtx3050ti "
        "(4096 MB total - 500 MB headroom): not started"
    )
    PackingPlan(1, 2, 2, 0, "rtx3050ti", 3596.0, "cores: 2", {"tft-es-fp32": PeakEstimate("tft-es-fp32", 500.0, "x")}).write(
        tmp_path
    )
    check_fits(cfg, tmp_path)  # fits: no error


def _written_plan(folder: Path) -> dict:
    plan = PackingPlan(1, 2, 2, 0, "rtx3050ti", 3596.0, "cores: 2", {"0": PeakEstimate("tft-es-fp32", 500.0, "x")})
    return json.loads(plan.write(folder).read_text())


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: "{" * 10,  # cut short
        lambda d: "[" * 100_000,  # nested too deep for the parser
        lambda d: json.dumps([d]),  # not an object
        lambda d: json.dumps({**d, "extra": 1}),  # a field foxhunt does not write
        lambda d: json.dumps({k: v for k, v in d.items() if k != "cores"}),  # one missing
        lambda d: json.dumps({**d, "threads_per_job": -1}),  # would reach torch.set_num_threads
        lambda d: json.dumps({**d, "threads_per_job": 10**9}),
        lambda d: json.dumps({**d, "n_jobs": True}),
        lambda d: json.dumps({**d, "available_mb": "3596"}),
        lambda d: json.dumps({**d, "estimates": {"0": {"cell": "tft-es-fp32", "mb": float("nan"), "source": "x"}}}),
        lambda d: json.dumps({**d, "estimates": {"0": {"cell": "tft-es-fp32", "mb": -5.0, "source": "x"}}}),
        lambda d: json.dumps({**d, "estimates": {"0": {"cell": "tft-es-fp32", "mb": 1.0, "source": "x", "code": "y"}}}),
        lambda d: json.dumps({**d, "search": ["model.module.hidden_size"]}),
    ],
)
def test_a_damaged_or_planted_plan_is_refused_in_one_line_naming_the_file(compose_cfg, tmp_path, damage):
    """packing.json sits in a sweep folder others may write; its values reach
    torch.set_num_threads and the budget check. A plan foxhunt did not write is a one-line input
    error naming the file (a NaN estimate passed the budget check and -1 threads reached torch
    before; a cut-short file was a JSONDecodeError traceback, an unknown field a TypeError)."""
    data = _written_plan(tmp_path)
    assert PackingPlan.read(tmp_path) == PackingPlan.from_dict(data)  # as written: read back whole
    (tmp_path / "packing.json").write_text(damage(data))
    with pytest.raises(PlanFileError) as error:
        PackingPlan.read(tmp_path)
    assert is_user_error(error.value) and str(tmp_path / "packing.json") in error_line(error.value)
    assert "\n" not in error_line(error.value) and error_line(error.value).startswith("sweep error: ")
    cfg = compose_cfg(["model=tft", "precision=fp32", "budget=rtx3050ti"])
    with pytest.raises(PlanFileError):
        check_fits(cfg, tmp_path)


@pytest.mark.parametrize("kind", ["fifo", "link", "folder"])
def test_a_plan_that_is_no_regular_file_is_refused_without_blocking(tmp_path, kind):
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    plan = tmp_path / "packing.json"
    {"fifo": lambda: os.mkfifo(plan), "link": lambda: plan.symlink_to(target), "folder": lambda: plan.mkdir()}[kind]()
    with pytest.raises(PlanFileError, match="packing.json: not a packing plan"):
        PackingPlan.read(tmp_path)  # a FIFO blocked the reader for good before
