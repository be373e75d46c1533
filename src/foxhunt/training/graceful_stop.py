"""Graceful stop: on SIGTERM, SIGUSR1, SIGUSR2 or Ctrl-C, save a checkpoint before the run ends.

Lightning already turns SIGTERM into a ``SIGTERMException`` raised at the next step boundary,
which reaches callbacks through ``on_exception``. This callback writes ``interrupted.ckpt``
there (weights, optimizer and loop state, resumable with ``ckpt=<path>``; ``resume=true`` finds
it: :mod:`foxhunt.runs.checkpoints`), so a stopped run loses at most the step in flight. The
run's :class:`~foxhunt.runs.tracked_run.TrackedRun` then ends it KILLED.

Ctrl-C (SIGINT) during a fit is the same stop, after the step in flight: Python's own
``KeyboardInterrupt`` lands wherever the interpreter is (the forward pass, the optimizer, an
MLflow write), and a checkpoint saved there held the counters of a half-done batch, so the
resume logged steps twice or shifted and a forecaster's windows went out of order (different
weights); one landing in a store write left the process locked out of its own store (found by a
helper probing kill and resume). A second Ctrl-C stops at once, as Python's does: that
``KeyboardInterrupt`` saves no checkpoint, so ``resume=true`` continues from the last one a
finished step wrote, exactly.

SIGUSR1 and SIGUSR2 (:data:`STOP_SIGNALS`) are what schedulers send before a time limit or a
preemption (``sbatch --signal``): while a fit runs, this callback takes them as Lightning takes
SIGTERM (the fit stops after the step in flight, the same ``interrupted.ckpt``) and records the
signal in :attr:`GracefulStop.stop_signal`. Without it their default action ends the process on
the spot, and under SLURM Lightning's own SIGUSR1 handler (``SLURMEnvironment(auto_requeue)``)
would requeue the job behind foxhunt's back: a handler already in place keeps Lightning's out.
A handler that was there before the fit (a SLURM job's requeue: :mod:`foxhunt.sweeps.slurm`)
hears the signal too, and gets its signals back when the fit ends.

:func:`request_stop` is the same stop asked for by code: the running fit stops after its step,
or, when no fit runs, the next fit that starts stops after its first step (a preemption notice
that came while the cell was still loading its data).

**SIGTERM outside a fit** (:func:`stop_between_phases`, around a run): Python's default action
ended the process on the spot while the cell loaded its data (its run left RUNNING), and during
the test stage Lightning's handler noted it and nothing read it (the run ended FINISHED, exit 0,
and a walk-forward cell trained its next fold: found by a helper probing kill and resume). While a
run runs, a SIGTERM that comes outside a fit is remembered and raised as Lightning's
``SIGTERMException`` at the run's next phase boundary (:func:`check_stop`: before a fit, after
the test, before each fold or seed), never in the middle of a store write; a fit that starts
first stops after its first step. The run then ends KILLED, exit status 143.

A process a stop ended exits with :func:`stop_exit_status` of the exception that stopped it (the
fit's stop marks it with its signal): 130 after Ctrl-C, as a shell reports a process Ctrl-C ended
(it exited 143, SIGTERM's, before), else 143.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import SIGTERMException

from foxhunt.errors import EXIT_ON_INTERRUPT, EXIT_ON_SIGTERM
from foxhunt.runs.checkpoints import INTERRUPTED_CHECKPOINT

#: what signal.getsignal returns and signal.signal takes (signal.Handlers are ints)
Handler = Callable[[int, FrameType | None], Any] | int | None

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)  # a scheduler's notice before a time limit or a preemption
INTERRUPT = signal.SIGINT  # Ctrl-C: the same stop; a second one stops at once (module doc)

_catching: GracefulStop | None = None  # the callback whose fit holds the stop signals now
_requested: str | None = None  # a stop requested while no fit ran, for the next fit
_pending: str | None = None  # a SIGTERM that came while no fit ran, raised at the next phase boundary
STOP_SIGNAL_ATTR = "foxhunt_stop_signal"  # set on the exception a fit's stop raised: the signal that asked for it


def is_stop_request(exception: BaseException) -> bool:
    """True for the exceptions that mean "the user asked the run to stop"."""
    return isinstance(exception, (SIGTERMException, KeyboardInterrupt))


def stop_exit_status(exc: BaseException) -> int:
    """The exit status of a process the stop ``exc`` ended (module doc): 130 for Ctrl-C, else 143."""
    return EXIT_ON_INTERRUPT if getattr(exc, STOP_SIGNAL_ATTR, None) == INTERRUPT.name else EXIT_ON_SIGTERM


def request_stop(reason: str) -> None:
    """Stop the running fit after its step in flight, as SIGTERM does; with no fit running, the
    next fit that starts stops after its first step (:func:`clear_stop_request` withdraws it)."""
    global _requested
    if _catching is not None:
        _catching.stop(reason)
    else:
        _requested = reason


def clear_stop_request() -> None:
    """Withdraw a stop requested while no fit ran (its cell is over)."""
    global _requested
    _requested = None


@contextmanager
def stop_between_phases() -> Iterator[None]:
    """While the block runs (a run, on the main thread): SIGTERM outside a fit stops the run at
    its next phase boundary (module doc). A handler that was there before hears it too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous == _on_sigterm:  # a run inside a run (a fold of a cell): the outer one holds it
        yield
        return

    global _pending
    signal.signal(signal.SIGTERM, _on_sigterm)
    _chained.append(previous)
    try:
        yield
    finally:
        _chained.pop()
        _pending = None  # what it asked for ended this run (or came as it finished): not the next run's
        if signal.getsignal(signal.SIGTERM) == _on_sigterm:
            signal.signal(signal.SIGTERM, previous)


_chained: list[Handler] = []  # the SIGTERM handler stop_between_phases found, innermost last


def _on_sigterm(signum: int, frame) -> None:
    global _pending
    if _chained and callable(_chained[-1]):
        _chained[-1](signum, frame)
    if _catching is not None:  # a fit holds the stop signals: Lightning's own handler stops it after its step
        return
    if _pending is None:
        log.warning("SIGTERM: the run stops at its next phase boundary")
    _pending = "SIGTERM"
    request_stop("SIGTERM")  # a fit that starts first stops after its first step


def check_stop() -> None:
    """Raise, as Lightning's ``SIGTERMException``, the stop a SIGTERM asked for while no fit ran
    (module doc); nothing when none did."""
    global _pending
    if _pending is not None:
        _pending = None
        clear_stop_request()
        raise SIGTERMException


class GracefulStop(pl.Callback):
    def __init__(self, dirpath: str) -> None:
        self.dirpath = Path(dirpath)
        self.checkpoint_path: Path | None = None
        self.stop_signal: str | None = None  # the stop signal (or request) that stopped the fit, e.g. "SIGUSR1"
        self._previous: dict[int, Handler] = {}  # the handlers of STOP_SIGNALS before the fit
        self._lightning_listens = False  # Lightning's SIGTERM handler is in place (the fit loop runs)
        self._undelivered = False

    # -- the stop signals, while a fit runs ----------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Before Lightning installs its signal handlers: a handler in place keeps its SLURM
        requeue handler off SIGUSR1."""
        global _catching
        if stage != "fit" or threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        self.stop_signal, self._lightning_listens, self._undelivered = None, False, False
        for signum in (*STOP_SIGNALS, INTERRUPT):
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)
        _catching = self

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        global _requested
        self._lightning_listens = True
        if _requested is not None and _catching is self:  # asked for before this fit started
            reason, _requested = _requested, None
            self.stop(reason)
        elif self._undelivered:
            self._deliver()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._lightning_listens = False  # the fit is over: a stop now has nothing left to stop

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._release()

    def stop(self, reason: str) -> None:
        """Stop this fit after its step in flight (Lightning's SIGTERM stop); once per fit."""
        if self.stop_signal is not None:
            return
        self.stop_signal = reason
        log.warning("%s: the fit stops after its current step (checkpoint %s)", reason, self.dirpath / INTERRUPTED_CHECKPOINT)
        if self._lightning_listens:
            self._deliver()
        else:  # Lightning's handler is not in place yet: at the fit loop's start
            self._undelivered = True

    def _deliver(self) -> None:
        self._undelivered = False
        handler = signal.getsignal(signal.SIGTERM)  # Lightning's, while its fit loop runs
        if callable(handler):
            handler(signal.SIGTERM, None)
        else:
            log.warning("no SIGTERM handler of Lightning's in place: the fit cannot be stopped early")

    def _on_signal(self, signum: int, frame) -> None:
        if _catching is not self:  # left over after the fit (Lightning put it back): what was there before
            self._hand_back(signum, frame)
            return
        if signum == INTERRUPT:
            if self.stop_signal is not None:  # Ctrl-C again: at once, as Python's own
                self._release()
                raise KeyboardInterrupt
            log.warning("Ctrl-C: the fit stops after its current step; press Ctrl-C again to stop at once")
            self.stop(signal.Signals(signum).name)
            return
        self.stop(signal.Signals(signum).name)
        previous = self._previous.get(signum)
        if callable(previous):  # a listener from before the fit hears it too
            previous(signum, frame)

    def _hand_back(self, signum: int, frame) -> None:
        previous = self._previous.get(signum, signal.SIG_DFL)
        signal.signal(signum, previous)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.raise_signal(signum)  # its default action, which this handler held up

    def _release(self) -> None:
        global _catching
        if _catching is not self:
            return
        _catching, self._lightning_listens = None, False
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, previous)

    # -- the checkpoint ----------------------------------------------------------------------
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._release()
        if not is_stop_request(exception) or trainer.state.fn != "fit":
            return
        if self.stop_signal is not None:
            try:
                setattr(exception, STOP_SIGNAL_ATTR, self.stop_signal)  # the exit status (stop_exit_status)
            except AttributeError:  # an exception that takes no attribute: 143, as before
                pass
        if isinstance(exception, KeyboardInterrupt):  # raised wherever it landed, maybe mid-step (module doc)
            log.warning("stopped at once (%s): no checkpoint of a step half done; resume=true continues from the last "
                        "checkpoint a finished step wrote", type(exception).__name__)  # fmt: skip
            return
        self.dirpath.mkdir(parents=True, exist_ok=True)
        path = self.dirpath / INTERRUPTED_CHECKPOINT
        trainer.save_checkpoint(path)
        self.checkpoint_path = path
        log.warning("stop requested (%s): checkpoint saved to %s", self.stop_signal or type(exception).__name__, path)
