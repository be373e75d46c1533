"""Device memory budgets (``conf/budget/*.yaml``) and the check of measured figures against
them: a budget is valid or one line says why, what the run may use is total minus headroom,
and a figure breaches its limit only when it is above it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from foxhunt.memory.budget import Breach, MemoryBudget, find_breaches

mb = st.floats(0, 1e6, allow_nan=False)


def test_budget_validation_and_available_memory():
    assert MemoryBudget("rtx3050ti", 4096, 500).available_mb == 3596
    with pytest.raises(ValueError, match=r"^budget 'x': headroom_mb=5000 must be >= 0 and below total_mb=4096$"):
        MemoryBudget("x", 4096, 5000)
    with pytest.raises(ValueError, match=r"^budget 'x': kind='tpu' must be one of gpu, cpu$"):
        MemoryBudget("x", 4096, 0, kind="tpu")


def test_budget_configs_instantiate_and_the_default_card_is_the_seed_budget():
    from pathlib import Path

    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    budget_dir = Path(__file__).resolve().parents[2] / "conf" / "budget"
    budgets = {path.stem: instantiate(OmegaConf.load(path)) for path in sorted(budget_dir.glob("*.yaml"))}
    assert {"rtx3050ti", "cpu"} <= set(budgets) and len(budgets) >= 4
    assert all(isinstance(b, MemoryBudget) and b.name == stem for stem, b in budgets.items())
    assert budgets["rtx3050ti"] == MemoryBudget("rtx3050ti", total_mb=4096, headroom_mb=500, kind="gpu")
    assert budgets["cpu"].kind == "cpu"
    assert [stem for stem, b in budgets.items() if b.kind == "cpu"] == ["cpu"]


@pytest.mark.parametrize("total", [0, -1, float("nan")])
def test_a_budget_without_memory_is_refused(total):
    with pytest.raises(ValueError, match=rf"^budget 'x': total_mb={total!r} must be > 0$"):
        MemoryBudget("x", total, 0)


@given(total=st.floats(1, 1e6), share=st.floats(0, 0.999), used=mb)
def test_what_the_run_may_use_is_total_minus_headroom(total, share, used):
    budget = MemoryBudget("card", total, total * share)
    assert budget.available_mb == pytest.approx(total - total * share)
    assert budget.headroom_left_mb(used) == pytest.approx(total - used)


@given(peak=mb, device_peak=mb, target=st.one_of(st.none(), mb), total=st.floats(1, 1e6), headroom=st.floats(0, 0.5))
def test_a_figure_breaches_only_its_own_limit_and_only_above_it(peak, device_peak, target, total, headroom):
    budget = MemoryBudget("card", total, total * headroom)
    breaches = {b.limit: b for b in find_breaches(peak, "peak", device_peak, "device peak", budget, target)}
    assert ("target" in breaches) == (target is not None and peak > target)
    assert ("budget" in breaches) == (device_peak > budget.available_mb)
    if "target" in breaches:
        assert (breaches["target"].measured_mb, breaches["target"].limit_mb, breaches["target"].figure) == (peak, target, "peak")
    if "budget" in breaches:
        assert (breaches["budget"].measured_mb, breaches["budget"].limit_mb) == (device_peak, budget.available_mb)
    assert find_breaches(peak, "peak", device_peak, "device peak", None, None) == []  # nothing to check against


def test_a_limit_reached_exactly_is_no_breach_and_the_message_names_both_figures():
    budget = MemoryBudget("rtx3050ti", 4096, 500)
    assert find_breaches(150.0, "torch peak", 3596.0, "nvml peak", budget, 150.0) == []
    (target, over) = find_breaches(150.5, "torch peak", 3600.0, "nvml peak", budget, 150.0)
    assert target == Breach("target", 150.5, 150.0, "torch peak", "model.memory_target_mb")
    assert over.message(12) == (
        "memory budget exceeded at step 12: 3600.00 MB (nvml peak) > 3596.00 MB "
        "(budget rtx3050ti: 4096 MB total - 500 MB headroom)"
    )
