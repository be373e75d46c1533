"""``strategy=slurm`` on a real SLURM cluster: a cell stopped mid-fit and requeued FINISHES in
its own MLflow run with the weights of the cell never stopped.

Needs a cluster this machine submits to (``sinfo`` answers); skipped otherwise. One node on this
machine: ``sudo scripts/slurm_test_cluster.sh`` (docs/how-to/slurm.md). Run with
``pytest -m slow tests/sweeps/test_slurm_preemption.py`` (about 4 minutes on 2 cores).

Two ways a running job is requeued:
- ``scontrol requeue`` (as a requeueing preemption does): SIGTERM, and SLURM starts the job again;
- SLURM's notice before the time limit (``sbatch --signal=USR2@<signal_delay_s>``; sent here with
  ``scancel --signal=USR2`` once the fit is under way, since SLURM sends it at a time of its own
  choosing): the fit checkpoints and submitit requeues the job.

A requeued job waits ~2 minutes before SLURM starts it again (its begin time); the test moves
that to now.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from sweep_helpers import foxhunt_train, runs, sweep_dirs

from foxhunt.runs.cell import read_results

SWEEP_TIMEOUT_S = 600


def cluster_answers() -> str | None:
    """Why there is no cluster to test on, None when ``sinfo`` answers with a usable node."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "no SLURM client (sinfo, sbatch) on this machine: see scripts/slurm_test_cluster.sh"
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo failed: {exc}"
    if states.returncode != 0:
        return f"sinfo failed: {states.stderr.strip()[:200]}"
    if not {"idle", "mixed", "allocated"} & set(states.stdout.split()):
        return f"no SLURM node up (sinfo: {states.stdout.split()})"
    return None


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def cluster():
    """Skips the tests when no cluster answers (asked only when they are selected: ``sinfo``
    waits ~20 s for a controller that is down)."""
    why_not = cluster_answers()
    if why_not is not None:
        pytest.skip(why_not)


# A DQN smoke cell of 8 epochs x 100 calls x 4 steps = 3,200 agent steps: long enough to be
# stopped in its second epoch, short enough for a test.
CELL = ["preset=grid", "model=dqn", "asset=es", "trainer=smoke", "trainer.limit_train_batches=100", "trainer.max_epochs=8",
        "data.source.days=7", "strategy.torch_threads=1"]  # fmt: skip


def on_slurm(name: str) -> list[str]:
    return ["strategy=slurm", "strategy.cpus_per_task=1", "strategy.gpus_per_job=null", "strategy.mem_gb=null",
            "strategy.time_min=10", f"hydra.launcher.name={name}"]  # fmt: skip


def final_weights(cell_dir: Path) -> tuple[int, dict[str, torch.Tensor]]:
    """(global step, weights) of the cell's last checkpoint, the one of the highest step."""
    found = []
    for path in (cell_dir / "checkpoints").glob("last*.ckpt"):
        saved = torch.load(path, map_location="cpu", weights_only=False)
        found.append((saved["global_step"], path.stat().st_mtime, saved["state_dict"]))
    assert found, f"no last checkpoint in {cell_dir / 'checkpoints'}"
    step, _, weights = max(found, key=lambda f: (f[0], f[1]))
    return step, weights


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The same cell run to its end without SLURM: (its final step, weights, test/sharpe)."""
    root = tmp_path_factory.mktemp("uninterrupted")
    result = foxhunt_train([*CELL, "strategy=sequential"], root, timeout=SWEEP_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-4000:]
    (sweep,) = sweep_dirs(root)
    (cell,) = read_results(sweep)
    return (*final_weights(sweep / "dqn_es_fp32_0"), cell.metrics["test/sharpe"])


def squeue(name: str) -> list[tuple[str, str, str]]:
    """(job id, state, reason) of the jobs named ``name``."""
    shown = subprocess.run(["squeue", "-h", f"--name={name}", "-o", "%i|%T|%r"], capture_output=True, text=True, timeout=30)
    return [tuple(line.split("|")) for line in shown.stdout.split()]


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.mark.parametrize(
    "interrupt", [["scontrol", "requeue"], ["scancel", "--signal=USR2"]], ids=["scontrol-requeue", "time-limit-notice"]
)
def test_a_cell_requeued_mid_fit_finishes_in_its_run_with_the_uninterrupted_weights(tmp_path, uninterrupted, interrupt):
    name = f"foxhunt-test-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "FOXHUNT_ROOT": str(tmp_path), "HYDRA_FULL_ERROR": "1"}
    command = [str(Path(sys.executable).parent / "foxhunt-train"), "-m", *CELL, *on_slurm(name)]
    log = (tmp_path / "sweep.log").open("w")
    sweep = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    try:
        checkpoints = wait_for(lambda: list(tmp_path.glob("outputs/sweeps/*/dqn_es_fp32_0/checkpoints/last*.ckpt")), 300,
                               "the fit's first checkpoint")  # fmt: skip
        ((job_id, state, _),) = squeue(name)
        assert state == "RUNNING"
        subprocess.run([*interrupt, job_id], check=True, timeout=30)
        deadline = time.monotonic() + SWEEP_TIMEOUT_S
        while sweep.poll() is None and time.monotonic() < deadline:
            for job, state, reason in squeue(name):
                if state == "PENDING" and reason == "BeginTime":  # a requeued job's wait
                    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], timeout=30)
            time.sleep(1)
        assert sweep.poll() == 0, (tmp_path / "sweep.log").read_text()[-6000:]
    finally:
        if sweep.poll() is None:
            sweep.kill()
        subprocess.run(["scancel", f"--name={name}"], timeout=30)
        log.close()

    (sweep_dir,) = sweep_dirs(tmp_path)
    cell_dir = checkpoints[0].parent.parent
    parents, cells = runs(tmp_path)
    assert [p.info.status for p in parents] == ["FINISHED"]
    (cell,) = cells  # before: the requeued job trained the cell again in a new run
    assert cell.info.status == "FINISHED" and cell.data.tags["resume_count"] == "1"
    (result,) = read_results(sweep_dir)
    assert result.status == "FINISHED" and result.note == f"resumed KILLED run {cell.info.run_id} from interrupted.ckpt"
    stopped_at = torch.load(cell_dir / "checkpoints" / "interrupted.ckpt", map_location="cpu", weights_only=False)["global_step"]
    step, weights = final_weights(cell_dir)
    reference_step, reference, reference_sharpe = uninterrupted
    assert 0 < stopped_at < step == reference_step  # stopped mid-fit, and fitted to the end
    assert weights.keys() == reference.keys()
    differ = [key for key in reference if not torch.equal(weights[key], reference[key])]
    assert not differ, f"resumed from step {stopped_at}: {len(differ)} of {len(reference)} tensors differ: {differ[:5]}"
    assert result.metrics["test/sharpe"] == reference_sharpe
