"""Planning a job before launch: each cell's planned batches and weight, one-line config
errors; stopping only the job's own process."""

from __future__ import annotations

import socket

import pytest
from omegaconf import OmegaConf

from foxhunt.jobs.launch import LaunchError, load_costs, plan_cells, planned_batches


def _cfg(kind, limit, epochs=2, max_steps=-1, steps_per_epoch=1000):
    return OmegaConf.create({
        "model": {"kind": kind, "env": {"steps_per_epoch": steps_per_epoch}},
        "trainer": {"limit_train_batches": limit, "max_epochs": epochs, "max_steps": max_steps},
    })  # fmt: skip


def test_planned_batches_follow_the_trainer_and_the_env():
    costs = load_costs()
    assert planned_batches(_cfg("agent", 500), costs) == 1000  # 2 epochs x min(500, 1000)
    assert planned_batches(_cfg("agent", 0.5), costs) == 1000  # 2 x 1000 x 0.5
    assert planned_batches(_cfg("forecaster", 40, epochs=3), costs) == 120
    assert planned_batches(_cfg("forecaster", 40, epochs=3, max_steps=100), costs) == 100
    assert planned_batches(_cfg("forecaster", 1.0), costs) == 2 * costs["batches_per_epoch_if_unknown"]


def test_plan_composes_and_validates_every_cell(tmp_path):
    plan, store = plan_cells(["model=dqn,tft", "asset=es", "trainer=smoke"], tmp_path)
    costs = load_costs()["seconds_per_batch"]
    from foxhunt.precision.auto import auto_choice, device_for

    tft_precision = auto_choice(device_for("auto")).name  # the TFT's default: precision=auto
    assert [(c.key.model, c.key.asset, c.key.precision, c.steps) for c in plan] == [
        ("dqn", "es", "fp32", 8),
        ("tft", "es", tft_precision, 8),
    ]
    assert plan[1].weight / plan[0].weight == pytest.approx(costs["tft"] / costs["dqn"])
    assert store["tracking_uri"] == f"sqlite:///{tmp_path}/mlruns/mlflow.db" and store["experiment"] == "foxhunt"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["model=dqn", "asset=es,xx"],
            "config error in cell [model=dqn asset=xx]: In 'train': Could not find 'asset/xx'",
        ),
        (["trainer.max_epochs=-5"], "trainer.max_epochs=-5"),
        (["model=dqn,"], "overrides model=dqn,:"),
    ],
)
def test_a_bad_override_fails_at_once_in_one_line(tmp_path, overrides, message):
    with pytest.raises(LaunchError) as error:
        plan_cells(overrides, tmp_path)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_stop_never_signals_a_process_that_is_not_the_jobs(tmp_path):
    """A launch file whose pid is another program's (hand-edited, or the pid reused): one line,
    exit 2, and that program keeps running."""
    import subprocess
    import time

    import psutil
    from typer.testing import CliRunner

    from foxhunt.cli import app
    from foxhunt.jobs.launch_file import LaunchFile, jobs_dir
    from foxhunt.runs.environment import store_uri
    from foxhunt.runs.store import RunStore

    RunStore(store_uri(tmp_path)).ensure_experiment("foxhunt")
    other = subprocess.Popen(["sleep", "300"])
    try:
        started = int(psutil.Process(other.pid).create_time() * 1000) + 2000  # launched 2 s after it
        launch_file = LaunchFile(job_id="ffff7777", pid=other.pid, host=socket.gethostname(), command=["foxhunt-train", "-m"],
                                 overrides=[], log=str(tmp_path / "job.log"), tracking_uri=store_uri(tmp_path),
                                 root=str(tmp_path), sweep_dir=str(tmp_path / "sweep"), started_ms=started, plan=[])  # fmt: skip
        launch_file.write(jobs_dir(tmp_path) / "ffff7777.json")
        result = CliRunner().invoke(app, ["train", "stop", "ffff7777", "--root", str(tmp_path), "--timeout", "1"])
        assert result.exit_code == 2, result.output
        assert result.output.strip().splitlines()[-1] == (
            f"foxhunt train: job ffff7777: pid {other.pid} is not the job's process (it runs 'sleep 300'): not signalled"
        )
        time.sleep(0.2)
        assert other.poll() is None  # never signalled
    finally:
        other.kill()
        other.wait()
