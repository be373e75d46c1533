"""The config of foxhunt's Optuna sweeper (``hydra/sweeper=foxhunt_optuna``), registered with Hydra.

Each key is read and checked by :func:`foxhunt.sweeps.study.settings_from` (one line naming the
key for a bad value); what each one does: docs/how-to/hyperparameter-search.md.
"""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class FoxhuntOptunaSweeperConf:
    _target_: str = "hydra_plugins.foxhunt_optuna_sweeper.sweeper.FoxhuntOptunaSweeper"
    # The sampler, instantiated: any optuna.samplers class with its arguments.
    sampler: Any = field(default_factory=lambda: {"_target_": "optuna.samplers.TPESampler", "seed": None})
    # maximize | minimize, or one per objective (a list).
    direction: Any = "maximize"
    # Validation metrics of the trial's cell.json, in the order of direction (several: a Pareto front).
    objectives: list[str] = field(default_factory=lambda: ["val/sharpe"])
    study_name: str | None = None
    # A SQLAlchemy URL; null: mlruns/optuna.db beside the MLflow store (foxhunt.sweeps.study).
    storage: str | None = None
    # The study's size: trials that ended (finished, pruned, failed; a retried failure excepted).
    n_trials: int = 20
    # Trials at once (at most what the launcher runs at once).
    n_jobs: int = 1
    # Above this share of failed trials no new trial starts.
    max_failure_rate: float = 0.0
    # Retries of a trial left RUNNING by a dead process or ended by a stop, along one chain.
    max_retries: int = 1
    # none | median | hyperband, on the fit's validation metric at each validation (foxhunt.sweeps.pruning).
    pruner: str = "none"
    pruning: dict[str, Any] = field(default_factory=lambda: {"startup_trials": 5, "warmup_steps": 1, "reduction_factor": 3})
    # true: batches as Hydra's Optuna sweeper (ask n_jobs trials, wait for all): only to measure against.
    barrier: bool = False
    heartbeat_s: float = 30.0  # how often a running trial's heartbeat is written
    grace_s: float = 300.0  # a trial asked on another host with no heartbeat for this long is stale
    # Searched keys: Hydra override strings (choice(...), interval(...), range(...), tag(log, interval(...))).
    params: dict[str, Any] | None = None


ConfigStore.instance().store(group="hydra/sweeper", name="foxhunt_optuna", node=FoxhuntOptunaSweeperConf, provider="foxhunt")
