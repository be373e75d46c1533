"""Drop the third-party console messages that say nothing to a foxhunt user, and only those.

Each entry names the logger (or warning) and a fragment of the exact message; everything else
from these libraries still prints. Written here because the libraries offer no switch for them:

- Lightning's "Tip: ... install litlogger" advert on every Trainer (rank_zero_info, no flag);
- torchao's "Failed to load .../_C_*.so" for its CUDA-only kernels on a CPU build of torch;
- torch's notice that torchao registers an Enum with ``register_constant`` (torchao's code);
- Lightning's own use of torch's deprecated ``LeafSpec`` (lightning/pytorch/utilities/_pytree.py);
- Lightning's "`training_step` returned `None`": DQN skips the gradient step on purpose until its
  replay buffer holds ``min_replay_size`` transitions (the warning itself says to ignore it then);
- torch.onnx's warning that an LSTM exported with a batch other than 1 may fail at another batch
  "unless the initial states are inputs": the TFT's graphs take them as inputs
  (:mod:`foxhunt.ensemble.onnx_runtime`), and the tests run them at several batch sizes;
- ONNX Runtime's advice to pre-process a graph before quantizing it: that is for static
  quantization; foxhunt quantizes dynamically;
- torchao's "Detected no triton": Triton's kernels are CUDA's; a CUDA build of torch installs
  Triton with it, so only a CPU build says it, where those kernels never run;
- Lightning's "`weights_only` was not set" at every checkpoint a callback writes: foxhunt's
  checkpoints hold the full state on purpose (they resume; :mod:`foxhunt.training.checkpoint`);
- Lightning's "`Trainer(limit_test_batches=1.0)` was configured so 100% of the batches will be
  used": the config says 1.0 (every batch), Lightning repeats it;
- Lightning's "The `srun` command is available on your system but is not used" on a machine with
  SLURM's tools: foxhunt's SLURM runs go through submitit (:mod:`foxhunt.sweeps.slurm`), a run
  started by hand is meant to run where it is.

What a user may want later but need not read while a run goes (the probes that ran, how a figure
was found) is logged to :data:`DETAIL` (:func:`detail_logger`): the log files of the root logger
(a Hydra job's ``<name>.log``) only, never the console; where there is no log file
(``hydra/job_logging=stdout``, a test), nowhere.
"""

from __future__ import annotations

import logging
import warnings

# (logger name, message fragment): records of that logger containing the fragment are dropped.
KNOWN_NOISE: tuple[tuple[str, str], ...] = (
    ("lightning.pytorch.utilities.rank_zero", "litlogger"),
    ("torchao", "Failed to load"),
    ("torch.utils._pytree", "is an Enum subclass and is now natively supported"),
    ("root", "Please consider to run pre-processing before quantization"),
    ("torchao.kernel.intmm", "Detected no triton"),
    ("lightning.pytorch.trainer.connectors.checkpoint_connector", "`weights_only` was not set"),
    ("lightning.pytorch.utilities.rank_zero", "was configured so 100% of the batches will be used"),
)
# Warning message patterns (regular expressions matched at the start of the message).
KNOWN_WARNINGS: tuple[str, ...] = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    r"`training_step` returned `None`",
    r"Exporting a model to ONNX with a batch_size other than 1",
    r"The `srun` command is available on your system but is not used",
)
#: The logger whose records (and its children's) go to the run's log file only (module doc).
DETAIL = "foxhunt.detail"


def detail_logger(module: str) -> logging.Logger:
    """The logger of ``module``'s details (:data:`DETAIL`): ``foxhunt.memory.callback`` logs to
    ``foxhunt.detail.memory.callback``."""
    return logging.getLogger(f"{DETAIL}.{module.removeprefix('foxhunt.')}")


class _DropFragment(logging.Filter):
    def __init__(self, fragment: str) -> None:
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


def silence_known_noise() -> None:
    """Install the filters (idempotent: a logger gets each filter once)."""
    for name, fragment in KNOWN_NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropFragment) and f.fragment == fragment for f in logger.filters):
            logger.addFilter(_DropFragment(fragment))
    for pattern in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    details = logging.getLogger(DETAIL)
    details.propagate = False
    details.setLevel(logging.INFO)
    if not any(isinstance(h, _ToLogFiles) for h in details.handlers):
        details.addHandler(_ToLogFiles())


class _ToLogFiles(logging.Handler):
    """Hands a record to the root logger's file handlers alone, whatever logging config (Hydra's
    job_logging) made them: the console handlers never see it."""

    def emit(self, record: logging.LogRecord) -> None:
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.FileHandler) and record.levelno >= handler.level:
                handler.handle(record)
