"""Warm start: a fit whose weights start from another model's, its loop fresh.

``ckpt=`` continues a fit: weights, optimizer moments, step counters and schedules, so a
checkpoint at its last epoch trains nothing more. A warm start takes only the weights: the
module's state dict from a foxhunt checkpoint (``state_dict`` of a ``.ckpt``) or a registered
version's ``weights.pt``, loaded when the fit starts (after ``precision=int8`` has quantized the
layers, before the first step; the optimizer holds the same parameter tensors, so it steps the
loaded values), with a fresh optimizer, fresh counters and, for the agents, an empty replay
buffer. ``foxhunt ensemble roll`` sets it with ``roll.init=champion``: the challenger starts
from the champion's weights on the moved window.

The file is read with ``torch.load(weights_only=True)`` (tensors and plain containers, no code)
and must fit the module exactly (every key, every shape): a file of another family, size or
precision is one line naming ``callbacks.warm_start.path``. A resumed fit (``resume=true``)
restores its own weights and is not warm-started again. The file's SHA-256 is logged as the run's
tag ``warm_start.sha256``, so what the run started from is recorded by content.

Written here rather than taken from Lightning: its ``ckpt_path`` restores the loop with the
weights, and ``LightningModule.load_from_checkpoint`` builds a new module outside the Trainer
(before the precision plugin has quantized it).
"""

from __future__ import annotations

import hashlib
import io
import logging
import zipfile
from pathlib import Path

import lightning.pytorch as pl
import torch

from foxhunt.errors import ConfigError
from foxhunt.runs.tracked_run import trainer_runs

log = logging.getLogger(__name__)

KEY = "callbacks.warm_start.path"
SHA_TAG = "warm_start.sha256"
WHAT = "a foxhunt .ckpt or a registered version's weights.pt"


def read_weights(path: Path, key: str = KEY) -> tuple[dict, str]:
    """The module state dict in ``path`` (a foxhunt ``.ckpt`` or a version's ``weights.pt``) and
    the SHA-256 of the bytes it was read from (the file is read once)."""
    where = f"{key}={path}"
    if not path.is_file():
        raise ConfigError(f"{where}: no such file ({WHAT})")
    data = path.read_bytes()
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise ConfigError(f"{where}: not a torch.save archive ({WHAT})")
    try:
        loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 (whatever the unpickler refuses: the file is the user's input)
        raise ConfigError(
            f"{where}: not loadable with weights_only=True ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})"
        ) from None
    state = loaded.get("state_dict", loaded) if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"{where}: holds no state dict of tensors")
    return state, hashlib.sha256(data).hexdigest()


class WarmStart(pl.Callback):
    """Load ``path``'s weights into the module when a fresh fit starts (module doc); ``path``
    None: nothing (the weights start from the seed)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = None if path in (None, "") else Path(path).expanduser()
        if self.path is not None and not self.path.is_file():  # before the data and the model are built
            raise ConfigError(f"{KEY}={self.path}: no such file ({WHAT})")
        self.sha256: str | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.path is None or trainer.ckpt_path:  # a resumed fit restored its own weights
            return
        state, digest = read_weights(self.path)
        try:
            pl_module.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            first = " ".join(str(exc).split())[:300]
            raise ConfigError(f"{KEY}={self.path}: the weights do not fit this run's model ({first})") from None
        self.sha256 = digest
        log.info("warm start: weights from %s (sha256 %s)", self.path, self.sha256[:12])

        for store, run_id in trainer_runs(trainer):
            store.tag(run_id, {SHA_TAG: self.sha256})
