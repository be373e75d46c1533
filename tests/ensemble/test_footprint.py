"""foxhunt.ensemble.footprint, its arithmetic on figures given here: a footprint is the sum of its
parts, capacity the floor of what fits, the ensemble passes when its headroom stays, int8 is chosen
exactly where it pays; and a member measured after streaming reports its runtime's own bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from test_members import FEATURES, Agent

from foxhunt.ensemble.footprint import (
    MB,
    EnsembleFootprint,
    LoadDelta,
    MemberBars,
    MemberFootprint,
    bar,
    capacity,
    int8_choices,
    measure_member,
    model_memory_target,
    module_bytes,
    report_text,
)
from foxhunt.ensemble.members import AgentMember
from foxhunt.memory.budget import MemoryBudget

CONF = Path(__file__).resolve().parents[2] / "conf"


def footprint(name: str, family: str, weights: str, mb: float, p50: float, positions=None) -> MemberFootprint:
    quarter = int(mb * MB / 4)
    return MemberFootprint(name, family, weights, quarter, quarter, quarter, int(mb * MB) - 3 * quarter, "given", None, p50,
                           "numba", positions=None if positions is None else np.array(positions, np.int8))  # fmt: skip


def test_capacity_is_the_floor_of_what_fits():
    assert capacity(10 * MB, 3 * MB) == 3 and capacity(9 * MB, 3 * MB) == 3 and capacity(8.99 * MB, 3 * MB) == 2
    assert capacity(-1.0, 3 * MB) == 0 and capacity(10 * MB, 0) == 0
    assert bar(25.0, 100.0, 8) == "##......" and bar(500.0, 100.0, 4) == "####" and bar(1.0, 0.0, 3) == "..."


def test_the_report_adds_the_parts_and_the_ensemble_fits_on_its_headroom():
    members = {"fp32": [footprint("foxhunt-dqn-es", "dqn", "fp32", 300.0, 5.0), footprint("foxhunt-tft-es", "tft", "fp32", 500.0, 50.0)],
               "int8": [footprint("foxhunt-dqn-es", "dqn", "int8", 100.0, 6.0), footprint("foxhunt-tft-es", "tft", "int8", 200.0, 70.0)]}  # fmt: skip
    whole = EnsembleFootprint(members)
    assert members["fp32"][0].footprint_mb == pytest.approx(300.0) and whole.total_bytes("int8") == pytest.approx(300 * MB, abs=4)
    budget = MemoryBudget("card", total_mb=1000.0, headroom_mb=250.0)  # 750 MB available
    text, metrics, fits = report_text(whole, budget, {"dqn": 200.0, "tft": None})
    assert fits  # fp32 needs 800 MB: only 200 left, below the headroom; int8 (300 MB) leaves 700
    assert metrics["ensemble/fp32_mb"] == pytest.approx(800.0) and metrics["ensemble/fp32_headroom_mb"] == pytest.approx(200.0)
    assert metrics["ensemble/int8_headroom_mb"] == pytest.approx(700.0)
    assert (metrics["capacity/foxhunt-dqn-es_fp32"], metrics["capacity/foxhunt-dqn-es_int8"]) == (2.0, 7.0)
    assert (metrics["capacity/ensemble_fp32"], metrics["capacity/ensemble_int8"]) == (0.0, 2.0)
    assert "capacity/ensemble_int8_over_fp32" not in metrics  # no fp32 ensemble fits: no ratio
    assert "ensemble fp32: 800.00 MB, 200.00 MB left of 1000 (FAIL: 250 MB headroom required)" in text
    assert "ensemble int8: 300.00 MB, 700.00 MB left of 1000 (PASS" in text
    tight = MemoryBudget("card", total_mb=1000.0, headroom_mb=701.0)
    assert report_text(whole, tight, {})[2] is False
    with_context = EnsembleFootprint(members, cuda_context_bytes=int(100 * MB))
    _, metrics, _ = report_text(with_context, budget, {})
    assert metrics["ensemble/int8_headroom_mb"] == pytest.approx(600.0) and metrics["capacity/ensemble_int8"] == 2.0  # 650 / 300


@pytest.mark.parametrize(
    ("int8_mb", "int8_p50", "agree", "choice"),
    [(50.0, 10.0, 1.0, "int8"), (50.0, 10.01, 1.0, "fp32"), (80.0, 5.0, 1.0, "int8"), (80.01, 5.0, 1.0, "fp32"),
     (50.0, 5.0, 0.75, "int8"), (50.0, 5.0, 0.5, "fp32")],
)  # fmt: skip
def test_int8_is_chosen_exactly_where_it_pays(int8_mb, int8_p50, agree, choice):
    """Limits: at most 2x fp32's step, at least 20% smaller (exactly 20% is enough), positions equal on
    at least 75%."""
    fp32_positions = [1, 1, -1, 0]
    int8_positions = fp32_positions[: int(agree * 4)] + [9] * (4 - int(agree * 4))
    whole = EnsembleFootprint({"fp32": [footprint("m", "dqn", "fp32", 100.0, 5.0, fp32_positions)],
                               "int8": [footprint("m", "dqn", "int8", int8_mb, int8_p50, int8_positions)]})  # fmt: skip
    chosen, why = int8_choices(whole, max_slowdown=2.0, min_cut_pct=20.0, min_agreement=0.75)["m"]
    assert chosen == choice
    assert why.startswith(f"int8 step {int8_p50:.1f} us vs 5.0 us = {int8_p50 / 5:.2f}x (at most 2.00x)")
    assert f"positions equal on {100 * agree:.1f}% of 4 bars" in why


def test_a_measured_member_reports_its_runtimes_bytes_not_the_modules():
    agent = Agent(0)
    rows = np.random.default_rng(0).normal(size=(20, FEATURES)).astype(np.float32)
    bars = MemberBars(rows, np.arange(20, dtype=np.int64), calendar=None)
    numpy_member = AgentMember("dqn", "dqn", agent, "fp32", None, "numpy", 1)
    measured = measure_member(numpy_member, "fp32", bars, 5, LoadDelta(None, None, None))
    weights = sum(p.numel() * 4 for p in agent.acting_network.parameters())
    assert (measured.tensor_bytes, measured.runtime_bytes, measured.state_bytes) == (0, weights, 1)
    assert measured.positions.shape == (20,) and measured.footprint_bytes == weights + 1 + measured.step_peak_bytes
    torch_member = AgentMember("dqn", "dqn", agent, "fp32", None, "torch", 1)
    in_torch = measure_member(torch_member, "fp32", bars, 5, LoadDelta(None, None, None))
    assert (in_torch.tensor_bytes, in_torch.runtime_bytes) == (module_bytes(agent), 0) and module_bytes(agent) == weights
    np.testing.assert_array_equal(in_torch.positions, measured.positions)


def test_module_bytes_counts_a_shared_weight_once_and_the_targets_come_from_the_model_configs():
    tied = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8, bias=False))
    tied[1].weight = tied[0].weight
    assert module_bytes(tied) == 8 * 8 * 4
    for family in ("dqn", "ppo", "mamba2", "tft"):
        want = OmegaConf.load(CONF / "model" / f"{family}.yaml").get("memory_target_mb")
        assert model_memory_target(family) == (None if want is None else float(want))


def test_the_command_and_its_settings_are_named_footprint_and_validate_is_memory_validate_alone(tmp_path):
    """``foxhunt ensemble footprint`` measures the ensemble (``ensemble.footprint.*``); "validate" names one command,
    ``foxhunt memory validate``: ``foxhunt ensemble validate`` and ``ensemble.validate.*`` are refused in one line."""
    from typer.testing import CliRunner

    from foxhunt.cli import app
    from foxhunt.config.schema import validate
    from foxhunt.training.parts import compose_config

    runner = CliRunner()
    shown = runner.invoke(app, ["ensemble", "footprint", "--help"])
    assert shown.exit_code == 0 and "Footprint of the registered ensemble" in shown.output
    gone = runner.invoke(app, ["ensemble", "validate"])
    assert gone.exit_code == 2 and gone.output.startswith("foxhunt ensemble: usage error: No such command 'validate'.")
    assert "Usage" in runner.invoke(app, ["memory", "validate", "--help"]).output
    cfg = compose_config(["ensemble.footprint.warm_bars=7"], root_dir=tmp_path, config_name="ensemble")
    assert validate(cfg).ensemble.footprint.warm_bars == 7
    old = runner.invoke(app, ["ensemble", "footprint", "ensemble.validate.warm_bars=7"])
    assert (
        old.exit_code == 2
        and old.output == "foxhunt ensemble footprint: config error: Could not override 'ensemble.validate.warm_bars'.\n"
    )
