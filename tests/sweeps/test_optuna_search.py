"""``foxhunt-train -m hparams_search=dqn_optuna``: foxhunt's Optuna sweeper through foxhunt's sweep.

Real searches rooted in a tmp folder (``FOXHUNT_ROOT``), in the test's process (a subprocess where
a search is killed), with smoke-sized DQN trials on a week of synthetic bars: the trials are nested runs of the sweep's parent run, in
folders of their own, and the best one is printed and tagged; the same command again continues
the study in ``mlruns/optuna.db``; a failed trial is recorded and the study goes on; a study
whose every trial failed still ends its parent run.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from sweep_helpers import SMOKE, WEEK, foxhunt_train, foxhunt_train_here, runs, six_e_csv, store, sweep_dirs

from foxhunt.runs.cell import read_results
from foxhunt.training.cell import OBJECTIVE

SEARCH = ["hparams_search=dqn_optuna", *SMOKE]


def test_a_two_trial_search_nests_its_trials_and_names_the_best(tmp_path, monkeypatch, capfd, check):
    result = foxhunt_train_here(monkeypatch, capfd, [*SEARCH, "hydra.sweeper.n_trials=2", *WEEK], tmp_path)
    check(result)
    (sweep,) = sweep_dirs(tmp_path)
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["dqn_es_fp32_trial0", "dqn_es_fp32_trial1"]
    (parent,), trials = runs(tmp_path)
    assert sorted(t.info.run_name for t in trials) == ["dqn-es-fp32-trial0", "dqn-es-fp32-trial1"]
    for trial in trials:
        assert trial.info.status == "FINISHED" and trial.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert trial.data.tags["trial"] == trial.info.run_name[-1]
    # each trial's result (cell.json) holds the value its job returned to the sweeper: the run's objective
    cell_results = {r.cell: r for r in read_results(sweep)}
    by_name = {t.info.run_name: t for t in trials}
    for name, cell_result in cell_results.items():
        assert cell_result.objective == by_name[name].data.metrics[OBJECTIVE]
        assert any(o.startswith("model.module.lr=") for o in cell_result.overrides)
    assert cell_results["dqn-es-fp32-trial0"].overrides != cell_results["dqn-es-fp32-trial1"].overrides

    best = max(trials, key=lambda t: t.data.metrics[OBJECTIVE])  # equal values: the first trial, as Optuna
    if trials[0].data.metrics[OBJECTIVE] == trials[1].data.metrics[OBJECTIVE]:
        best = by_name["dqn-es-fp32-trial0"]
    tags = parent.data.tags
    assert parent.info.status == "FINISHED" and tags["study"] == "dqn-es"
    assert tags["best_trial"] == best.info.run_name and tags["best_trial.run_id"] == best.info.run_id
    assert float(tags["best_trial.value"]) == best.data.metrics[OBJECTIVE] == parent.data.metrics["sweep/best_value"]
    overrides = tags["best_trial.overrides"].split()
    assert [o.split("=")[0] for o in overrides][:2] == ["model.module.lr", "model.module.hidden_sizes"]
    assert all(o in cell_results[best.info.run_name].overrides for o in overrides)
    assert not any(o.startswith(("trainer=", "hparams_search=")) for o in overrides)  # only the searched keys

    tail = result.stdout[result.stdout.index(f"sweep {sweep.name}: 2 trials") :]
    assert f"best trial: {best.info.run_name} (maximize: {best.data.metrics[OBJECTIVE]:.6g}), run {best.info.run_id}" in tail
    assert f"  overrides: {tags['best_trial.overrides']}" in tail
    artifacts = {a.path for a in store(tmp_path).list_artifacts(parent.info.run_id)}
    assert {"summary.md", "summary.png", "optimization_results.yaml"} <= artifacts
    assert {t.data.tags["study"] for t in trials} == {"dqn-es"} and {t.data.tags["search.trials"] for t in trials} == {"2"}

    # the same command with a larger study continues it: one more trial, numbered after the others
    again = foxhunt_train_here(monkeypatch, capfd, [*SEARCH, "hydra.sweeper.n_trials=3", *WEEK], tmp_path)
    check(again)
    study = optuna.load_study(study_name="dqn-es", storage=f"sqlite:///{tmp_path / 'mlruns' / 'optuna.db'}")
    assert [(t.number, t.state.name) for t in study.trials] == [(0, "COMPLETE"), (1, "COMPLETE"), (2, "COMPLETE")]
    assert optuna.get_all_study_names(f"sqlite:///{tmp_path / 'mlruns' / 'optuna.db'}") == ["dqn-es"]
    assert study.trials[2].params != study.trials[0].params  # the continued sampler does not draw the first launch again
    newest = sweep_dirs(tmp_path)[-1]
    assert sorted(p.name for p in newest.iterdir() if p.is_dir()) == ["dqn_es_fp32_trial2"]
    assert "sweep " + newest.name + ": 3 trials" in again.stdout  # the summary lists the whole study
    assert "study dqn-es (sqlite:///" in again.stdout and "3 trials (3 finished, 0 pruned, 0 failed)" in again.stdout


def test_failed_trials_are_recorded_and_the_study_goes_on(tmp_path, monkeypatch, capfd, check):
    # 6E prices are off the ES tick grid: a trial the sampler sends to es fails inside its run.
    csv = six_e_csv(tmp_path / "6e.csv")
    data = ["data=csv", f"data.source.path={csv}", "data.source.bar_label=start", "asset=6e,es"]
    # seed=51 seeds the sampler too (seed + the trials sampled before, per trial): its first trial goes to es,
    # the next two to 6e (optuna 5.1)
    result = foxhunt_train_here(monkeypatch, capfd, [*SEARCH, "hydra.sweeper.n_trials=3", "seed=51", *data], tmp_path)
    check(result, 1)  # a failed trial fails the sweep, after the study
    cell_results = read_results(sweep_dirs(tmp_path)[0])
    assert [r.trial for r in cell_results] == [0, 1, 2]  # every trial ran
    by_asset = {asset: [r for r in cell_results if r.key.asset == asset] for asset in ("6e", "es")}
    assert [r.trial for r in by_asset["es"]] == [0] and [r.trial for r in by_asset["6e"]] == [1, 2]
    assert all(r.status == "FAILED" and "data error: " in r.error and r.objective is None for r in by_asset["es"])
    assert all(r.status == "FINISHED" and math.isfinite(r.objective) for r in by_asset["6e"])
    (parent,), trials = runs(tmp_path)
    assert {t.info.run_name: t.info.status for t in trials} == {r.cell: r.status for r in cell_results}
    assert all(t.data.tags["mlflow.parentRunId"] == parent.info.run_id for t in trials)
    assert {t.data.tags.get("study") for t in trials} == {"dqn-es"}  # the failed trial's run too
    best = max(by_asset["6e"], key=lambda r: r.objective)
    assert parent.info.status == "FAILED" and parent.data.tags["best_trial"] in {r.cell for r in by_asset["6e"]}
    assert float(parent.data.tags["best_trial.value"]) == best.objective
    study = optuna.load_study(study_name="dqn-es", storage=f"sqlite:///{tmp_path / 'mlruns' / 'optuna.db'}")
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE", "COMPLETE"]  # told FAIL
    assert "data error: " in study.trials[0].user_attrs["fail_reason"]
    failed = ", ".join(r.cell for r in by_asset["es"])
    assert parent.data.tags["failed_cells"] == failed
    assert result.stderr.strip().splitlines()[-1].startswith(f"foxhunt-train: {len(by_asset['es'])} of 3 trials failed: ")


def test_a_study_whose_every_trial_failed_still_ends_its_parent_run(tmp_path, monkeypatch, capfd, check):
    # a fixed batch size larger than any replay buffer searched: every trial fails its config check
    args = [*SEARCH, "hydra.sweeper.n_trials=2", "model.module.batch_size=200000", *WEEK]
    result = foxhunt_train_here(monkeypatch, capfd, args, tmp_path)
    check(result, 1)
    cell_results = read_results(sweep_dirs(tmp_path)[0])
    assert [(r.trial, r.status) for r in cell_results] == [(0, "FAILED"), (1, "FAILED")]
    assert "model.module.batch_size=200000" in cell_results[0].error
    (parent,), trials = runs(tmp_path)
    assert trials == []  # a config error stops a trial before its run
    assert parent.info.status == "FAILED" and "best_trial" not in parent.data.tags
    assert parent.data.tags["failed_cells"] == "dqn-es-fp32-trial0, dqn-es-fp32-trial1"
    assert "best trial: none of 2 trials returned a finite value" in result.stdout
    assert result.stderr.strip().splitlines()[-1].startswith("foxhunt-train: 2 of 2 trials failed: dqn-es-fp32-trial0")


PRUNING = ["hydra.sweeper.pruner=median", "hydra.sweeper.pruning.startup_trials=1", "hydra.sweeper.pruning.warmup_steps=0",
           "trainer.max_epochs=4", "trainer.limit_train_batches=10", "model.module.min_replay_size=100"]  # fmt: skip


def test_a_pruner_stops_trials_whose_validation_falls_behind_and_their_runs_end_killed(tmp_path, monkeypatch, capfd, check):
    # four epochs of 40 agent steps, learning from the 25th: the trials' val/mean_reward part ways
    result = foxhunt_train_here(monkeypatch, capfd, [*SEARCH, "hydra.sweeper.n_trials=5", *PRUNING, *WEEK], tmp_path)
    check(result)  # pruned trials are no failures
    study = optuna.load_study(study_name="dqn-es", storage=f"sqlite:///{tmp_path / 'mlruns' / 'optuna.db'}")
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    assert pruned and len(study.trials) == 5 and all(t.state.name in ("COMPLETE", "PRUNED") for t in study.trials)
    for trial in study.trials:  # the monitored metric, reported at each validation
        expected = 4 if trial.state.name == "COMPLETE" else trial.user_attrs["pruned_at"] + 1
        assert sorted(trial.intermediate_values) == list(range(expected))
    (parent,), runs_ = runs(tmp_path)
    by_trial = {int(r.data.tags["trial"]): r for r in runs_}
    for trial in pruned:
        run = by_trial[trial.number]
        assert run.info.status == "KILLED" and run.data.tags["stop_reason"] == "TrialPruned"
        assert run.data.tags["study"] == "dqn-es"  # a study's runs name it, pruned ones too: `runs` filters on it
        assert run.data.tags["pruned"].startswith(f"validation {trial.user_attrs['pruned_at']}: val/mean_reward=")
        assert f"dqn-es-fp32-trial{trial.number}  PRUNED" in result.stdout
    assert parent.info.status == "FINISHED" and parent.data.metrics["sweep/trials_pruned"] == len(pruned)
    assert f"5 trials ({5 - len(pruned)} finished, {len(pruned)} pruned, 0 failed)" in result.stdout


@pytest.mark.slow
def test_trials_run_two_at_once_without_a_barrier_and_several_objectives_have_a_pareto_front(tmp_path, check):
    objectives = ["hydra.sweeper.objectives=[val/sharpe,val/max_drawdown]", "hydra.sweeper.direction=[maximize,minimize]"]
    parallel = ["strategy=parallel", "hydra.sweeper.n_jobs=2", "strategy.predict_memory=false"]
    result = foxhunt_train([*SEARCH, "hydra.sweeper.n_trials=3", *parallel, *objectives, *WEEK], tmp_path)
    check(result)
    (sweep,) = sweep_dirs(tmp_path)
    workers = json.loads((sweep / "workers.json").read_text())
    assert workers["workers"] == 2 and workers["barrier"] is False and len(workers["trials"]) == 3
    first, second = sorted(workers["trials"], key=lambda s: s["start_s"])[:2]
    assert second["start_s"] < first["end_s"] and {first["slot"], second["slot"]} == {0, 1}  # two at once
    study = optuna.load_study(study_name="dqn-es", storage=f"sqlite:///{tmp_path / 'mlruns' / 'optuna.db'}")
    assert [len(t.values) for t in study.trials] == [2, 2, 2]
    front = sorted(t.number for t in study.best_trials)
    assert "Pareto front of val/sharpe (maximize), val/max_drawdown (minimize): " in result.stdout
    (parent,), trials = runs(tmp_path)
    assert parent.data.tags["best_trial"] == ", ".join(f"dqn-es-fp32-trial{n}" for n in front)
    for trial in study.trials:  # each trial's values are its run's validation figures
        run = next(r for r in trials if r.data.tags["trial"] == str(trial.number))
        assert trial.values == [run.data.metrics["val/sharpe"], run.data.metrics["val/max_drawdown"]]


@pytest.mark.slow
def test_a_search_killed_with_9_after_its_second_finished_trial_resumes_to_exactly_six(tmp_path, check):
    storage = tmp_path / "mlruns" / "optuna.db"
    args = [*SEARCH, "hydra.sweeper.n_trials=6", *WEEK]
    env = {**os.environ, "FOXHUNT_ROOT": str(tmp_path), "HYDRA_FULL_ERROR": "1"}
    command = [str(Path(sys.executable).parent / "foxhunt-train"), "-m", *args]
    process = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 180
        while _complete(storage) < 2:
            assert process.poll() is None and time.monotonic() < deadline, "the search ended before its second trial"
            time.sleep(0.2)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    killed_at = _complete(storage)
    resumed = foxhunt_train([*args, "resume=true"], tmp_path)
    check(resumed)
    study = optuna.load_study(study_name="dqn-es", storage=f"sqlite:///{storage}")
    numbers = [t.number for t in study.trials]
    assert len(numbers) == len(set(numbers)) and optuna.get_all_study_names(f"sqlite:///{storage}") == ["dqn-es"]
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in study.trials) == 6 and killed_at >= 2
    for trial in study.trials:
        if trial.state.name == "FAIL":  # the trial the kill left running: failed, retried with its parameters
            assert "its sweep process" in trial.user_attrs["fail_reason"]
            assert any(t.user_attrs.get("retry_of") == trial.number and t.params == trial.params for t in study.trials)
    assert "study dqn-es (sqlite:///" in resumed.stdout


def _complete(storage: Path) -> int:
    import sqlite3

    if not storage.is_file():
        return 0
    try:
        with sqlite3.connect(storage, timeout=5) as db:
            return db.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
    except sqlite3.Error:  # tables not made yet
        return 0


def test_a_study_database_that_cannot_be_opened_is_one_line(tmp_path, check):
    """Its line was followed by a second, "0 of 0 trials failed: none recorded" (found by a helper)."""
    bad = tmp_path / "bad.db"
    bad.write_text("not a database")
    env = {**os.environ, "FOXHUNT_ROOT": str(tmp_path)}  # a process of its own: the second line came from its exit handler
    command = [str(Path(sys.executable).parent / "foxhunt-train"), "-m", *SEARCH, "hydra.sweeper.n_trials=1",
               f"hydra.sweeper.storage=sqlite:///{bad}"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    check(result, 2)
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("foxhunt-train:")]
    assert line.startswith(
        f"foxhunt-train: store error: hydra.sweeper.storage=sqlite:///{bad}: cannot open the study's database: "
    )
