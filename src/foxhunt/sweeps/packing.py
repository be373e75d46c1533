"""The ``parallel`` strategy's ``n_jobs``: decided in the parent, before the launcher exists.

Hydra only accepts launcher classes from the ``hydra_plugins`` package, so foxhunt keeps
hydra-joblib-launcher as it is and sets its ``n_jobs`` instead: the sweep callback's
``on_multirun_start`` runs before Hydra instantiates the launcher from ``hydra.launcher``, so
it expands the sweep into its cells exactly as Hydra's basic sweeper will (sweeper params,
then command-line overrides, cartesian product), composes each cell's config with Hydra's own
``load_sweep_config``, estimates each cell's peak (:mod:`foxhunt.sweeps.estimates`), decides
``n_jobs`` and the torch threads per job, and writes that plan to ``<sweep dir>/packing.json``
where each job reads its thread count and whether it fits at all.

A search sweep (``hparams_search=...``: the Optuna sweeper picks each trial's values, so its
trials are unknown before they start) is planned from its largest trial instead
(:func:`foxhunt.sweeps.search.planning_cells`: every searched size at its largest value):
``n_jobs`` is how many such trials fit together, at most ``hydra.sweeper.n_jobs``, and each
trial is checked again when it starts (:func:`foxhunt.sweeps.estimates.check_fits`).
"""

from __future__ import annotations

import logging
import time

from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, open_dict, read_write

from foxhunt.runs.config_hash import config_hash
from foxhunt.sweeps.estimates import (
    PackingPlan,
    available_mb,
    estimate_peak,
    plan_packing,
)
from foxhunt.sweeps.grid import expand_grid
from foxhunt.sweeps.resources import available_cores, cuda_devices
from foxhunt.sweeps.search import BASIC_SWEEPER, concurrent_trials, is_search, planning_cells, task_overrides

log = logging.getLogger(__name__)


def sweep_cells(config: DictConfig) -> list[list[str]]:
    """The override lists of every job, as Hydra's basic sweeper will launch them."""
    if config.hydra.sweeper._target_ != BASIC_SWEEPER:
        raise ValueError(
            f"strategy=parallel packs the cells of Hydra's basic sweeper; hydra.sweeper is "
            f"{config.hydra.sweeper._target_} (set strategy.n_jobs to a number)"
        )
    params = config.hydra.sweeper.get("params") or {}
    arguments = [f"{key}={value}" for key, value in params.items()]
    arguments += task_overrides(config.hydra.overrides.task)
    return expand_grid(arguments, GlobalHydra.instance().config_loader())


def plan_sweep(config: DictConfig) -> PackingPlan:
    """Estimate every cell and decide ``n_jobs`` and the threads per job."""
    started = time.perf_counter()
    loader = GlobalHydra.instance().config_loader()
    search = is_search(config)
    cells, planned = planning_cells(config, loader) if search else (sweep_cells(config), None)
    estimates = {}
    for number, overrides in enumerate(cells):  # by job number: cells of one name (seeds) are several jobs
        cell = loader.load_sweep_config(config, overrides)
        estimate = estimate_peak(cell, config_hash(cell))
        estimates[str(number)] = estimate
        log.info("  %s%s: %.0f MB, %s", estimate.cell, " (largest trial)" if search else "", estimate.mb, estimate.source)
    plan = plan_packing(
        estimates,
        available=available_mb(config),
        budget=str(config.budget.name),
        cores=available_cores(),
        devices=cuda_devices(config.trainer.accelerator),
        requested=config.strategy.n_jobs,
        trials=concurrent_trials(config) if search else None,
    )
    plan.search = planned
    plan.seconds = round(time.perf_counter() - started, 3)
    return plan


def apply_plan(config: DictConfig, plan: PackingPlan) -> None:
    """Hand ``n_jobs`` to the joblib launcher Hydra is about to instantiate."""
    with read_write(config.hydra), open_dict(config.hydra.launcher):
        config.hydra.launcher.n_jobs = plan.n_jobs
