"""The signals SLURM sends, without a cluster (fast).

- a fit takes SIGUSR1 and SIGUSR2 as it takes SIGTERM: it stops after the step in flight and
  saves ``interrupted.ckpt`` (their default action ended the process on the spot), a listener
  from before the fit hears them too and gets them back afterwards;
- a stop requested before the fit stops it after its first step;
- a cell in a SLURM job of ``strategy=slurm``: a restarted job resumes its cell; the SIGTERM of
  a requeue leaves the sweep's parent run RUNNING, a cancel's ends it; SLURM's notice hands the
  job to submitit's requeue, and a refused requeue leaves the cell KILLED for the summary.

The cluster itself: ``test_slurm_preemption.py`` (slow).
"""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import open_dict
from sweep_helpers import written
from torch.utils.data import DataLoader, TensorDataset

from foxhunt.runs.cell import CellKey, CellResult
from foxhunt.runs.checkpoints import INTERRUPTED_CHECKPOINT
from foxhunt.runs.environment import PARENT_RUN_ENV, SWEEP_PID_ENV
from foxhunt.sweeps import sweep_cell
from foxhunt.sweeps.slurm import SlurmJob, scontrol_restarts
from foxhunt.training.graceful_stop import GracefulStop, request_stop
from tiny_lightning import Regressor

STEPS = 12


class SignalAt(pl.Callback):
    """Sends this process ``signum`` once the fit has taken ``step`` steps."""

    def __init__(self, signum: int, step: int) -> None:
        self.signum, self.step = signum, step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def fit(tmp_path: Path, *callbacks: pl.Callback) -> pl.Trainer:
    data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
    trainer = pl.Trainer(accelerator="cpu", max_steps=STEPS, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=list(callbacks),
                         default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(Regressor(lr=0.1), data)
    return trainer


@pytest.fixture
def listener():
    """A handler of SIGUSR1 and SIGUSR2 from before the fit (a SLURM job's requeue), recording
    what it hears; the dispositions are put back after the test."""
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    heard: list[int] = []

    def record(signum, frame):
        heard.append(signum)

    record.heard = heard
    for signum in before:
        signal.signal(signum, record)
    yield record
    for signum, handler in before.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGUSR2], ids=["SIGUSR1", "SIGUSR2"])
def test_a_stop_signal_mid_fit_stops_it_like_sigterm_with_a_checkpoint(tmp_path, listener, signum):
    stop = GracefulStop(dirpath=str(tmp_path / "checkpoints"))
    with pytest.raises(SIGTERMException):  # before: the fit ran on to its last step
        fit(tmp_path, stop, SignalAt(signum, 3))
    saved = torch.load(tmp_path / "checkpoints" / INTERRUPTED_CHECKPOINT, weights_only=True)
    assert saved["global_step"] == 3 and saved["optimizer_states"]  # the step in flight finished, no more
    assert stop.stop_signal == signal.Signals(signum).name
    assert listener.heard == [signum]  # the handler from before the fit heard it too
    os.kill(os.getpid(), signum)  # after the fit: the listener's again, nothing of the fit's left
    assert listener.heard == [signum, signum] and signal.getsignal(signum) is listener


def test_a_fit_gives_the_stop_signals_back_as_it_found_them(tmp_path):
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    trainer = fit(tmp_path, GracefulStop(dirpath=str(tmp_path / "checkpoints")))
    assert trainer.global_step == STEPS and not (tmp_path / "checkpoints").exists()
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_stop_requested_before_the_fit_stops_it_after_its_first_step(tmp_path):
    stop = GracefulStop(dirpath=str(tmp_path / "checkpoints"))
    request_stop("SIGUSR2")  # a preemption notice while the cell was loading its data
    with pytest.raises(SIGTERMException):
        fit(tmp_path, stop)
    assert torch.load(stop.checkpoint_path, weights_only=True)["global_step"] == 1
    assert stop.stop_signal == "SIGUSR2"
    trainer = fit(tmp_path / "next", GracefulStop(dirpath=str(tmp_path / "next" / "checkpoints")))
    assert trainer.global_step == STEPS  # the request was this fit's, not the next one's


# -- a cell in a SLURM job -----------------------------------------------------------------------
def fake_scontrol(folder: Path, restarts: int) -> None:
    """An ``scontrol`` that shows job 77 with ``restarts`` restarts."""
    folder.mkdir(exist_ok=True)
    script = folder / "scontrol"
    script.write_text(
        f"#!/bin/sh\necho 'JobId=77 JobName=train JobState=COMPLETING Reason=None Requeue=1 Restarts={restarts} BatchFlag=1'\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def parent_ends(monkeypatch) -> list[str]:
    """The sweep's parent run ends (their reasons), recorded instead of written."""
    ended: list[str] = []
    monkeypatch.setattr(sweep_cell, "_end_parent_run_killed", lambda cfg, run_id, reason: ended.append(reason))
    return ended


@pytest.fixture
def slurm_job(sweep_config, tmp_path, monkeypatch, parent_ends):
    """A grid job's config, run as job 77 of SLURM through submitit."""
    monkeypatch.delenv(PARENT_RUN_ENV, raising=False)
    monkeypatch.delenv(SWEEP_PID_ENV, raising=False)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with open_dict(sweep_config):
        sweep_config.paths.output_dir = str(tmp_path / "job0")
    return sweep_config


def test_the_job_and_its_restarts_are_read_from_slurm(monkeypatch):
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert SlurmJob.current() == SlurmJob("12", 2) and SlurmJob.current().requeued
    monkeypatch.setenv("SLURM_RESTART_COUNT", "two")
    assert SlurmJob.current() == SlurmJob("12", 0)
    monkeypatch.setenv("SLURM_JOB_ID", "12; rm -rf /")
    assert SlurmJob.current() is None
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")
    assert SlurmJob.current() is None
    shown = "JobId=12 ArrayJobId=11 Restarts=1 X=y\nJobId=13 Restarts=4\n"
    assert (scontrol_restarts(shown, "12"), scontrol_restarts(shown, "13"), scontrol_restarts(shown, "14")) == (1, 4, None)


def test_a_restarted_job_resumes_its_cell(slurm_job, monkeypatch):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    seen = []
    outcome = CellResult(CellKey("dqn", "es", "fp32", "42", "abc"), status="FINISHED", run_id="r1", metrics={"val/sharpe": 1.0})
    assert sweep_cell.run_sweep_cell(slurm_job, lambda cfg, **kwargs: seen.append(cfg.resume) or outcome) == {"val/sharpe": 1.0}
    assert seen == [True]


@pytest.mark.parametrize("restarts, ends_sweep", [(1, False), (0, True)], ids=["requeue", "cancel"])
def test_a_sigterm_ends_the_sweep_unless_slurm_requeues_the_job(slurm_job, parent_ends, tmp_path, restarts, ends_sweep):
    fake_scontrol(tmp_path / "bin", restarts)

    def stopped(cfg, **kwargs):
        raise SIGTERMException()

    with pytest.raises(SystemExit) as caught:
        sweep_cell.run_sweep_cell(slurm_job, stopped)
    assert caught.value.code == 143
    assert parent_ends == (["SIGTERMException"] if ends_sweep else [])  # before: always ended KILLED
    result = written(slurm_job)
    assert result.status == "KILLED" and (result.note is None) == ends_sweep


@pytest.fixture
def submitit_handler(monkeypatch):
    """submitit's handler of its signal (SIGUSR2) in a job: it requeues (``SystemExit(-1)``) or
    refuses (``UncompletedJobError``); the calls are recorded."""
    from submitit.core.utils import UncompletedJobError

    before = signal.getsignal(signal.SIGUSR2)
    calls: list[int] = []

    def handler(signum, frame):
        calls.append(signum)
        if handler.refuse:
            raise UncompletedJobError("Job not requeued because: timed-out too many times.")
        raise SystemExit(-1)

    handler.refuse, handler.calls = False, calls
    signal.signal(signal.SIGUSR2, handler)
    yield handler
    signal.signal(signal.SIGUSR2, before)


def notified_then_stopped(cfg, **kwargs):
    """A cell whose fit gets SLURM's notice and stops (as GracefulStop makes it)."""
    os.kill(os.getpid(), signal.SIGUSR1)
    raise SIGTERMException()


def test_slurms_notice_requeues_the_job_through_submitit(slurm_job, parent_ends, tmp_path, submitit_handler):
    fake_scontrol(tmp_path / "bin", 0)
    with pytest.raises(SystemExit) as caught:
        sweep_cell.run_sweep_cell(slurm_job, notified_then_stopped)
    assert caught.value.code == -1 and submitit_handler.calls == [signal.SIGUSR2]  # submitit's signal, whichever came
    assert parent_ends == []  # the sweep goes on: its parent run stays RUNNING
    result = written(slurm_job)
    assert result.status == "KILLED" and result.note == "SIGUSR1: job 77 requeued through submitit"
    assert signal.getsignal(signal.SIGUSR2) is submitit_handler  # given back


def test_a_refused_requeue_leaves_the_cell_killed_for_the_summary(slurm_job, parent_ends, tmp_path, submitit_handler):
    submitit_handler.refuse = True
    assert sweep_cell.run_sweep_cell(slurm_job, notified_then_stopped) is None
    assert parent_ends == []
    result = written(slurm_job)
    assert result.status == "KILLED" and "not requeued: Job not requeued because: timed-out too many times." in result.note


def test_a_notice_after_the_fit_lets_the_cell_finish_without_a_requeue(slurm_job, submitit_handler):
    outcome = CellResult(CellKey("dqn", "es", "fp32", "42", "abc"), status="FINISHED", run_id="r1", metrics={"val/sharpe": 2.0})

    def notified_while_scoring(cfg, **kwargs):
        os.kill(os.getpid(), signal.SIGUSR2)
        return outcome

    assert sweep_cell.run_sweep_cell(slurm_job, notified_while_scoring) == {"val/sharpe": 2.0}
    assert submitit_handler.calls == [] and written(slurm_job).status == "FINISHED"
