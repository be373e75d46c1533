"""A search's study without Hydra jobs: the database, resume after a kill, the retry rule, the
pool that starts a trial when a worker frees, the pruning reporter, and the honest trial count.

Trials are launched by a stand-in for the Hydra launcher that writes each trial's ``cell.json``
as a job would; the study is a real Optuna 5 study in a SQLite file.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState

from foxhunt.runs.cell import CellKey, CellResult
from foxhunt.sweeps import study as st
from foxhunt.sweeps.pruning import TrialPruned, TrialReporter, current_trial
from foxhunt.sweeps.trials import TrialPool

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = {"model.module.lr": FloatDistribution(1e-5, 1e-2, log=True), "model.module.batch_size": CategoricalDistribution([32, 64])}
KEY = CellKey("dqn", "es", "fp32", "42", "h")
# This process under another creation time: a process that is gone (a pid can be reused).
DEAD = {"host": socket.gethostname(), "pid": os.getpid(), "created": 1.0}


def _settings(tmp_path: Path, **changes) -> st.StudySettings:
    base = st.StudySettings(name="dqn-es", storage=f"sqlite:///{tmp_path / 'optuna.db'}", objectives=("val/sharpe",),
                            directions=("maximize",), n_trials=6, n_jobs=1, max_failure_rate=1.0, max_retries=1,
                            pruner=st.PrunerSpec())  # fmt: skip
    return dataclasses.replace(base, **changes)


class Jobs:
    """Stands in for the launcher: each trial's job writes its cell.json in the sweep folder."""

    def __init__(self, sweep_dir: Path, outcomes=None, durations=None) -> None:
        self.sweep_dir, self.outcomes, self.durations = sweep_dir, list(outcomes or []), list(durations or [])
        self.launched: list[int] = []
        self.study = None

    def __call__(self, number: int, overrides: list[str]):
        self.launched.append(number)
        if self.durations:
            time.sleep(self.durations.pop(0))
        outcome = self.outcomes.pop(0) if self.outcomes else "complete"
        if outcome == "stop":
            raise KeyboardInterrupt
        folder = self.sweep_dir / f"dqn_es_fp32_trial{number}"
        lr = float(next(o for o in overrides if o.startswith("model.module.lr=")).split("=")[1])
        status = {"complete": "FINISHED", "pruned": "KILLED", "fail": "FAILED"}[outcome]
        result = CellResult(KEY, status, f"run{number}", "boom" if outcome == "fail" else None, trial=number, overrides=overrides,
                            metrics={"val/sharpe": lr * 1000} if outcome == "complete" else {})  # fmt: skip
        if outcome == "pruned":  # what the job's reporter records on the trial before it stops the fit
            trial_id = self.study._storage.get_trial_id_from_study_id_trial_number(self.study._study_id, number)
            self.study._storage.set_trial_user_attr(trial_id, st.PRUNED_AT, 1)
        result.write(folder)
        return result, str(folder)


def _pool(study, settings, jobs, sweep_dir, owner=None, workers=1, inline=True) -> TrialPool:
    jobs.study = study
    return TrialPool(study, settings, SPACE, ["trainer=smoke"], jobs, workers, inline, sweep_dir, owner=owner)


def _kill_with_running(study, sweep_dir: Path, count: int) -> list:
    """What a kill -9 leaves: ``count`` trials asked by the dead process, still RUNNING, and the
    study.json its launch wrote in its sweep folder first."""
    storage = study._storage._backend.url  # the RDB storage behind optuna's cache
    if not (sweep_dir / st.STUDY_FILE).is_file():
        sweep_dir.mkdir(parents=True, exist_ok=True)
        st.StudyFile(storage, study.study_name).write(sweep_dir)
    asked = []
    for _ in range(count):
        trial = study.ask(SPACE)
        st.claim(study, trial._trial_id, DEAD, sweep_dir)
        asked.append(trial)
    return asked


def test_a_search_killed_after_its_second_trial_resumes_to_exactly_its_n_trials(tmp_path):
    settings = _settings(tmp_path)
    first = tmp_path / "sweep1"
    study = st.open_study(settings)
    _pool(study, dataclasses.replace(settings, n_trials=2), Jobs(first), first, owner=DEAD).run()
    running = _kill_with_running(study, first, 2)  # trial 2's job had finished (cell.json), trial 3's had not
    Jobs(first)(running[0].number, [f"model.module.lr={running[0].params['model.module.lr']}"])

    second = tmp_path / "sweep2"
    resumed = st.open_study(settings)
    lines = st.settle_stale(resumed, settings)
    assert lines[0].startswith("trial 2: its sweep process") and lines[0].endswith("its job had ended: told COMPLETE")
    assert lines[1].endswith("FAILED, retried as trial 4")
    jobs = Jobs(second)
    _pool(resumed, settings, jobs, second).run()

    trials = resumed.get_trials()
    assert [t.number for t in trials] == sorted({t.number for t in trials})  # no trial number twice
    assert sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials) == 6
    assert [(t.number, t.state.name) for t in trials if t.state != TrialState.COMPLETE] == [(3, "FAIL")]
    assert jobs.launched == [4, 5, 6]  # the finished trial 2 was not run again; 3 was retried as 4
    assert trials[4].params == trials[3].params and trials[4].user_attrs[st.RETRY_OF] == 3
    assert "its sweep process" in trials[3].user_attrs[st.FAIL_REASON]
    assert optuna.get_all_study_names(settings.storage) == ["dqn-es"]
    assert st.trial_counts(trials) == st.TrialCounts(6, 0, 0)
    # once more: a complete study launches nothing
    again = Jobs(tmp_path / "sweep3")
    _pool(st.open_study(settings), settings, again, tmp_path / "sweep3").run()
    assert again.launched == []


def test_a_retry_that_dies_again_is_not_retried_twice(tmp_path):
    settings = _settings(tmp_path, n_trials=2)
    study = st.open_study(settings)
    (lost,) = _kill_with_running(study, tmp_path, 1)
    assert st.settle_stale(study, settings)[0].endswith("retried as trial 1")
    retry = study.ask(SPACE)  # the retry, asked by a process that dies too
    st.claim(study, retry._trial_id, DEAD, tmp_path)
    assert retry.params == lost.params
    assert st.settle_stale(study, settings)[0].endswith("(not retried: 1 retries along its chain)")
    counts = st.trial_counts(study.get_trials())
    assert counts == st.TrialCounts(0, 0, 1)  # the retried failure counts once, through its retry


def test_a_process_killed_between_the_retry_and_the_fail_retries_once(tmp_path):
    """kill -9 after the retry was enqueued and before the trial was told FAILED: the next launch
    settled it again and enqueued a second retry; both ran with the same parameters and counted
    twice (found by a helper probing searches)."""
    settings = _settings(tmp_path, n_trials=2)
    study = st.open_study(settings)
    (lost,) = _kill_with_running(study, tmp_path, 1)
    study.enqueue_trial(dict(lost.params), user_attrs={st.RETRY_OF: lost.number})  # what the killed process did
    assert st.settle_stale(study, settings)[0].endswith("retried as trial 1")
    jobs = Jobs(tmp_path / "sweep")
    _pool(study, settings, jobs, tmp_path / "sweep").run()
    trials = study.get_trials()
    assert [t.user_attrs.get(st.RETRY_OF) for t in trials] == [None, 0, None]  # one retry, then a new trial
    assert jobs.launched == [1, 2] and trials[2].params != lost.params


def test_a_running_trial_of_a_live_process_or_a_fresh_heartbeat_is_left_alone(tmp_path):
    settings = _settings(tmp_path, grace_s=60.0, heartbeat_s=5.0)
    study = st.open_study(settings)
    mine, elsewhere, silent = (study.ask(SPACE) for _ in range(3))
    st.claim(study, mine._trial_id, st.process_identity(), tmp_path)
    st.claim(study, elsewhere._trial_id, {"host": "other-host", "pid": 1, "created": 1.0}, tmp_path)
    st.claim(study, silent._trial_id, {"host": "other-host", "pid": 2, "created": 1.0}, tmp_path)
    study._storage.set_trial_system_attr(silent._trial_id, st.HEARTBEAT, time.time() - 120)
    assert [line.split(":")[0] for line in st.settle_stale(study, settings)] == ["trial 2"]  # the silent one only
    states = [t.state for t in study.get_trials()]
    assert states[:3] == [TrialState.RUNNING, TrialState.RUNNING, TrialState.FAIL]


def test_a_trial_asked_and_never_claimed_is_settled_after_the_grace(tmp_path):
    """A kill -9 between asking a trial and claiming it left it RUNNING with no owner for good
    (every summary listed it, and the sampler's constant liar counted it ever after): once older
    than grace_s it is failed and retried; one just asked is left to the process claiming it."""
    settings = _settings(tmp_path, grace_s=0.5)
    study = st.open_study(settings)
    orphan = study.ask(SPACE)
    time.sleep(0.6)
    fresh = study.ask(SPACE)
    (line,) = st.settle_stale(study, settings)
    assert line.startswith(f"trial {orphan.number}: never claimed by a sweep process") and "retried as trial" in line
    states = {t.number: t.state for t in study.get_trials()}
    assert states[orphan.number] == TrialState.FAIL and states[fresh.number] == TrialState.RUNNING


def test_a_trial_the_pruner_stopped_is_told_pruned_when_its_job_died_before_its_result(tmp_path):
    """The pruner had stopped the trial (pruned_at set) and the process died before cell.json and
    the tell: the trial was failed and retried, and the retry trained in full what the pruner had
    stopped. It is told PRUNED, and nothing is retried."""
    settings = _settings(tmp_path)
    study = st.open_study(settings)
    (trial,) = _kill_with_running(study, tmp_path, 1)
    trial.report(-0.3, 0)
    study._storage.set_trial_user_attr(trial._trial_id, st.PRUNED_AT, 0)
    (line,) = st.settle_stale(study, settings)
    assert line.endswith("told PRUNED"), line
    assert [t.state for t in study.get_trials()] == [TrialState.PRUNED]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    before=hst.lists(hst.sampled_from(["complete", "pruned", "fail"]), min_size=0, max_size=4),
    stale=hst.lists(hst.booleans(), min_size=0, max_size=2),
    after=hst.lists(hst.sampled_from(["complete", "pruned", "fail"]), min_size=8, max_size=8),
    n_trials=hst.integers(1, 6),
)
def test_resume_ends_with_n_trials_that_count_each_number_once(tmp_path_factory, before, stale, after, n_trials):
    """Whatever ended before the kill, and whichever stale trials had finished their job: the
    resumed search ends with exactly n_trials that count, each number once, in one study."""
    tmp_path = tmp_path_factory.mktemp("study")
    settings = _settings(tmp_path, n_trials=n_trials)
    study = st.open_study(settings)
    first = min(len(before), n_trials)
    if first:
        _pool(study, dataclasses.replace(settings, n_trials=first), Jobs(tmp_path, outcomes=before), tmp_path, owner=DEAD).run()
    for finished, trial in zip(stale, _kill_with_running(study, tmp_path, len(stale))):
        if finished:  # its job had written FINISHED before the kill
            Jobs(tmp_path)(trial.number, [f"model.module.lr={trial.params['model.module.lr']}"])
    resumed = st.open_study(settings)
    st.settle_stale(resumed, settings)
    settled = len(st.counted(resumed.get_trials()))
    jobs = Jobs(tmp_path, outcomes=after)
    _pool(resumed, settings, jobs, tmp_path).run()
    trials = resumed.get_trials()
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers)) and len(jobs.launched) == len(set(jobs.launched))
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert all(st.RETRY_OF in t.user_attrs for t in trials if t.state == TrialState.WAITING)  # retries the study had no room for
    assert len(st.counted(trials)) == max(n_trials, settled)
    assert all(
        t.state == TrialState.COMPLETE for t, finished in zip(trials[first:], stale) if finished
    )  # nothing finished is lost
    assert optuna.get_all_study_names(settings.storage) == ["dqn-es"]


def test_a_stop_fails_its_trial_for_a_retry_starts_nothing_more_and_is_raised(tmp_path):
    settings = _settings(tmp_path, n_trials=5)
    study = st.open_study(settings)
    jobs = Jobs(tmp_path, outcomes=["complete", "stop"])
    with pytest.raises(KeyboardInterrupt):
        _pool(study, settings, jobs, tmp_path).run()
    assert jobs.launched == [0, 1]
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "WAITING"]  # trial 2: the retry of 1, for the next launch
    assert trials[1].user_attrs[st.FAIL_REASON] == "stopped (KeyboardInterrupt)" and trials[2].user_attrs[st.RETRY_OF] == 1


def test_pruned_and_failed_trials_are_told_and_counted(tmp_path):
    settings = _settings(tmp_path, n_trials=4)
    study = st.open_study(settings)
    _pool(study, settings, Jobs(tmp_path, outcomes=["complete", "pruned", "fail", "complete"]), tmp_path).run()
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED", "FAIL", "COMPLETE"]
    assert trials[2].user_attrs[st.FAIL_REASON] == "boom" and trials[0].user_attrs[st.RUN_ID] == "run0"
    assert st.trial_counts(trials).describe() == "4 trials (2 finished, 1 pruned, 1 failed)"
    assert (tmp_path / "workers.json").is_file()


def test_a_free_worker_starts_the_next_trial_where_a_batch_waits_for_its_slowest(tmp_path):
    durations = [
        2.5,
        0.25,
        0.25,
        0.25,
        2.5,
        0.25,
        0.25,
        0.25,
    ]  # one slow trial in each pair; a short one far longer than a tell and an ask

    def run(barrier: bool, folder: str) -> tuple[int, float]:
        """(trials started while the first slow one ran, the idle share while trials waited)."""
        settings = _settings(tmp_path / folder, n_trials=len(durations), n_jobs=2, barrier=barrier)
        study = st.open_study(settings)
        report = _pool(
            study, settings, Jobs(tmp_path / folder, durations=list(durations)), tmp_path / folder, workers=2, inline=False
        ).run()
        spans = sorted(report.spans, key=lambda s: s.start_s)
        assert {s.slot for s in spans} == {0, 1} and all(s.end_s is not None for s in spans)
        slow = next(s for s in spans if s.end_s - s.start_s > 2.0)
        beside = sum(1 for s in spans if s is not slow and slow.start_s <= s.start_s < slow.end_s)
        return beside, report.figures()["idle_while_waiting_share"]

    (free, free_idle), (batch, batch_idle) = run(False, "free"), run(True, "batch")
    # counted, not timed (a loaded host stretches every ask and tell): the free worker runs the three
    # short trials and the next slow one beside the first slow trial; a batch waits for it after one
    assert free >= 3 and batch == 1, (free, batch)
    assert free_idle < batch_idle, (free_idle, batch_idle)


def _trainer(value: float, epoch: int, metric: str = "val/loss"):
    return SimpleNamespace(sanity_checking=False, state=SimpleNamespace(fn="fit"), callback_metrics={metric: torch.tensor(value)},
                           current_epoch=epoch, max_epochs=5, logger=None, loggers=[])  # fmt: skip


def test_the_reporter_reports_signed_to_the_study_and_stops_a_trial_the_pruner_prunes(tmp_path):
    settings = _settings(tmp_path, pruner=st.PrunerSpec("median", startup_trials=1, warmup_steps=0))
    study = st.open_study(settings)
    st.StudyFile.of(settings).write(tmp_path)
    good = study.ask(SPACE)
    for epoch, loss in enumerate([1.0, 0.8, 0.6]):
        good.report(-loss, epoch)  # a val/loss reported to a study that maximizes: negated
    study.tell(good, 1.0)
    study.ask(SPACE)
    assert current_trial(tmp_path / "nowhere", 1) is None  # no study.json: outside a search, nothing
    reporter = TrialReporter("val/loss", "min")
    reporter._trial, _ = current_trial(tmp_path, 1)
    reporter._sign = -1.0
    reporter.on_validation_end(_trainer(0.9, 0), None)  # -0.9 beats the median -1.0: goes on
    with pytest.raises(TrialPruned, match=r"^pruned by the study's pruner at validation 1: val/loss=0.95$"):
        reporter.on_validation_end(_trainer(0.95, 1), None)
    trial = study.get_trials()[1]
    assert trial.intermediate_values == pytest.approx({0: -0.9, 1: -0.95}) and trial.user_attrs[st.PRUNED_AT] == 1
    assert issubclass(TrialPruned, SystemExit) and not issubclass(TrialPruned, Exception)  # a run KILLED, not FAILED
    fold = TrialReporter("val/loss", "min", fold=2)
    assert fold.step(_trainer(0.1, 3)) == 2 * 5 + 3  # each fold's epochs after the earlier folds'


def test_a_walk_forward_trial_is_told_its_mean_across_folds(tmp_path):
    settings = _settings(tmp_path, walk_forward=True)
    result = CellResult(KEY, "FINISHED", metrics={"val/sharpe": 5.0, "val/sharpe_fold_mean": 1.5})
    assert st.outcome_of(result, False, settings).values == (1.5,)  # never the pooled figure
    assert (
        st.outcome_of(CellResult(KEY, "FINISHED", metrics={"val/sharpe": 5.0}), False, settings).reason
        == "val/sharpe_fold_mean is missing"
    )
    two = _settings(tmp_path, objectives=("val/sharpe", "val/max_drawdown"), directions=("maximize", "minimize"))
    outcome = st.outcome_of(CellResult(KEY, "SKIPPED", metrics={"val/sharpe": 2.0, "val/max_drawdown": 300.0}), False, two)
    assert (outcome.state, outcome.values) == ("complete", (2.0, 300.0))
    nan = st.outcome_of(CellResult(KEY, "FINISHED", metrics={"val/sharpe": float("nan")}), False, _settings(tmp_path))
    assert (nan.state, nan.reason) == ("fail", "val/sharpe is nan")


def test_every_trial_counts_in_the_deflated_sharpe_ratio():
    from foxhunt.evaluation.deflated import deflated_sharpe_ratio
    from foxhunt.runs.leaderboard import SEARCH_TRIALS_TAG, dsr_trial_count
    from foxhunt.runs.stored import Metric, StoredRun
    from foxhunt.sweeps.summary import deflated_sharpes

    srs = [0.05, 0.02, -0.01]
    alone = deflated_sharpe_ratio(0.05, srs, 2000, 0.0, 3.0)
    honest = deflated_sharpe_ratio(0.05, srs, 2000, 0.0, 3.0, n_trials=30)  # 27 pruned or failed trials too
    assert honest < alone and deflated_sharpe_ratio(0.05, srs, 2000, 0.0, 3.0, n_trials=3) == alone
    with pytest.raises(ValueError, match=r"n_trials=2: must be an integer >= 3"):
        deflated_sharpe_ratio(0.05, srs, 2000, 0.0, 3.0, n_trials=2)

    def run(name, sharpe, tags):
        return StoredRun(run_id=name, name=name, experiment="foxhunt", status="FINISHED", start_ms=0, end_ms=1,
                         tags={"model": "dqn", "asset": "es", "precision": "fp32", "seed": "42", **tags},
                         metrics={"val/sharpe_per_step": Metric(sharpe, None, None)})  # fmt: skip

    members = [run("grid", 0.01, {}), run("t0", 0.02, {"study": "dqn-es", SEARCH_TRIALS_TAG: "9"}),
               run("t3", 0.03, {"study": "dqn-es", SEARCH_TRIALS_TAG: "12"}), run("other", 0.0, {"study": "ppo-es", SEARCH_TRIALS_TAG: "4"})]  # fmt: skip
    assert dsr_trial_count(members, "val/sharpe_per_step") == 1 + 12 + 4
    results = [CellResult(KEY, "FINISHED", trial=n, metrics={"test/sharpe_per_step": s, "test/steps": 2000, "test/pnl_skew": 0.0,
                                                               "test/pnl_kurtosis": 3.0}) for n, s in enumerate(srs)]  # fmt: skip
    assert deflated_sharpes(results, 30)["dqn-es-fp32-trial0"] == pytest.approx(honest)


def test_a_database_of_other_tables_is_one_line_naming_it(tmp_path):
    """A study database with a table of optuna's name but not its columns: about 215 lines of
    SQLAlchemy and optuna tracebacks before (found probing the search)."""
    import sqlite3

    settings = _settings(tmp_path)
    with sqlite3.connect(tmp_path / "optuna.db") as db:
        db.execute("CREATE TABLE studies (x INTEGER)")
    with pytest.raises(st.StudyError) as refused:
        st.open_study(settings)
    line = str(refused.value)
    assert line.startswith(f"hydra.sweeper.storage={settings.storage}: ") and "\n" not in line, line


class TerminatedWorkerError(Exception):
    """Stands in for joblib's (loky's) error of a worker killed under a running trial."""


def test_a_trial_whose_worker_died_is_retried_not_failed_for_good(tmp_path):
    """kill -9 of one joblib worker broke the pool under every running trial: each was failed
    with 'its launch failed' and never retried (found probing the search). A worker's death is
    the process's, not the trial's: it is failed and retried."""
    settings = _settings(tmp_path, n_trials=2)
    study = st.open_study(settings)
    jobs = Jobs(tmp_path)
    died = []

    def launch(number: int, overrides: list[str]):
        if not died:
            died.append(number)
            raise TerminatedWorkerError("A worker process managed by the executor was unexpectedly terminated.")
        return jobs(number, overrides)

    jobs.study = study
    TrialPool(study, settings, SPACE, ["trainer=smoke"], launch, 1, True, tmp_path).run()
    trials = study.get_trials()
    assert trials[died[0]].state == TrialState.FAIL and "its worker process died" in trials[died[0]].user_attrs[st.FAIL_REASON]
    assert [t.user_attrs.get(st.RETRY_OF) for t in trials if t.state == TrialState.COMPLETE].count(died[0]) == 1
    assert len(st.counted(trials)) == 2 and st.trial_counts(trials).finished == 2


def test_a_search_counts_the_trials_another_search_runs_on_the_same_study(tmp_path):
    """Two searches of n_trials=4 on one study ended with 5 (and 2 gave 3): each subtracted only
    its own running trials (found probing the search). Another live search's RUNNING trial
    counts towards n_trials."""
    settings = _settings(tmp_path, n_trials=3)
    study = st.open_study(settings)
    other = study.ask(SPACE)  # the other search's trial, running in a live process
    st.claim(study, other._trial_id, st.process_identity(), tmp_path)
    jobs = Jobs(tmp_path)
    _pool(study, settings, jobs, tmp_path).run()
    assert len(jobs.launched) == 2  # 3 - the one the other search runs
    study.tell(other.number, [0.5])
    assert len(st.counted(study.get_trials())) == 3


def test_two_searches_racing_for_the_last_trial_start_one(tmp_path):
    """Two launches on one study, each counting what it wants and then asking (slowed here
    between the two, as a busy host does): both took the last slot and the study ended with
    n_trials + 1 (a race the last note left). Counting and asking are one step per study
    database: the second launch counts the first's trial and asks for none."""
    settings = _settings(tmp_path, n_trials=1)

    class Slow(TrialPool):
        def wanted(self) -> int:
            count = super().wanted()
            time.sleep(0.5)
            return count

    launched: list[list[int]] = []

    st.open_study(settings)

    def search(name: str) -> None:
        study = st.open_study(settings)  # each launch its own connection, as two processes
        jobs = Jobs(tmp_path / name)
        jobs.study = study
        Slow(study, settings, SPACE, ["trainer=smoke"], jobs, 1, True, tmp_path / name).run()
        launched.append(jobs.launched)

    threads = [threading.Thread(target=search, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(len(numbers) for numbers in launched) == [0, 1]
    assert len(st.open_study(settings).get_trials()) == 1


def test_launches_opening_a_fresh_study_database_at_once_all_open_it(tmp_path):
    """Two searches started together on a fresh optuna.db: the second failed with 'cannot open
    the study's database: IntegrityError ... alembic_version' (both made its tables; found by
    the race test above). The first makes them, the others wait and open the study."""
    for round in range(3):
        settings = _settings(tmp_path / str(round))
        errors: list[BaseException] = []
        opened: list[int] = []

        def launch() -> None:
            try:
                opened.append(st.open_study(settings)._study_id)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=launch) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors and len(set(opened)) == 1 and len(opened) == 4


def test_a_search_stopped_and_launched_again_draws_the_trials_of_one_never_stopped(tmp_path):
    """Each trial is drawn by the sampler seeded with the seed and the trials sampled before it,
    whichever launch asks it: a second launch's sampler was seeded once, with seed + the trials the
    study held, and drew other trials than the search never stopped (found by a helper: another
    best trial after a kill)."""
    sampler = OmegaConf.create({"_target_": "optuna.samplers.TPESampler", "seed": 7, "n_startup_trials": 2})

    def search(root: Path, launches: list[int]) -> list[dict]:
        settings = _settings(root)
        for n, count in enumerate(launches):
            sweep = root / f"sweep{n}"
            pool = TrialPool(st.open_study(settings), dataclasses.replace(settings, n_trials=count), SPACE, ["trainer=smoke"],
                             Jobs(sweep), 1, True, sweep, sampler=sampler)  # fmt: skip
            pool.launch.study = pool.study
            pool.run()
        return [t.params for t in st.open_study(settings).get_trials()]

    whole = search(tmp_path / "whole", [5])
    assert search(tmp_path / "stopped", [2, 5]) == whole
    assert search(tmp_path / "twice", [1, 3, 5]) == whole
    assert len({t["model.module.lr"] for t in whole}) == 5


def test_a_run_another_study_finished_is_reused_not_retagged(tmp_path):
    """resume=true found a FINISHED run of the same config in another study and the summary tagged
    it with this study and this study's trial count (found by a helper): that study's records
    changed. Only this study's own runs are tagged."""
    from foxhunt.runs.store import RunStore
    from foxhunt.runs.tags import Tag
    from foxhunt.sweeps.callback import SweepCallback

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = RunStore(uri)
    experiment = store.ensure_experiment("foxhunt")
    theirs = store.create(experiment, "dqn-es-fp32-trial0", {Tag.STUDY: "pp3", "search.trials": "3"})
    mine = store.create(experiment, "dqn-es-fp32-trial1", {})
    results = [CellResult(KEY, "SKIPPED", theirs, trial=0), CellResult(KEY, "FINISHED", mine, trial=1)]
    view = SimpleNamespace(settings=SimpleNamespace(name="x1"), results=results, cells={0: "dqn-es-fp32-42", 1: "dqn-es-fp32-42"})
    SweepCallback._tag_trial_runs(OmegaConf.create({"logger": {"tracking_uri": uri}}), view)
    assert (store.get(theirs).tags[Tag.STUDY], store.get(theirs).tags["search.trials"]) == ("pp3", "3")
    assert (store.get(mine).tags[Tag.STUDY], store.get(mine).tags["search.trials"]) == ("x1", "2")


def test_a_study_of_another_search_is_refused_in_one_line(tmp_path):
    """A PPO search given a DQN study's name ran its trials into it, and a trial of other
    parameters became the study's best (found by a helper)."""
    settings = _settings(tmp_path, n_trials=1)
    study = st.open_study(settings)
    jobs = Jobs(tmp_path / "sweep")
    _pool(study, settings, jobs, tmp_path / "sweep").run()
    st.check_space(study, settings, SPACE)  # its own search continues
    st.check_space(study, settings, {**SPACE, "model.module.gamma": FloatDistribution(0.9, 0.999)})  # one more key searched
    st.check_space(study, settings, {"model.module.lr": SPACE["model.module.lr"]}, fixed=["model.module.batch_size"])
    ppo = {"model.module.clip_ratio": FloatDistribution(0.1, 0.3)}
    with pytest.raises(st.StudyError, match=r"^hydra.sweeper.study_name=dqn-es: the study in sqlite:///.* holds trials of another "
                                            r"search \(parameters model.module.batch_size, model.module.lr are not searched here"):  # fmt: skip
        st.check_space(study, settings, ppo)
    with pytest.raises(st.StudyError, match=r"searched model.module.batch_size as CategoricalDistribution"):
        st.check_space(study, settings, {**SPACE, "model.module.batch_size": FloatDistribution(1, 2)})


def test_a_folder_the_study_names_is_read_only_when_it_is_the_studys(tmp_path):
    """An edited record named '/' as a stale trial's sweep folder: the search scanned the whole file
    system and told a stray cell.json's metrics to the study (found by a helper). A folder is read
    only when its study.json names this study and its database."""
    settings = _settings(tmp_path, n_trials=1)
    study = st.open_study(settings)
    (trial,) = _kill_with_running(study, tmp_path / "ours", 1)
    stray = tmp_path / "elsewhere"
    Jobs(stray)(trial.number, [f"model.module.lr={trial.params['model.module.lr']}"])  # a cell.json of that number
    study._storage.set_trial_system_attr(trial._trial_id, st.SWEEP_DIR, str(stray))
    study._storage.set_trial_user_attr(trial._trial_id, st.OUTPUT_DIR, str(next(stray.iterdir())))
    (line,) = st.settle_stale(study, settings)
    assert "FAILED, retried as trial 1" in line  # not "its job had ended: told COMPLETE"
    assert not st.is_study_folder(stray, settings) and st.is_study_folder(tmp_path / "ours", settings)
    assert not st.is_study_folder(tmp_path / "ours", dataclasses.replace(settings, name="other"))


def test_a_dead_jobs_result_is_told_only_as_its_run_in_the_store_backs_it(tmp_path):
    """A cell.json planted in a dead search's sweep folder (trial 0: FINISHED, val/sharpe 999) was
    told COMPLETE and became the best trial (found by a helper probing the job CLI). Told only when
    its run is in the store, FINISHED, the trial's, with the value; else failed and retried."""
    from foxhunt.runs.store import RunStore
    from foxhunt.runs.tags import Tag

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = RunStore(uri)
    experiment = store.ensure_experiment("foxhunt", str(tmp_path / "artifacts"))
    settings = _settings(tmp_path)
    study = st.open_study(settings)
    honest, planted = _kill_with_running(study, tmp_path, 2)
    for trial, told in ((honest, 1.5), (planted, 999.0)):
        run_id = store.create(experiment, f"dqn-es-fp32-trial{trial.number}", {Tag.TRIAL: str(trial.number)})
        store.log_metrics(run_id, {"val/sharpe": 1.5}, step=0)
        store.end(run_id, "FINISHED")
        CellResult(KEY, "FINISHED", run_id, trial=trial.number, metrics={"val/sharpe": told}).write(
            tmp_path / f"dqn_es_fp32_trial{trial.number}"
        )
    lines = st.settle_stale(study, settings, tracking_uri=uri)
    assert lines[0].endswith("its job had ended: told COMPLETE")
    assert "its cell.json is not what the store holds (its run " in lines[1] and "val/sharpe=1.5, its cell.json 999.0" in lines[1]
    assert lines[1].endswith("FAILED, retried as trial 2")
    states = {t.number: (t.state, t.value) for t in study.get_trials()}
    assert states[honest.number] == (TrialState.COMPLETE, 1.5) and states[planted.number][0] == TrialState.FAIL


def test_a_trial_enqueued_outside_the_space_is_failed_with_its_reason_not_trained(tmp_path):
    """A trial enqueued with lr=5.0 where the search takes [1e-4, 0.1]: Optuna only warned, and
    it trained on 5.0 (found by a helper probing searches). It fails before it is asked."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    from foxhunt.sweeps.study import FAIL_REASON, fail_enqueued_outside

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="s")
    study.enqueue_trial({"lr": 5.0, "width": 64})
    study.enqueue_trial({"lr": 0.01, "width": 64})
    study.enqueue_trial({"lr": 0.01, "width": 7})
    space = {"lr": FloatDistribution(1e-4, 0.1, log=True), "width": CategoricalDistribution([32, 64])}
    lines = fail_enqueued_outside(study, space)
    assert [line.split(":")[0] for line in lines] == ["trial 0", "trial 2"] and "lr=5.0 outside" in lines[0]
    states = [(t.state.name, t.user_attrs.get(FAIL_REASON, "")[:12]) for t in study.get_trials()]
    assert states == [("FAIL", "enqueued wit"), ("WAITING", ""), ("FAIL", "enqueued wit")]


@pytest.mark.parametrize(
    ("heartbeat", "stale"),
    [(1_000.0, False), (1_000.0 - 120, True), (1e18, True), (float("nan"), True), (float("inf"), True), (True, True)],
    ids=["fresh", "old", "far future", "nan", "inf", "bool"],
)  # fmt: skip
def test_a_heartbeat_is_trusted_only_near_this_clock(heartbeat, stale):
    """A trial of another host (its owner's liveness unknown here) is judged by its heartbeat: one
    edited to 1e18 or NaN was never stale, and the dead trial stayed RUNNING for good (found by a
    helper probing searches)."""
    from types import SimpleNamespace

    from foxhunt.sweeps.study import HEARTBEAT, OWNER, is_stale

    trial = SimpleNamespace(system_attrs={OWNER: {"host": "elsewhere"}, HEARTBEAT: heartbeat}, datetime_start=None)
    assert is_stale(trial, 60.0, alive=lambda owner: None, now=1_000.0) is stale
