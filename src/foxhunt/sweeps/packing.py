"""The ``parallel`` strategy's ``n_jobs``: decided in the parent, before the launcher exists.

Hydra only accepts launcher classes from the ``hydra_plugins`` package, so foxhunt keeps
hydra-joblib-launcher as it is and sets its ``n_jobs`` instead: the sweep callback's
``on_multirun_start`` runs before Hydra instantiates the launcher from ``hydra.launcher``, so
it expands the sweep into its cells exactly as Hydra's basic sweeper will (sweeper params,
then command-line overrides, cartesian product), composes each cell's config with Hydra's own
``load_sweep_config``, estimates each cell's peak (:mod:`foxhunt.sweeps.estimates`), decides
``n_jobs`` and the torch threads per job, and writes that plan to ``<sweep dir>/packing.json``
where each job reads its thread count and whether it fits at all.
"""

from __future__ import annotations

import logging
import time

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from foxhunt.sweeps.estimates import PackingPlan, available_mb, estimate_peak, plan_packing

log = logging.getLogger(__name__)

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_cells(config: DictConfig) -> list[list[str]]:
    """The override lists of every job, as Hydra's basic sweeper will launch them."""
    from hydra.core.global_hydra import GlobalHydra

    from foxhunt.sweeps.grid import expand_grid

    if config.hydra.sweeper._target_ != BASIC_SWEEPER:
        raise ValueError(
            f"strategy=parallel packs the cells of Hydra's basic sweeper; hydra.sweeper is "
            f"{config.hydra.sweeper._target_} (set strategy.n_jobs to a number)"
        )
    params = config.hydra.sweeper.get("params") or {}
    arguments = [f"{key}={value}" for key, value in params.items()]
    arguments += OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
    return expand_grid(arguments, GlobalHydra.instance().config_loader())


def plan_sweep(config: DictConfig) -> PackingPlan:
    """Estimate every cell and decide ``n_jobs`` and the threads per job."""
    from hydra.core.global_hydra import GlobalHydra

    from foxhunt.runs.cell import CellKey
    from foxhunt.runs.config_hash import config_hash
    from foxhunt.sweeps.resources import available_cores, cuda_devices

    started = time.perf_counter()
    loader = GlobalHydra.instance().config_loader()
    estimates = {}
    for overrides in sweep_cells(config):
        cell = loader.load_sweep_config(config, overrides)
        estimate = estimate_peak(cell, config_hash(cell))
        estimates[CellKey.from_config(cell).name] = estimate
        log.info("  %s: %.0f MB, %s", estimate.cell, estimate.mb, estimate.source)
    plan = plan_packing(
        estimates,
        available=available_mb(config),
        budget=str(config.budget.name),
        cores=available_cores(),
        devices=cuda_devices(config.trainer.accelerator),
        requested=config.strategy.n_jobs,
    )
    plan.seconds = round(time.perf_counter() - started, 3)
    return plan


def apply_plan(config: DictConfig, plan: PackingPlan) -> None:
    """Hand ``n_jobs`` to the joblib launcher Hydra is about to instantiate."""
    with read_write(config.hydra), open_dict(config.hydra.launcher):
        config.hydra.launcher.n_jobs = plan.n_jobs
