"""Hydra callback of every sweep (``conf/hydra/default.yaml``): before and after the jobs.

``on_multirun_start``, in the parent process before any job starts:
- makes Hydra's config visible to the ``hydra:`` resolver (``paths.root_dir`` falls back to
  ``hydra:runtime.cwd``, and Hydra sets it for jobs only, not for the sweep folder);
- creates the MLflow store and experiment: parallel jobs that first touch a fresh SQLite store
  race to create its tables and crash;
- under ``strategy=parallel``, packs the cells by memory and sets the joblib launcher's
  ``n_jobs`` (:mod:`foxhunt.sweeps.packing`);
- starts the sweep's parent run (tags ``sweep_id``, ``sweep_hash``, ``sweep_dir``, and the
  ``pid`` and ``host`` of this process, which the job commands check to show a sweep whose
  process died as STALE, however it was started) and passes its id to the jobs in
  ``$FOXHUNT_PARENT_RUN_ID`` (inherited by joblib's loky workers, submitit's local processes
  and, with sbatch's default ``--export=ALL``, SLURM jobs). With ``resume=true`` an earlier
  parent run is reopened instead, so a resumed sweep stays one group in the MLflow UI
  (:func:`find_parent_run`): the newest one of the same sweep folder (``foxhunt train start
  --resume`` reuses the job's folder), else, for a sweep rerun by hand in a new folder, the
  newest one of the same ``sweep_hash`` (the command-line overrides and sweeper params, without
  the ones that only choose how to launch) that no other job owns. The folder comes first
  because two jobs with the same overrides have the same hash.

``on_multirun_end``: reads every job's ``cell.json``, prints the summary table, writes
``summary.md`` and ``summary.png`` into the sweep folder and logs them (and the cell counts,
``sweep/*``, at step 0, or for a resumed sweep at the step after the last one logged:
:func:`summary_step`) to the parent run, which ends FINISHED, or FAILED when a cell failed;
then, if any cell failed, prints one line naming them and exits with status 1.

A search sweep (``hparams_search=...``, :mod:`foxhunt.sweeps.search`) is refused at the start
when its trials would share a folder or a study setting is out of range (one line, status 2);
its parent run is tagged with the ``study``. At the end the summary lists every trial of the
study (every launch's: :func:`foxhunt.sweeps.study.study_view`) with the value(s) told to it,
counts them all in the deflated Sharpe ratio (finished, pruned, failed), and the best trial is
printed and tagged on the parent run (``best_trial``, ``best_trial.value``,
``best_trial.overrides``, ``best_trial.run_id``, metric ``sweep/best_value``; several
objectives: ``best_trial`` names the Pareto front), with the sweeper's
``optimization_results.yaml``; each finished trial's run is tagged with its study and its
cell's trial count (what ``foxhunt runs top`` deflates by). When the sweeper or the launcher
raises (a stop, a study database that fails, a job whose overrides Hydra cannot compose) Hydra
skips ``on_multirun_end``; an exit handler then prints the summary and ends the parent run FAILED
instead of leaving it RUNNING (unless a stop ended it KILLED).

Hydra turns an exception raised by a callback into a warning and carries on, so this callback
exits itself (``SystemExit``, which Hydra lets through): with status 2 and one line when the
store or the parent run cannot be prepared (no job starts), with status 1 after the summary
when a cell failed.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from foxhunt.config.schema import validate_shared
from foxhunt.errors import TAG_TEXT_LIMIT, ConfigError, FolderError, error_line, is_user_error, one_line, one_line_error
from foxhunt.runs.cell import CellKey, read_results
from foxhunt.runs.environment import JOB_ID_ENV, PARENT_RUN_ENV, SWEEP_PID_ENV
from foxhunt.runs.leaderboard import SEARCH_TRIALS_TAG
from foxhunt.runs.provenance import process_tags, source_tags
from foxhunt.runs.status import OK_RESULTS, Status
from foxhunt.runs.store import RunStore
from foxhunt.runs.tags import RUN_KIND_SWEEP, Tag

# Lazy imports: (c) the sweep's search (optuna), packing, study, summary in its hooks: Hydra makes it at every foxhunt-train start

log = logging.getLogger(__name__)

SOURCE = "foxhunt-train -m"  # the parent run's Source (foxhunt.runs.provenance)
SWEEP_HASH_LENGTH = 16
# Overrides that choose how a sweep runs, not what it trains: not part of its identity.
LAUNCH_KEYS = ("resume", "strategy", "hydra/launcher", "hydra.launcher", "hydra.sweep", "hydra.job", "hydra.verbose")
# The parent run's end-of-sweep metrics (logged once per launch: summary_step).
SWEEP_CELLS, SWEEP_CELLS_FAILED, SWEEP_WALL_S = "sweep/cells", "sweep/cells_failed", "sweep/wall_s"
SWEEP_BEST_VALUE = "sweep/best_value"  # a search's best trial's value
SWEEP_TRIALS_PRUNED = "sweep/trials_pruned"  # a search's study: trials its pruner stopped
SUMMARY_METRICS = (SWEEP_CELLS, SWEEP_CELLS_FAILED, SWEEP_WALL_S, SWEEP_BEST_VALUE, SWEEP_TRIALS_PRUNED)
OPTUNA_RESULTS = (
    "optimization_results.yaml"  # the sweeper's best trial or Pareto front, in the sweep folder (foxhunt.sweeps.trials)
)
# At exit, when the sweeper raised (a stop, a study database that failed) before Hydra called on_multirun_end.
UNFINISHED = "the sweeper raised before the end of the sweep (see its error in the log)"


def summary_step(store, run_id: str) -> int:
    """The step of a sweep's end-of-sweep metrics on its parent run: 0 for the first launch, and
    one past the last step that has any of them for a resumed sweep (its parent run reopened).

    Each launch's summary has a step of its own: the history keeps what every launch ended with
    (a failed launch's failed cells, each launch's wall time) and the latest values, which the
    runs table shows, are the sweep's state now. Logging a resumed summary at step 0 again would
    put two values at one step (the first launch's and this one's), and which is the run's value
    would depend on their timestamps; logging only what changed would still need a new step
    (the wall time always changes, and the counts did: that is why the sweep was resumed). The
    step is read from the stored history, not from ``resume_count``: a launch that ended before
    its summary (a stop) logged none, and a tag is no proof of what was logged."""
    last = store.last_metric_step(run_id, SUMMARY_METRICS)
    return 0 if last is None else last + 1


def sweep_hash(config: DictConfig) -> str:
    """Identity of a sweep: its overrides and sweeper params, without the launch choices."""
    from foxhunt.sweeps.search import task_overrides

    overrides = []
    for text in task_overrides(config.hydra.overrides.task):
        key = text.split("=", 1)[0].lstrip("+~")
        if not any(key == k or key.startswith(f"{k}.") for k in LAUNCH_KEYS):
            overrides.append(text)
    params = config.hydra.sweeper.get("params")
    params = OmegaConf.to_container(params, resolve=False) if params is not None else {}
    text = json.dumps({"overrides": sorted(overrides), "params": params}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:SWEEP_HASH_LENGTH]


def find_parent_run(store, experiment: str, sweep_dir: str, digest: str, job_id: str | None = None) -> str | None:
    """The parent run a resumed sweep reopens (see the module doc), or None.

    Newest parent run tagged with this sweep folder; else newest with this ``sweep_hash``; neither
    counting one that belongs to another job than ``job_id`` (when this sweep is a job's).
    """
    parents = store.search(experiment, tags={Tag.RUN_KIND: RUN_KIND_SWEEP})

    def ours(run) -> bool:  # another job's parent is never reopened, whatever folder it names
        return not job_id or (run.tags.get(Tag.JOB_ID) or None) in (None, job_id)

    for run in parents:
        if run.tags.get(Tag.SWEEP_DIR) == sweep_dir and ours(run):
            return run.run_id
    for run in parents:
        if run.tags.get(Tag.SWEEP_HASH) == digest and ours(run):
            return run.run_id
    return None


SLURM_COMMANDS = ("sbatch", "srun")  # what submitit's SLURM executor calls


def _validate_shared(config: DictConfig) -> None:
    """The settings every cell shares (``strategy.n_jobs``, ``logger``, ...), checked before any
    run or worker exists; the cells' own values (swept, searched) are checked in each job. The
    SLURM strategy needs SLURM's commands here: without them submitit's "Could not detect srun"
    was a 38-line traceback after the parent run was made (found by a helper probing the CLI)."""
    validate_shared(config)
    if config.strategy.name == "slurm":
        missing = [command for command in SLURM_COMMANDS if shutil.which(command) is None]
        if missing:
            raise ConfigError(f"strategy=slurm: {' and '.join(missing)} not found on PATH: this machine is not a SLURM "
                              "cluster's node (strategy=sequential or strategy=parallel trains here)")  # fmt: skip


def _check_cells(config: DictConfig) -> None:
    from hydra.core.global_hydra import GlobalHydra

    from foxhunt.sweeps.grid import check_cells
    from foxhunt.sweeps.packing import sweep_cells

    cells = sweep_cells(config)
    if len(cells) > 1:  # one cell checks its values first thing, as any run does: nothing trains before it
        check_cells(config, cells, GlobalHydra.instance().config_loader())


class SweepCallback(Callback):
    def __init__(self) -> None:
        self.parent_run_id: str | None = None
        self.sweep_dir: Path | None = None
        self.started: float | None = None
        self.finished = False
        self.pid: int | None = None

    # -- before the jobs ------------------------------------------------------------------
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)
        from foxhunt.sweeps.estimates import PLAN_FILE
        from foxhunt.sweeps.search import check_search_config, is_search

        self.started = time.perf_counter()
        self.finished, self.pid = False, os.getpid()
        os.environ[SWEEP_PID_ENV] = str(self.pid)  # its workers end when this process dies (foxhunt.sweeps.orphans)
        made: Path | None = None  # the sweep folder, if this made it: a refused sweep leaves none behind
        try:
            self.sweep_dir = Path(str(config.hydra.sweep.dir))
            _validate_shared(config)
            try:
                made = None if self.sweep_dir.exists() else self.sweep_dir
                self.sweep_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise FolderError.of(exc, "paths.root_dir or hydra.sweep.dir") from None
            if is_search(config):
                check_search_config(config)
            else:  # every cell's values before any run exists (a search's trials are checked as they start)
                _check_cells(config)
            if config.logger.enabled:
                self.parent_run_id = self._start_parent_run(config)
                os.environ[PARENT_RUN_ENV] = self.parent_run_id
            if config.strategy.name == "parallel":
                self._pack(config)
            else:  # a plan left in a reused sweep folder must not size this sweep's jobs
                (self.sweep_dir / PLAN_FILE).unlink(missing_ok=True)
            # a study whose every trial failed, or a launcher that raises (a search's trial Hydra cannot
            # compose), ends without on_multirun_end: the parent run must not stay RUNNING
            atexit.register(self._end_unfinished, config)
        except Exception as exc:  # Hydra would only warn and start the jobs anyway
            log.debug("sweep preparation failed", exc_info=True)
            line = error_line(exc, limit=None) if is_user_error(exc) else one_line_error(exc)
            if self.parent_run_id is not None:
                self._fail_parent_run(config, line)
            elif made is not None:
                with contextlib.suppress(OSError):  # only while it is empty
                    made.rmdir()
            print(f"foxhunt-train: cannot prepare the sweep: {line}", file=sys.stderr)
            sys.exit(2)

    def _fail_parent_run(self, config: DictConfig, line: str) -> None:
        try:
            self._store(config).end(self.parent_run_id, Status.FAILED, {Tag.ERROR: one_line(line, TAG_TEXT_LIMIT)})
        except Exception:  # the store itself may be what failed
            log.debug("could not mark the parent run FAILED", exc_info=True)
        os.environ.pop(PARENT_RUN_ENV, None)

    def _pack(self, config: DictConfig) -> None:
        sweep_dir = self._sweep_dir()
        from foxhunt.sweeps.estimates import PLAN_FILE
        from foxhunt.sweeps.packing import apply_plan, plan_sweep

        plan = plan_sweep(config)
        plan.write(sweep_dir)
        apply_plan(config, plan)
        log.info(plan.describe())
        if self.parent_run_id is not None:
            store = self._store(config)
            store.tag(self.parent_run_id, {Tag.PACKING: plan.describe()})
            store.log_artifact(self.parent_run_id, sweep_dir / PLAN_FILE)

    def _sweep_dir(self) -> Path:
        assert self.sweep_dir is not None  # set first by on_multirun_start
        return self.sweep_dir

    @staticmethod
    def _store(config: DictConfig):
        return RunStore(config.logger.tracking_uri)

    def _start_parent_run(self, config: DictConfig) -> str:
        sweep_dir = self._sweep_dir()
        from foxhunt.sweeps.search import is_search, study_name, task_overrides

        logger = config.logger
        store = self._store(config)
        experiment_id = store.ensure_experiment(logger.experiment, logger.artifact_location)
        digest = sweep_hash(config)
        overrides = " ".join(task_overrides(config.hydra.overrides.task))
        process = process_tags()
        tags = {
            **source_tags(SOURCE),
            Tag.RUN_KIND: RUN_KIND_SWEEP,
            Tag.SWEEP_HASH: digest,
            Tag.SWEEP_ID: sweep_dir.name,
            Tag.SWEEP_DIR: str(sweep_dir.resolve()),
            Tag.STRATEGY: str(config.strategy.name),
            Tag.OVERRIDES: one_line(overrides, TAG_TEXT_LIMIT),
            Tag.PID: process[Tag.PID],
            Tag.HOST: process[Tag.HOST],
        }
        if is_search(config):
            tags[Tag.STUDY] = study_name(config) or ""
        if config.resume:
            run_id = find_parent_run(store, logger.experiment, tags[Tag.SWEEP_DIR], digest, os.environ.get(JOB_ID_ENV))
            if run_id is not None:
                store.reopen(run_id, tags)  # tags first, then RUNNING (the supervisor's come after)
                log.info("sweep resumes its parent run %s", run_id)
                return run_id
        run_id = store.create(experiment_id, f"sweep-{sweep_dir.name}", tags)
        log.info("sweep parent run %s in %s", run_id, logger.tracking_uri)
        return run_id

    # -- after the jobs -------------------------------------------------------------------
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        results, failed, noun = self._finish(config)
        if failed:
            names = ", ".join(f"{r.cell} ({r.status}: {r.error})" for r in failed)
            print(f"foxhunt-train: {len(failed)} of {len(results)} {noun} failed: {names}", file=sys.stderr, flush=True)
            sys.exit(1)

    def _end_unfinished(self, config: DictConfig) -> None:
        """At exit: a sweep whose sweeper or launcher raised (every trial failed, a job that
        cannot be composed) still gets its summary, and its parent run ends FAILED rather than
        staying RUNNING."""
        if self.finished or os.getpid() != self.pid:  # ended normally, or a forked child
            return
        try:
            if self.parent_run_id is not None and self._store(config).get(self.parent_run_id).status != Status.RUNNING:
                return  # ended already (a stop request ends it KILLED)
            results, failed, noun = self._finish(config, error=UNFINISHED)
            if failed:  # none: what ended the sweep said its own line (a second, "0 of 0 trials failed", misled)
                names = ", ".join(f"{r.cell} ({r.status}: {r.error})" for r in failed)
                print(f"foxhunt-train: {len(failed)} of {len(results)} {noun} failed: {names}", file=sys.stderr, flush=True)
        except Exception:
            log.exception("could not end the sweep's parent run at exit")

    def _finish(self, config: DictConfig, error: str | None = None):
        """Print, write and log the summary; end the parent run. Returns (results, failed, noun)."""
        from foxhunt.sweeps import search
        from foxhunt.sweeps.summary import failures, format_markdown, format_table, plot_summary

        assert self.sweep_dir is not None and self.started is not None
        self.finished = True
        wall = time.perf_counter() - self.started
        searching = search.is_search(config)
        view = self._study_view(config) if searching else None
        results = view.results if view is not None else read_results(self.sweep_dir)
        failed = failures(results)
        noun = "trials" if searching else "cells"
        title = f"sweep {self.sweep_dir.name}: {len(results)} {noun}, {wall:.0f} s"
        best, best_text, goal, n_trials, values = None, None, None, None, None
        if searching:
            goal = search.direction(config)
            keys = search.search_keys(config)
            best = search.best_trial(results, goal)
            if view is not None and view.settings.multi_objective:
                best_text = search.describe_pareto(results, view.pareto, view.values, view.settings.objectives,
                                                   view.settings.directions, keys)  # fmt: skip
            else:
                best_text = search.describe_best(best, goal, keys, len(results))
            if view is not None:
                n_trials, values = view.counts.total or None, view.values
                best_text += f"\nstudy {view.settings.name} ({view.settings.storage}): {view.counts.describe()}"
        print(f"\n{title}\n{format_table(results, n_trials, values)}" + (f"\n{best_text}" if best_text else ""), flush=True)
        try:  # a failure to write or log the summary must not hide failed cells
            markdown = self.sweep_dir / "summary.md"
            markdown.write_text(format_markdown(results, title, best_text, n_trials, values))
            image = plot_summary(results, self.sweep_dir / "summary.png", title, goal) if results else None
            if view is not None and config.logger.enabled:
                self._tag_trial_runs(config, view)
            if self.parent_run_id is not None:
                optuna_results = self.sweep_dir / OPTUNA_RESULTS
                artifacts = [markdown, image, optuna_results if searching and optuna_results.is_file() else None]
                tags = self._best_tags(config, best, view) if searching else {}
                if error is not None:
                    tags[Tag.ERROR] = one_line(error, TAG_TEXT_LIMIT)
                extra = {SWEEP_TRIALS_PRUNED: view.counts.pruned} if view is not None else {}
                self._end_parent_run(config, results, failed, wall, artifacts, tags, failed_run=error is not None, extra=extra)
        except Exception:
            log.exception("could not write or log the sweep summary")
        finally:
            os.environ.pop(PARENT_RUN_ENV, None)
        return results, failed, noun

    def _study_view(self, config: DictConfig):
        """The search's study as the summary shows it; None (the folder's results instead) when
        its database cannot be read."""
        try:
            from foxhunt.sweeps.study import study_view

            return study_view(config, CellKey.from_config(config))
        except Exception as exc:
            if is_user_error(exc):  # its database: said once already, one line
                log.warning("could not read the search's study (%s): the summary shows this sweep folder's trials",
                            error_line(exc, limit=300))  # fmt: skip
            else:
                log.exception("could not read the search's study: the summary shows this sweep folder's trials")
            return None

    @staticmethod
    def _tag_trial_runs(config: DictConfig, view) -> None:
        """Each finished trial's run: its study and how many trials its cell's deflated Sharpe
        ratio counts (``foxhunt runs top`` reads them: :data:`foxhunt.runs.leaderboard.SEARCH_TRIALS_TAG`)."""
        from foxhunt.sweeps.study import per_cell_counts

        counts = per_cell_counts(view)
        store = RunStore(config.logger.tracking_uri)
        for result in view.results:
            cell = view.cells.get(result.trial)
            if result.status in OK_RESULTS and result.run_id and cell in counts:
                try:
                    owner = store.get(result.run_id).tags.get(Tag.STUDY)
                    if owner and owner != view.settings.name:  # a run resume=true found finished in another study:
                        # its result is reused, its records stay that study's (they were re-tagged: study and trial count)
                        log.info("trial %s reused run %s of study %s: left as it is", result.trial, result.run_id, owner)
                        continue
                    store.tag(result.run_id, {Tag.STUDY: view.settings.name, SEARCH_TRIALS_TAG: str(counts[cell])})
                except Exception:  # a run of an earlier launch that is gone: the count waits for the next summary
                    log.warning("could not tag run %s with its study's trial count", result.run_id, exc_info=True)

    @staticmethod
    def _best_tags(config: DictConfig, best, view=None) -> dict[str, str]:
        from foxhunt.sweeps.search import search_keys, searched_overrides

        if view is not None and view.settings.multi_objective:  # the Pareto front's trials, by name
            names = {r.trial: r.cell for r in view.results}
            return (
                {Tag.BEST_TRIAL: one_line(", ".join(names.get(n, f"trial{n}") for n in view.pareto), TAG_TEXT_LIMIT)}
                if view.pareto
                else {}
            )
        if best is None:
            return {}
        overrides = " ".join(searched_overrides(best, search_keys(config)))
        return {
            Tag.BEST_TRIAL: best.cell,
            Tag.BEST_VALUE: repr(float(best.objective)),
            Tag.BEST_OVERRIDES: one_line(overrides, TAG_TEXT_LIMIT),
            Tag.BEST_TRIAL_RUN: best.run_id or "",
        }

    def _end_parent_run(self, config: DictConfig, results, failed, wall: float, artifacts, tags=None, failed_run=False,
                        extra=None) -> None:  # fmt: skip
        """Log the summary metrics (at :func:`summary_step`), the artifacts and the tags; end the run."""
        parent_run_id = self.parent_run_id
        assert parent_run_id is not None  # called only with a parent run
        store = self._store(config)
        values = {SWEEP_CELLS: len(results), SWEEP_CELLS_FAILED: len(failed), SWEEP_WALL_S: wall, **(extra or {})}
        tags = dict(tags or {})
        if Tag.BEST_VALUE in tags:
            values[SWEEP_BEST_VALUE] = float(tags[Tag.BEST_VALUE])
        store.log_metrics(parent_run_id, values, step=summary_step(store, parent_run_id))
        for path in artifacts:
            if path is not None:
                store.log_artifact(parent_run_id, path)
        if failed:
            tags[Tag.FAILED_CELLS] = ", ".join(r.cell for r in failed)
        store.end(parent_run_id, Status.FAILED if failed or failed_run else Status.FINISHED, tags)
