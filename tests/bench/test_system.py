"""The whole chain, end to end (slow: about an hour on 2 cores): walk-forward sweeps through
``foxhunt-train -m`` find a planted pattern with every family and nothing in a random walk
(:mod:`foxhunt.bench.system`; the same grid is the benchmark's ``system`` section)."""

from __future__ import annotations

import pytest

from foxhunt.bench.context import BenchContext
from foxhunt.bench.settings import load_settings
from foxhunt.bench.system import judge, run_grid


@pytest.mark.slow
def test_every_family_finds_a_planted_pattern_and_none_finds_one_in_noise(tmp_path):
    settings = load_settings(overrides=[f"work_dir={tmp_path}"])
    grid = run_grid(BenchContext(settings=settings, root=tmp_path, log=print))
    families = len(settings.system.models)
    assert {pattern: len(results) for pattern, results in grid.items()} == {"planted": families, "random_walk": families}
    rows = judge(grid, float(settings.system.max_dsr_noise))
    missed = [f"{row.name}: {row.figure:.3f} (goal {row.goal_op} {row.goal}; {row.note})" for row in rows if not row.met]
    assert not missed, "\n".join(missed)
