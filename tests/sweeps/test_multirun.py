"""``foxhunt-train -m``: strategies, grouping in MLflow, summary, failure isolation, resume.

Each test runs real sweeps rooted in its own tmp folder (``FOXHUNT_ROOT``), in a subprocess, or in
the test's process where no process boundary is checked (a resume, a failing cell), with smoke-sized cells of the two agents (a TFT smoke cell takes ~25 s on a CPU core).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from sweep_helpers import SMOKE, WEEK, foxhunt_train, foxhunt_train_here, runs, six_e_csv, store, sweep_dirs

from foxhunt.runs.cell import read_results
from foxhunt.sweeps.resources import available_cores

TWO_AGENTS = ["preset=grid", "model=dqn,ppo", "asset=es", *SMOKE, *WEEK]


@pytest.fixture(scope="module")
def sequential(tmp_path_factory):
    root = tmp_path_factory.mktemp("sequential")
    return root, foxhunt_train(TWO_AGENTS, root)


def test_sequential_sweep_groups_its_cells_under_a_parent_run_with_a_summary(sequential, check):
    root, result = sequential
    check(result)
    (sweep,) = sweep_dirs(root)
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["dqn_es_fp32_0", "ppo_es_fp32_1"]
    parents, cells = runs(root)
    (parent,) = parents
    assert parent.info.status == "FINISHED" and parent.data.tags["strategy"] == "sequential"
    # started by hand, not by foxhunt train start: still the process tags the job commands check
    assert parent.data.tags["host"] == socket.gethostname() and parent.data.tags["pid"].isdigit()
    assert parent.data.metrics["sweep/cells"] == 2 and parent.data.metrics["sweep/cells_failed"] == 0
    assert sorted(c.info.run_name for c in cells) == ["dqn-es-fp32", "ppo-es-fp32"]
    for cell in cells:
        assert cell.info.status == "FINISHED"
        assert cell.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert cell.data.tags["sweep_id"] == sweep.name
    artifacts = {a.path for a in store(root).list_artifacts(parent.info.run_id)}
    assert {"summary.md", "summary.png"} <= artifacts
    table = result.stdout[result.stdout.index(f"sweep {sweep.name}: 2 cells") :]
    for cell in cells:
        line = next(line for line in table.splitlines() if line.startswith(cell.info.run_name))
        assert line.split()[1:3] == ["FINISHED", f"{cell.data.metrics['test/sharpe']:.3f}"]
    markdown = (sweep / "summary.md").read_text()
    assert "| model | es |" in markdown and "2 of 2 cells ok" in markdown


def test_resume_skips_finished_cells_and_resumes_a_killed_one_into_its_own_run(sequential, monkeypatch, capfd, check):
    root, first = sequential
    check(first)
    parents, cells = runs(root)
    by_name = {c.info.run_name: c for c in cells}
    killed = by_name["ppo-es-fp32"].info.run_id
    store(root).set_terminated(killed, "KILLED")  # as if stopped after its last checkpoint

    result = foxhunt_train_here(monkeypatch, capfd, [*TWO_AGENTS, "resume=true"], root)
    check(result)
    parents_after, cells_after = runs(root)
    assert [p.info.run_id for p in parents_after] == [parents[0].info.run_id]  # the sweep's parent reopened
    assert parents_after[0].info.status == "FINISHED"
    history = store(root).get_metric_history(parents[0].info.run_id, "sweep/cells")
    assert sorted(m.step for m in history) == [0, 1]  # the resumed sweep's summary at a step of its own
    assert sorted(c.info.run_id for c in cells_after) == sorted(c.info.run_id for c in cells)  # no new run
    resumed = store(root).get_run(killed)
    assert resumed.info.status == "FINISHED" and resumed.data.tags["resume_count"] == "1"
    dqn = store(root).get_run(by_name["dqn-es-fp32"].info.run_id)
    assert dqn.info.end_time == by_name["dqn-es-fp32"].info.end_time and "resume_count" not in dqn.data.tags
    cell_results = {r.cell: r for r in read_results(sweep_dirs(root)[-1])}
    assert cell_results["dqn-es-fp32"].status == "SKIPPED"
    assert cell_results["dqn-es-fp32"].metrics["test/sharpe"] == by_name["dqn-es-fp32"].data.metrics["test/sharpe"]
    assert cell_results["ppo-es-fp32"].status == "FINISHED"
    assert cell_results["ppo-es-fp32"].note == f"resumed KILLED run {killed} from last.ckpt"


def test_parallel_sweep_packs_by_memory_and_fails_a_cell_over_budget_before_training(tmp_path, check):
    # Fallback estimates (no earlier run, no prediction): dqn 150 MB, tft 500 MB (their
    # model.memory_target_mb). 320 MB available: both dqn cells fit together, a tft cell never.
    budget = ["budget.total_mb=320", "budget.headroom_mb=0", "strategy.predict_memory=false"]
    result = foxhunt_train(
        ["model=dqn,tft", "asset=es,nq", "precision=fp32", "strategy=parallel", *budget, *SMOKE, *WEEK], tmp_path
    )
    check(result, 1)
    n_jobs = min(2, available_cores())
    assert f"packing: 4 cells, n_jobs={n_jobs} (cores: {available_cores()})" in result.stdout
    assert "over the budget alone, will fail: tft-es-fp32, tft-nq-fp32" in result.stdout
    (sweep,) = sweep_dirs(tmp_path)
    plan = json.loads((sweep / "packing.json").read_text())
    assert plan["threads_per_job"] == max(1, available_cores() // n_jobs)
    assert plan["estimates"]["2"] == {"cell": "tft-es-fp32", "mb": 500.0, "source": plan["estimates"]["2"]["source"]}  # job 2

    parents, cells = runs(tmp_path)
    (parent,) = parents
    assert parent.info.status == "FAILED" and parent.data.tags["failed_cells"] == "tft-es-fp32, tft-nq-fp32"
    status = {c.info.run_name: c for c in cells}
    assert {name: c.info.status for name, c in status.items()} == {
        "dqn-es-fp32": "FINISHED", "dqn-nq-fp32": "FINISHED", "tft-es-fp32": "FAILED", "tft-nq-fp32": "FAILED",
    }  # fmt: skip
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in cells)
    assert status["tft-es-fp32"].data.tags["error"] == (
        "CellExceedsBudget: cell tft-es-fp32 needs 500 MB (fallback: model.memory_target_mb (no measurement, "
        "no prediction)) > 320 MB available on budget rtx3050ti (320 MB total - 0 MB headroom): not started"
    )
    assert not (sweep / "tft_es_fp32_2" / "checkpoints").exists()  # failed before training
    if n_jobs == 2:  # two loky workers
        assert status["dqn-es-fp32"].data.tags["pid"] != status["dqn-nq-fp32"].data.tags["pid"]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("foxhunt-train: 2 of 4 cells failed: tft-es-fp32 (FAILED: CellExceedsBudget: cell tft-es-fp32")


def test_a_cell_with_bad_data_fails_alone_and_the_sweep_exits_non_zero(tmp_path, monkeypatch, capfd, check):
    # 6E prices (1.09, on the 0.00005 grid) are off the ES grid (0.25): the es cell's data is bad.
    csv = six_e_csv(tmp_path / "6e.csv")
    data = ["data=csv", f"data.source.path={csv}", "data.source.bar_label=start"]
    result = foxhunt_train_here(monkeypatch, capfd, ["model=dqn", "asset=6e,es", *data, *SMOKE], tmp_path)
    check(result, 1)
    parents, cells = runs(tmp_path)
    status = {c.info.run_name: c for c in cells}
    assert status["dqn-6e-fp32"].info.status == "FINISHED"
    assert status["dqn-es-fp32"].info.status == "FAILED" and "6e.csv" in status["dqn-es-fp32"].data.tags["error"]
    assert parents[0].info.status == "FAILED"
    table = result.stdout[result.stdout.rindex("cell  ") :]
    assert "dqn-6e-fp32  FINISHED" in table and "dqn-es-fp32  FAILED" in table
    assert "1 of 2 cells failed: dqn-es-fp32 (FAILED: data error: " in result.stderr.splitlines()[-1]


@pytest.mark.parametrize(("values", "line"), [
    (["evaluation.max_bars=100,1"], "in cell [model=dqn trainer=smoke evaluation.max_bars=1] (2 of 2): evaluation.max_bars=1: "
                                    "Input should be greater than or equal to 2"),
    (["model=dqn,nope"], "in cell [model=nope trainer=smoke] (2 of 2): In 'train': Could not find 'model/nope'"),
])  # fmt: skip
def test_a_bad_value_in_any_cell_refuses_the_sweep_before_the_first_trains(monkeypatch, capfd, tmp_path, check, values, line):
    """Every cell's values are checked before any run exists: the last cell's bad value failed
    that cell only, after the first had trained (exit 1, a FINISHED and a FAILED run)."""
    args = ["model=dqn", "trainer=smoke", *values] if values[0].startswith("evaluation") else [*values, "trainer=smoke"]
    result = foxhunt_train_here(monkeypatch, capfd, args, tmp_path)
    check(result, 2)
    assert result.stderr.strip().splitlines()[-1].startswith(f"foxhunt-train: cannot prepare the sweep: config error: {line}")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "mlruns" / "mlflow.db").exists() or runs(tmp_path) == ([], [])  # nothing trained, no run
    assert sweep_dirs(tmp_path) == []  # ... and no empty sweep folder left behind


def test_submitit_local_runs_each_cell_in_its_own_process(tmp_path, check):
    result = foxhunt_train(["model=dqn", "asset=es,nq", "strategy=submitit_local", *SMOKE, *WEEK], tmp_path)
    check(result)
    parents, cells = runs(tmp_path)
    (parent,) = parents
    assert sorted(c.info.run_name for c in cells) == ["dqn-es-fp32", "dqn-nq-fp32"]
    assert all(c.info.status == "FINISHED" and c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in cells)
    assert len({c.data.tags["pid"] for c in cells}) == 2
    (sweep,) = sweep_dirs(tmp_path)
    assert (sweep / ".submitit").is_dir() and "2 of 2 cells ok" in (sweep / "summary.md").read_text()


@pytest.mark.slow
def test_a_sweep_stopped_by_sigterm_resumes_from_the_interrupted_checkpoint(tmp_path, check):
    import os
    import sys

    args = ["-m", "model=dqn", "asset=es", "trainer=smoke", "trainer.max_epochs=40", *WEEK, "strategy.torch_threads=1"]
    env = {**os.environ, "FOXHUNT_ROOT": str(tmp_path)}
    process = subprocess.Popen([str(Path(sys.executable).parent / "foxhunt-train"), *args], env=env, cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 180
    while not list((tmp_path / "outputs").glob("sweeps/*/dqn_es_fp32_0/checkpoints/last.ckpt")):
        assert time.monotonic() < deadline and process.poll() is None, "no checkpoint before the deadline"
        time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 143  # as for a process ended by SIGTERM, never 0
    (parent,), (killed,) = runs(tmp_path)
    assert killed.info.status == "KILLED" and parent.info.status == "KILLED"
    assert list((tmp_path / "outputs").glob("sweeps/*/dqn_es_fp32_0/checkpoints/interrupted.ckpt"))

    result = foxhunt_train([*args[1:], "resume=true"], tmp_path)
    check(result)
    (parent_after,), (resumed,) = runs(tmp_path)
    assert resumed.info.run_id == killed.info.run_id and resumed.info.status == "FINISHED"
    assert parent_after.info.run_id == parent.info.run_id and parent_after.info.status == "FINISHED"
    cell_result = read_results(sweep_dirs(tmp_path)[-1])[0]
    assert cell_result.note == f"resumed KILLED run {killed.info.run_id} from interrupted.ckpt"


@pytest.mark.slow
def test_full_grid_in_parallel_isolates_a_failing_cell_and_resume_trains_only_that_one(tmp_path, compose_cfg, check):
    """The done criterion, ``foxhunt-train -m preset=grid trainer=smoke strategy=parallel``, on a
    week of bars (the default 60 days make the TFT and Mamba-2 cells' backtests take minutes)."""
    from foxhunt.config.schema import resolved_config
    from foxhunt.runs.config_hash import config_hash
    from foxhunt.runs.tracked_run import TrackedRun

    # An earlier run of the tft-zn cell measured 40 GB: packing must refuse that cell alone.
    cell = compose_cfg(["model=tft", "asset=zn", "precision=fp32", "trainer=smoke", *WEEK])
    tags = {"model": "tft", "asset": "zn", "precision": "fp32", "config_hash": config_hash(cell)}
    logger = cell.logger
    with TrackedRun(logger.tracking_uri, logger.experiment, logger.artifact_location, "tft-zn-fp32", tags) as earlier:
        earlier.log_config(resolved_config(cell), "")
        earlier.log_metrics({"memory/device_peak_mb": 40000.0})

    grid = ["preset=grid", "precision=fp32", "trainer=smoke", "strategy=parallel", *WEEK]  # fp32: the TFT defaults to auto
    result = foxhunt_train(grid, tmp_path, timeout=1800)
    check(result, 1)
    parents, cells = runs(tmp_path)
    (parent,) = parents
    cells = [c for c in cells if c.info.run_id != earlier.run_id]
    assert len(cells) == 16 and all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in cells)
    status = {c.info.run_name: c.info.status for c in cells}
    assert status.pop("tft-zn-fp32") == "FAILED" and set(status.values()) == {"FINISHED"}
    assert parent.data.tags["failed_cells"] == "tft-zn-fp32"
    assert "1 of 16 cells failed: tft-zn-fp32 (FAILED: CellExceedsBudget: cell tft-zn-fp32 needs 40000 MB" in result.stderr
    first = {r.cell: r for r in read_results(sweep_dirs(tmp_path)[0])}
    assert {"test/sharpe", "val/loss", "memory/device_peak_mb"} <= set(first["tft-es-fp32"].metrics)
    assert "| tft | " in (sweep_dirs(tmp_path)[0] / "summary.md").read_text()

    store(tmp_path).delete_run(earlier.run_id)  # the cause is gone: the cell may run now
    again = foxhunt_train([*grid, "resume=true"], tmp_path, timeout=1800)
    check(again)
    cell_results = {r.cell: r for r in read_results(sweep_dirs(tmp_path)[-1])}
    assert cell_results.pop("tft-zn-fp32").status == "FINISHED"
    assert {r.status for r in cell_results.values()} == {"SKIPPED"} and len(cell_results) == 15
    parents_after, cells_after = runs(tmp_path)
    assert [p.info.run_id for p in parents_after] == [parent.info.run_id] and parents_after[0].info.status == "FINISHED"
    assert len(cells_after) == 17  # the 16 cells + the new tft-zn run (the failed one had no checkpoint)
