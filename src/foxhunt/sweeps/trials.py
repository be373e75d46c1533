"""A search's trials, asked and told one at a time by a pool of workers: no barrier.

Hydra's Optuna sweeper asked its sampler for ``n_jobs`` trials, launched them together and
waited for the whole batch before it asked again, so with ``strategy=parallel`` a worker whose
trial ended early idled until the batch's slowest trial ended (Hydra issue 3091). Here the
sweeper asks for a trial whenever a worker is free (Optuna's ask-and-tell):
:class:`TrialPool` keeps up to ``workers`` trials running, each launched on its own through the
sweep's Hydra launcher (a one-job launch, in a thread of the sweep's process that only waits
for it), and tells the study each result as it comes, then asks for the next trial.

- **Workers** (:func:`worker_count`): ``hydra.sweeper.n_jobs``, at most what the launcher runs
  at once: joblib's ``n_jobs`` (``strategy=parallel`` packs it by memory:
  :mod:`foxhunt.sweeps.packing`), submitit's ``array_parallelism``; Hydra's basic launcher
  (``strategy=sequential``) runs a trial inside the sweep's own process, one at a time, on its
  main thread (a fit installs signal handlers, which only the main thread may).
- **How many** (:mod:`foxhunt.sweeps.study`): trials are asked until the study holds
  ``n_trials`` that count (ended, a retried failure excepted), those running included; a launch
  that finds them all there asks for none.
- **What is told** (:func:`foxhunt.sweeps.study.outcome_of`): the trial's ``cell.json`` decides:
  FINISHED (or SKIPPED by ``resume=true``) with finite objective values -> COMPLETE; the pruner
  stopped it (its job set ``pruned_at`` on the trial) -> PRUNED; anything else -> FAIL with a
  reason. A launch that raised a stop request (Ctrl-C, SIGTERM) tells its trial FAILED and
  enqueues its retry (the rule of :mod:`foxhunt.sweeps.study`), starts nothing more, waits for
  the running trials and re-raises the stop. Any other error of a launch is the trial's failure.
- **Heartbeats**: while a trial runs, its heartbeat is written every ``hydra.sweeper.heartbeat_s``
  from a thread of the sweep's process (how another host tells that this process is gone).
- **Idle time** (:class:`PoolReport`, ``workers.json`` in the sweep folder): for each worker
  slot, when each trial ran; the idle share of the workers' time while trials were still to
  start is what a barrier costs. ``hydra.sweeper.barrier=true`` dispatches as Hydra's Optuna
  sweeper did (ask a batch of ``workers`` trials, wait for all of them): kept only to measure
  that cost against (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hydra.core.utils import JobStatus
from hydra.utils import instantiate
from omegaconf import OmegaConf
from optuna.trial import TrialState

from foxhunt.errors import error_line, one_line_error, raised_in
from foxhunt.runs.cell import CELL_RESULT_FILE, CellResult
from foxhunt.sweeps import study as st
from foxhunt.sweeps.search import search_arguments
from foxhunt.sweeps.space import distributions, value_text

log = logging.getLogger(__name__)

WORKERS_FILE = "workers.json"  # in the sweep folder: when each trial ran on which worker, the idle time
# (trial number, overrides) -> (its cell.json, its folder), either None when there is none; raises a stop
Launch = Callable[[int, list[str]], tuple[CellResult | None, str | None]]


def is_stop(exc: BaseException) -> bool:
    """A stop request (Ctrl-C, SIGTERM turned SystemExit), not a failure of the trial."""
    return isinstance(exc, (KeyboardInterrupt, SystemExit))


def worker_count(config, n_jobs: int) -> tuple[int, bool]:
    """(trials at once, whether they run inline in this process's main thread): module doc."""
    launcher = config.hydra.get("launcher") or {}
    target = str(launcher.get("_target_", ""))
    if "BasicLauncher" in target or not target:
        return 1, True
    limit = n_jobs
    for key in ("n_jobs", "array_parallelism"):
        value = launcher.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            limit = min(limit, value)
    return max(1, limit), False


@dataclass
class Span:
    trial: int
    slot: int
    start_s: float
    end_s: float | None = None


@dataclass
class PoolReport:
    """When each trial ran on which worker slot, and the idle time of the slots (module doc)."""

    workers: int
    barrier: bool
    spans: list[Span] = field(default_factory=list)

    def _ended(self) -> list[tuple[float, float]]:
        """(start, end) of each trial that ended."""
        return [(s.start_s, s.end_s) for s in self.spans if s.end_s is not None]

    def _window(self) -> tuple[float, float, float] | None:
        ended = self._ended()
        if not ended:
            return None
        return min(start for start, _ in ended), max(end for _, end in ended), max(start for start, _ in ended)

    def figures(self) -> dict[str, float]:
        """wall_s (first start to last end), busy_s, idle_s, idle_share over that window; and
        idle_while_waiting_s / _share: up to the last trial's start, while trials were waiting."""
        window = self._window()
        if window is None:
            return {}
        first, last_end, last_start = window
        ended = self._ended()
        busy = sum(end - start for start, end in ended)
        wall = last_end - first
        waiting = last_start - first
        busy_waiting = sum(max(0.0, min(end, last_start) - start) for start, end in ended)
        capacity, capacity_waiting = self.workers * wall, self.workers * waiting
        return {
            "wall_s": round(wall, 3), "busy_s": round(busy, 3), "idle_s": round(capacity - busy, 3),
            "idle_share": round((capacity - busy) / capacity, 4) if capacity > 0 else 0.0,
            "idle_while_waiting_s": round(capacity_waiting - busy_waiting, 3),
            "idle_while_waiting_share": round((capacity_waiting - busy_waiting) / capacity_waiting, 4) if capacity_waiting > 0 else 0.0,
        }  # fmt: skip

    def describe(self) -> str:
        f = self.figures()
        if not f:
            return f"workers: {self.workers}, no trial ran"
        return (f"workers: {self.workers} ({'batches, as Hydra' + chr(39) + 's Optuna sweeper' if self.barrier else 'a trial starts when a worker frees'}), "
                f"idle {100 * f['idle_while_waiting_share']:.1f}% of their time while trials waited to start, "
                f"{100 * f['idle_share']:.1f}% to the end")  # fmt: skip

    def write(self, sweep_dir: Path) -> Path:
        Path(sweep_dir).mkdir(parents=True, exist_ok=True)
        path = Path(sweep_dir) / WORKERS_FILE
        data = {"workers": self.workers, "barrier": self.barrier, **self.figures(), "trials": [asdict(s) for s in self.spans]}
        path.write_text(json.dumps(data, indent=2))
        return path


class TrialPool:
    """Asks, launches and tells the trials of one launch of a search (module doc)."""

    def __init__(self, study, settings: st.StudySettings, space: dict[str, Any], fixed: list[str], launch: Launch,
                 workers: int, inline: bool, sweep_dir: Path, owner: dict[str, Any] | None = None,
                 sampler=None) -> None:  # fmt: skip
        self.study, self.settings, self.space, self.fixed = study, settings, space, fixed
        self.sampler = sampler  # hydra.sweeper.sampler: made again before each ask (_ask)
        self.launch, self.workers, self.inline, self.sweep_dir = launch, max(1, workers), inline, Path(sweep_dir)
        self.owner = owner or st.process_identity()
        self.report = PoolReport(self.workers, settings.barrier)
        self.running: dict[int, Any] = {}  # trial number -> optuna Trial
        self._slots: dict[int, int] = {}  # trial number -> worker slot
        self._started = time.perf_counter()
        self._stop: BaseException | None = None
        self._halted = False  # no more trials: a stop, or too many failures
        self._beating = threading.Event()

    # -- what to ask --------------------------------------------------------------------------
    def wanted(self) -> int:
        """Trials still to start in this launch for the study to hold ``n_trials`` that count,
        those running included: every RUNNING trial of the study, another search's on the same
        study too (two searches counted only their own and together ran past n_trials; a stale
        one was settled when the study was opened)."""
        if self._halted:
            return 0
        trials = self.study.get_trials(deepcopy=False)
        running = {t.number for t in trials if t.state == TrialState.RUNNING} | set(self.running)
        return max(0, self.settings.n_trials - len(st.counted(trials)) - len(running))

    def _check_failures(self) -> None:
        counts = st.trial_counts(self.study.get_trials(deepcopy=False))
        if counts.total and counts.failed / counts.total > self.settings.max_failure_rate:
            log.error("%d of %d trials failed, over hydra.sweeper.max_failure_rate=%s: no more trials", counts.failed,
                      counts.total, self.settings.max_failure_rate)  # fmt: skip
            self._halted = True

    def _ask(self):
        if self.sampler is not None:
            # seeded by the trials sampled before this one, whichever launch sampled them: a launch's sampler
            # seeded once (seed + the study's trials at its start) drew other trials after a kill or a stop than
            # the search never interrupted (found by a helper probing searches)
            sampled = sum(st.RETRY_OF not in t.user_attrs for t in self.study.get_trials(deepcopy=False))
            self.study.sampler = _sampler(self.sampler, sampled)
        trial = self.study.ask(self.space)
        st.claim(self.study, trial._trial_id, self.owner, self.sweep_dir)
        slot = min(set(range(self.workers)) - set(self._slots.values()))
        self._slots[trial.number] = slot
        self.running[trial.number] = trial
        self.report.spans.append(Span(trial.number, slot, round(time.perf_counter() - self._started, 3)))
        overrides = [*self.fixed, *(f"{key}={_text(trial.params[key])}" for key in self.space)]
        retry = trial.user_attrs.get(st.RETRY_OF)
        log.info("trial %d%s: %s", trial.number, f" (retries trial {retry})" if retry is not None else "",
                 " ".join(overrides[len(self.fixed):]))  # fmt: skip
        return trial, overrides

    def _tell(self, number: int, outcome: st.Outcome) -> None:
        trial = self.running.pop(number)
        self._slots.pop(number, None)
        span = next(s for s in reversed(self.report.spans) if s.trial == number)
        span.end_s = round(time.perf_counter() - self._started, 3)
        st.tell(self.study, trial, outcome, self.settings.max_retries)
        if outcome.result is not None and outcome.output_dir and outcome.state == "complete":
            _record_objective(outcome.result, outcome.values[0], outcome.output_dir)
        log.info("trial %d: %s%s", number, outcome.state.upper(),
                 f" {', '.join(f'{v:.6g}' for v in outcome.values)}" if outcome.values else f" ({outcome.reason})" if outcome.reason else "")  # fmt: skip
        self._check_failures()

    def _outcome(self, trial, launched: tuple[CellResult | None, str | None]) -> st.Outcome:
        """The trial's outcome from its job's result; pruned when its job said so on the trial."""
        result, output_dir = launched
        pruned = st.PRUNED_AT in self.study._storage.get_trial(trial._trial_id).user_attrs
        return st.outcome_of(result, pruned, self.settings, output_dir)

    def _outcome_of_error(self, exc: BaseException) -> st.Outcome:
        if is_stop(exc):
            self._stop = self._stop or exc
            self._halted = True
            return st.Outcome("fail", reason=f"stopped ({type(exc).__name__})", retry=True)
        if type(exc).__name__ in WORKER_DIED:  # a worker killed (kill -9, out of memory) broke the pool under it
            return st.Outcome("fail", reason=f"its worker process died ({error_line(exc, limit=300)})", retry=True)
        return st.Outcome("fail", reason=f"its launch failed: {error_line(exc)}")

    def _finish(self, number: int, result: Callable[[], tuple[CellResult | None, str | None]]) -> None:
        """Tell the study how trial ``number`` ended: the outcome of ``result()`` (the launch's
        return), or of the error it raised (a stop is re-raised by :meth:`run`)."""
        try:
            outcome = self._outcome(self.running[number], result())
        except BaseException as exc:  # noqa: BLE001
            outcome = self._outcome_of_error(exc)
        self._tell(number, outcome)

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> PoolReport:
        self.sweep_dir.mkdir(parents=True, exist_ok=True)  # study.json first: how each trial's job, and a later
        st.StudyFile.of(self.settings).write(self.sweep_dir)  # launch settling this one's trials, know it is the study's
        heart = threading.Thread(target=self._heartbeats, name="foxhunt-trial-heartbeat", daemon=True)
        heart.start()
        try:
            if self.inline:
                self._run_inline()
            else:
                self._run_pool()
        finally:
            self._beating.set()
            self.report.write(self.sweep_dir)
        if self._stop is not None:
            raise self._stop
        return self.report

    def _next(self, free: int) -> list[tuple[Any, list[str]]]:
        """Up to ``free`` trials asked, as many as the study still wants: counted and asked as one
        step among the launches on the study (:func:`foxhunt.sweeps.study.study_lock`)."""
        with st.study_lock(self.settings.storage, self.settings.server):
            return [self._ask() for _ in range(min(free, self.wanted()))]

    def _run_inline(self) -> None:
        while asked := self._next(1):
            ((trial, overrides),) = asked
            self._finish(trial.number, lambda: self.launch(trial.number, overrides))

    def _run_pool(self) -> None:
        futures: dict[Future, int] = {}
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="foxhunt-trial") as pool:
            try:
                while True:
                    free = self.workers - len(futures)
                    if free > 0 and not (self.settings.barrier and futures):
                        for trial, overrides in self._next(free):
                            futures[pool.submit(self.launch, trial.number, overrides)] = trial.number
                    if not futures:
                        return
                    done, _ = wait(futures, return_when=FIRST_COMPLETED)
                    for future in done:
                        self._finish(futures.pop(future), future.result)
            except BaseException as exc:  # a stop in this process: no new trial; the running ones end and are told
                self._stop = self._stop or exc
                self._halted = True
                for future in list(futures):
                    self._finish(futures.pop(future), future.result)

    def _heartbeats(self) -> None:
        while not self._beating.wait(self.settings.heartbeat_s):
            st.beat(self.study, [t._trial_id for t in list(self.running.values())])


#: A launcher's errors for a worker process that died under a trial (not the trial's own error):
#: joblib's loky executor breaks for every trial running on it when one worker is killed, and the
#: standard process pool does the same; each such trial is failed and retried, like one whose sweep
#: process died (a kill -9 of one worker failed its neighbour for good before).
WORKER_DIED = frozenset({"TerminatedWorkerError", "BrokenProcessPool"})


def hydra_launch(launcher) -> Launch:
    """A :data:`Launch` through a Hydra launcher: one job, numbered with the trial's number (its
    ``hydra.job.num``); its ``cell.json`` read back from the job's folder."""

    def launch(number: int, overrides: list[str]) -> tuple[CellResult | None, str | None]:
        (ret,) = launcher.launch([overrides], initial_job_idx=number)
        output_dir = None
        if ret.hydra_cfg is not None:
            output_dir = str(ret.hydra_cfg.hydra.runtime.output_dir)
        if ret.status == JobStatus.FAILED:
            ret.return_value  # noqa: B018 (raises the job's error: the trial's failure)
        path = Path(output_dir) / CELL_RESULT_FILE if output_dir else None
        if path is None or not path.is_file():
            return None, output_dir
        try:
            return CellResult.read(path), output_dir
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("trial %d: %s is not a result", number, path, exc_info=True)
            return None, output_dir

    return launch


def run_search(config, launcher, sweep_dir: Path) -> PoolReport:
    """One launch of a search: open (or continue) its study, settle the trials a dead process
    left RUNNING, run the trials (the pool writes ``study.json`` first), write ``optimization_results.yaml``. A
    study whose records Optuna cannot read (edited or damaged: a value that is no JSON, a choice
    the distribution lacks, a number past a float, a row gone) is one line naming its database."""
    settings = st.settings_from(config)
    try:
        return _run_search(config, launcher, sweep_dir, settings)
    except (ValueError, KeyError, TypeError, OverflowError, LookupError) as exc:
        if not raised_in(exc).startswith(("optuna.", "sqlalchemy.", "json.")):
            raise
        raise st.StudyError(f"hydra.sweeper.storage={settings.storage}: study {settings.name} has records Optuna cannot read "
                            f"({one_line_error(exc, limit=300)}): repair it or name another study") from None  # fmt: skip


def _run_search(config, launcher, sweep_dir: Path, settings: st.StudySettings) -> PoolReport:
    fixed, searched = search_arguments(config)
    space = distributions(searched)
    study = st.open_study(settings)
    st.check_space(study, settings, space, (text.split("=", 1)[0].lstrip("+~") for text in fixed))
    tracking_uri = str(config.logger.tracking_uri) if config.logger.enabled else None  # what backs a dead job's result
    for line in st.settle_stale(study, settings, tracking_uri=tracking_uri):
        log.warning("%s", line)
    with st.study_lock(settings.storage, settings.server):
        for line in st.fail_enqueued_outside(study, space):
            log.warning("%s", line)
    workers, inline = worker_count(config, settings.n_jobs)
    before = st.trial_counts(study.get_trials(deepcopy=False))
    log.info("study %s in %s: %s so far; n_trials=%d; %d trial(s) at once; pruner %s", settings.name, settings.storage,
             before.describe(), settings.n_trials, workers, settings.pruner.name)  # fmt: skip
    pool = TrialPool(study, settings, space, fixed, hydra_launch(launcher), workers, inline, Path(sweep_dir),
                     sampler=config.hydra.sweeper.get("sampler"))  # fmt: skip
    try:
        report = pool.run()
    finally:
        write_results(study, settings, Path(sweep_dir))
    log.info("%s", report.describe())
    return report


def _sampler(node, earlier: int):
    """The configured sampler for the trial sampled after ``earlier`` others (retries, which
    sample nothing, not counted): a seeded one is seeded with ``seed + earlier``, so each trial's
    draw is a function of the seed and the study's history, not of the launch that asks it (a
    continued study would otherwise draw the first launch's trials again, and a launch seeded once
    drew other trials than an uninterrupted search)."""
    if node is None:
        return None
    seed = OmegaConf.select(node, "seed", default=None)
    if earlier and isinstance(seed, int) and not isinstance(seed, bool):
        return instantiate(node, seed=seed + earlier)
    return instantiate(node)


RESULTS_FILE = "optimization_results.yaml"  # in the sweep folder: the best trial, or the Pareto front


def write_results(study, settings: st.StudySettings, sweep_dir: Path) -> Path | None:
    """``optimization_results.yaml``: the study's name, counts, and its best trial's parameters
    and value, or its Pareto front (several objectives)."""
    trials = study.get_trials(deepcopy=False)
    counts = st.trial_counts(trials)
    data: dict[str, Any] = {"name": settings.name, "storage": settings.storage, "objectives": list(settings.objectives),
                            "directions": list(settings.directions), "trials": asdict(counts)}  # fmt: skip
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    if complete and not settings.multi_objective:
        best = study.best_trial
        data.update(best_trial=best.number, best_params=dict(best.params), best_value=float(best.value))
    elif complete:
        data["pareto_front"] = [{"trial": t.number, "params": dict(t.params), "values": [float(v) for v in t.values]}
                                for t in study.best_trials]  # fmt: skip
    path = Path(sweep_dir) / RESULTS_FILE
    try:
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    except OSError:
        log.warning("could not write %s", path, exc_info=True)
        return None
    return path


def _text(value: Any) -> str:
    return value_text(value)


def _record_objective(result: CellResult, objective: float, output_dir: str) -> None:
    """The value told to the study, in the trial's ``cell.json`` (``objective``: the first objective's)."""
    result.objective = objective
    try:
        result.write(Path(output_dir))
    except OSError:
        log.warning("could not record the objective in %s", output_dir, exc_info=True)
