"""Pruning: a trial's fit reports its validation metric to the study, whose pruner may stop it.

:class:`TrialReporter` is a Lightning callback that the ``hparams_search`` configs add to every
trial (``callbacks.search_report``, instantiated with the run's other callbacks). Inside a
search's trial (its sweep folder holds the sweeper's ``study.json``: :class:`foxhunt.sweeps.study.StudyFile`;
its trial is the one numbered by its Hydra job number) it reports, at the end of each
validation of the fit, the metric the checkpoint monitors (``model.monitor.metric``:
``val/mean_reward`` for the agents, ``val/loss`` for the forecasters) to the trial, at step
``epoch`` (a walk-forward fold ``k``, ``fold: ${evaluation.fold}``: ``k * trainer.max_epochs + epoch``, so that each step
compares the same fold and epoch across trials; a second validation within an epoch is not
reported again). The value is signed to the study's direction (a ``val/loss`` reported to a
study that maximizes ``val/sharpe`` is reported negated), so the pruner compares like with
like. The reported values are the trial's intermediate values in ``optuna-dashboard``.

With ``hydra.sweeper.pruner`` ``median`` or ``hyperband`` the pruner is then asked; when it
says prune, the callback tags the run ``pruned`` (the validation step, the metric and its
value), records ``pruned_at`` on the trial, and raises :class:`TrialPruned`: the fit stops
there, the run ends KILLED (``stop_reason`` ``TrialPruned``: a ``SystemExit``, so not a failure,
and not a stop request that would checkpoint ``interrupted.ckpt`` or end the sweep:
:mod:`foxhunt.sweeps.sweep_cell`), and the sweeper tells the study PRUNED. A pruned trial
counts as a trial. Outside a search (a plain run, a grid sweep, ``foxhunt runs reproduce`` of
a trial's run) the callback does nothing. A study of several objectives is not reported to
(Optuna prunes single-objective studies only).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import lightning.pytorch as pl
import optuna
from hydra.core.hydra_config import HydraConfig

from foxhunt.runs.tracked_run import trainer_runs
from foxhunt.sweeps.search import trial_number
from foxhunt.sweeps.study import PRUNED_AT, StudyFile, open_storage

log = logging.getLogger(__name__)

PRUNED_TAG = "pruned"  # the run's tag: "validation <step>: <metric>=<value>" (this callback writes it)


class TrialPruned(SystemExit):
    """The study's pruner stopped this trial's fit (module doc)."""


def current_trial(sweep_dir: Path | None = None, number: int | None = None) -> tuple[optuna.trial.Trial, StudyFile] | None:
    """``(trial, study_file)`` of the running search job, or None outside a search's trial."""
    if sweep_dir is None or number is None:
        if not HydraConfig.initialized() or (number := trial_number()) is None:
            return None
        sweep_dir = Path(str(HydraConfig.get().sweep.dir))
    found = StudyFile.read(sweep_dir)
    if found is None or found.multi_objective:
        return None

    storage = open_storage(found.storage)
    study = optuna.load_study(study_name=found.study_name, storage=storage, pruner=found.pruner_spec().build())
    trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    return optuna.trial.Trial(study, trial_id), found


class TrialReporter(pl.Callback):
    """Reports ``monitor`` at each validation to the search's trial; stops a pruned fit (module doc)."""

    def __init__(self, monitor: str, mode: str = "max", fold: int | None = None) -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"mode={mode}: must be max or min")
        self.monitor, self.mode, self.fold = monitor, mode, fold
        self._trial: optuna.trial.Trial | None = None
        self._sign = 1.0
        self._looked = False

    def _find(self) -> None:
        self._looked = True
        found = current_trial()
        if found is None:
            return
        self._trial, _ = found
        maximize = self._trial.study.direction.name == "MAXIMIZE"
        self._sign = 1.0 if maximize == (self.mode == "max") else -1.0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._looked:
            self._find()

    def step(self, trainer: pl.Trainer) -> int:
        """The trial's step of this validation: the epoch, after the earlier folds' (module doc)."""
        epochs = max(1, int(trainer.max_epochs or 1))
        return (int(self.fold) * epochs if self.fold is not None else 0) + int(trainer.current_epoch)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._trial is None or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        metric = trainer.callback_metrics.get(self.monitor)
        if metric is None:
            return
        value = float(metric)
        if not math.isfinite(value):
            return
        step = self.step(trainer)
        self._trial.report(self._sign * value, step)
        if not self._trial.should_prune():
            return
        why = f"validation {step}: {self.monitor}={value:.6g}"
        self._trial.set_user_attr(PRUNED_AT, step)
        _tag_run(trainer, why)
        log.warning("trial %d pruned at %s", self._trial.number, why)
        raise TrialPruned(f"pruned by the study's pruner at {why}")


def _tag_run(trainer: pl.Trainer, why: str) -> None:
    """The run's ``pruned`` tag, through the run's own logger (its store and run id)."""
    for store, run_id in trainer_runs(trainer):
        try:
            store.tag(run_id, {PRUNED_TAG: why})
        except Exception:  # the stop goes on whatever the store says
            log.warning("could not tag run %s pruned", run_id, exc_info=True)
