"""The ``parallel`` strategy's plan, decided before the launcher exists: the sweep's jobs as
Hydra's basic sweeper will launch them, each estimated by its job number, and ``n_jobs`` handed
to the joblib launcher."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf, read_write
from sweep_helpers import with_task_overrides

from foxhunt.sweeps.packing import apply_plan, plan_sweep, sweep_cells


@pytest.fixture
def parallel_config(tmp_path):
    """``foxhunt-train -m strategy=parallel model=dqn seed=1,2`` (no memory prediction), Hydra
    kept initialized: the plan composes every job."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    base = [
        f"paths.root_dir={tmp_path}",
        "strategy=parallel",
        "strategy.predict_memory=false",
        "logger.enabled=false",
        "model=dqn",
    ]
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / "conf"), version_base="1.3"):
        cfg = with_task_overrides(compose("train", overrides=base, return_hydra_config=True), [*base, "seed=1,2"])
        HydraConfig.instance().set_config(cfg)
        yield cfg


def test_grid_expands_to_16_cells_and_the_command_line_narrows_it(sweep_config):

    cells = sweep_cells(sweep_config)
    assert [sorted(c) for c in cells] == [
        sorted(["model=dqn", f"asset={a}", "preset=grid", f"paths.root_dir={sweep_config.paths.root_dir}"])
        for a in ("es", "nq", "6e", "zn")
    ]
    assert len(sweep_cells(with_task_overrides(sweep_config, ["preset=grid"]))) == 16


def test_only_the_basic_sweepers_grid_is_packed(sweep_config):
    with read_write(sweep_config.hydra):
        sweep_config.hydra.sweeper._target_ = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    with pytest.raises(
        ValueError, match=r"packs the cells of Hydra's basic sweeper; .*OptunaSweeper \(set strategy.n_jobs to a number\)"
    ):
        sweep_cells(sweep_config)


def test_every_job_is_estimated_by_its_number_and_n_jobs_goes_to_the_launcher(parallel_config):
    plan = plan_sweep(parallel_config)
    # two seeds of one cell: two jobs of one name, each estimated (the model's target: nothing measured)
    assert {number: (e.cell, e.mb) for number, e in plan.estimates.items()} == {
        "0": ("dqn-es-fp32", 150.0),
        "1": ("dqn-es-fp32", 150.0),
    }
    assert 1 <= plan.n_jobs <= min(2, plan.cores) and plan.threads_per_job == max(1, plan.cores // plan.n_jobs)
    assert OmegaConf.to_container(parallel_config.hydra.launcher, resolve=False)["n_jobs"] == "${strategy.n_jobs}"  # "auto"
    apply_plan(parallel_config, plan)
    assert parallel_config.hydra.launcher.n_jobs == plan.n_jobs
