"""A cell that runs as a SLURM job of ``strategy=slurm`` (hydra-submitit-launcher): time limits,
preemption and requeues keep its training and its MLflow run.

SLURM ends a running job in these ways:

- a notice before the time limit: ``sbatch --signal=USR2@<hydra.launcher.signal_delay_s>``
  (submitit writes it; the signal is submitit's, ``$SUBMITIT_PREEMPT_SIGNAL``, USR2 unless set),
  or the same signal sent by a site's preemption or by ``scancel --signal``;
- a requeue: ``scontrol requeue``, or a preemption with ``PreemptMode=REQUEUE``: SIGTERM, then
  SIGKILL after ``KillWait`` (``GraceTime``), and SLURM starts the job again;
- a cancel (``scancel``) or the time limit itself: SIGTERM, then SIGKILL, and the job is over.

Every one of them reaches a running fit as a stop (:mod:`foxhunt.training.graceful_stop`: the
fit stops after its step in flight and saves ``interrupted.ckpt``; its run ends KILLED). Then:

- after the notice (SIGUSR1 or SIGUSR2, :class:`Preemption`), the job is handed to submitit's
  own handler of its signal, which pickles the job again (the launcher's ``checkpoint``),
  requeues it (``scontrol requeue``) and exits; past ``hydra.launcher.max_num_timeout`` requeues
  after time limits it refuses, and the cell is left KILLED in the summary (``resume=true``
  continues it). A notice that comes after the fit (the cell is testing and scoring) lets the
  cell finish: nothing to requeue. One that comes before the fit stops the fit after its
  first step;
- after a SIGTERM, :meth:`SlurmJob.being_requeued` asks ``scontrol`` whether SLURM counts a
  restart more than this attempt started with: then SLURM requeues the job itself;
- in both cases the sweep's parent run stays RUNNING: its cell is not over. Only a stop that
  ends the job (a cancel, the time limit, a refused requeue) ends the sweep as before.

A requeued job (``$SLURM_RESTART_COUNT`` > 0) runs its cell with ``resume=true``: the cell's run,
KILLED by the stop, is reopened and the fit continues from its checkpoint
(:mod:`foxhunt.runs.resume`), in the same folder and the same MLflow run.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
from dataclasses import dataclass

from submitit import JobEnvironment
from submitit.core.utils import UncompletedJobError

from foxhunt.training.graceful_stop import STOP_SIGNALS, Handler, clear_stop_request, request_stop

log = logging.getLogger(__name__)

SUBMITIT_EXECUTOR_ENV = "SUBMITIT_EXECUTOR"  # submitit's sbatch script exports "slurm"
JOB_ID_ENV, RESTART_ENV = "SLURM_JOB_ID", "SLURM_RESTART_COUNT"
SCONTROL_TIMEOUT_S = 30  # a controller that does not answer in this time is taken as "not requeued"


@dataclass(frozen=True)
class SlurmJob:
    """This process's SLURM job: its id and how many times SLURM had restarted it when it began."""

    job_id: str
    restarts: int

    @classmethod
    def current(cls) -> SlurmJob | None:
        """The job this process runs in when it is a submitit SLURM job, else None."""
        if os.environ.get(SUBMITIT_EXECUTOR_ENV) != "slurm":
            return None
        job_id = os.environ.get(JOB_ID_ENV, "")
        if not job_id.isdigit():
            log.warning("$%s is %r, not a job id: preemption and requeue are not handled", JOB_ID_ENV, job_id)
            return None
        restarts = os.environ.get(RESTART_ENV, "0")
        if not restarts.isdigit():
            log.warning("$%s is %r, not a count: taken as 0 (a first start)", RESTART_ENV, restarts)
            restarts = "0"
        return cls(job_id, int(restarts))

    @property
    def requeued(self) -> bool:
        return self.restarts > 0

    def being_requeued(self) -> bool:
        """Whether SLURM requeues this job now: it counts more restarts than this attempt began
        with (``scontrol requeue`` and a requeueing preemption count one before they send
        SIGTERM; a cancel or a time limit do not)."""
        try:
            shown = subprocess.run(["scontrol", "show", "job", "--oneliner", self.job_id], capture_output=True, text=True,
                                   timeout=SCONTROL_TIMEOUT_S)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("scontrol show job %s: %s: the job is taken as not requeued", self.job_id, exc)
            return False
        restarts = scontrol_restarts(shown.stdout, self.job_id)
        if shown.returncode != 0 or restarts is None:
            log.warning("scontrol show job %s did not say its restarts (%s): the job is taken as not requeued",
                        self.job_id, (shown.stderr or shown.stdout).strip()[:200])  # fmt: skip
            return False
        return restarts > self.restarts


def scontrol_restarts(text: str, job_id: str) -> int | None:
    """``Restarts=`` of job ``job_id`` in ``scontrol show job --oneliner`` output, None when absent."""
    for line in text.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if fields.get("JobId") == job_id and fields.get("Restarts", "").isdigit():
            return int(fields["Restarts"])
    return None


class Preemption:
    """While a cell runs: the notice signals (SIGUSR1, SIGUSR2) stop its fit and are remembered,
    and :meth:`requeue` hands the job to submitit's requeue afterwards."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._before: dict[int, Handler] = {}

    def __enter__(self) -> Preemption:
        for signum in STOP_SIGNALS:
            self._before[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._before.items():
            signal.signal(signum, handler)
        clear_stop_request()  # a notice that came after the fit: the cell is over

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is None:
            log.warning("%s: SLURM's notice of a time limit or a preemption: the cell checkpoints and the job is requeued", name)
        self.received = name
        request_stop(name)

    def requeue(self) -> str:
        """submitit's handler of its signal: it pickles the job again, requeues it and exits the
        process (``SystemExit``). Returns why it did not requeue."""
        signum = getattr(signal, f"SIG{JobEnvironment.USR_SIG}", None)
        handler = None if signum is None else self._before.get(signum)
        if signum is None or not callable(handler):
            return f"submitit handles no signal SIG{JobEnvironment.USR_SIG} in this process"
        try:
            handler(signum, None)
        except UncompletedJobError as exc:  # submitit's refusal (too many time limits, no checkpoint method)
            return str(exc)
        return "submitit did not requeue the job"
