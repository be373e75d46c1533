"""The Hydra sweeper: hands the search to :func:`foxhunt.sweeps.trials.run_search`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

# Lazy imports: (c) foxhunt.sweeps.trials (optuna): Hydra imports this plugin at every foxhunt-train start, --help included


class FoxhuntOptunaSweeper(Sweeper):
    """Each trial asked for when a worker is free, launched alone through the sweep's launcher,
    told to the study in its database as it ends (:mod:`foxhunt.sweeps.trials`). Its settings are
    read from ``hydra.sweeper`` of the sweep's config (:func:`foxhunt.sweeps.study.settings_from`),
    which the sweep callback checked before any job started."""

    def __init__(self, **settings: Any) -> None:
        self.config: DictConfig | None = None
        self.launcher = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        from foxhunt.sweeps.trials import run_search

        assert self.config is not None and self.launcher is not None
        return run_search(self.config, self.launcher, Path(str(self.config.hydra.sweep.dir)))
