"""What a run's predicted memory decides before it trains: the prediction itself, cached per model
config, and ``activation_checkpointing: auto``.

**The prediction** (:func:`cached_prediction`) is :func:`foxhunt.memory.predict.predict_footprint`
of the run's config (the training footprint: parameters, gradients and optimizer state from a
meta-device model, activations and model-owned state from two probe fits at tiny batches,
extrapolated to the configured batch), cut to :data:`~foxhunt.training.parts.MEASURE_DATA_DAYS`
days of synthetic bars for its probes. Probes take seconds to a minute per model on a CPU, so a
prediction is kept in ``paths.prediction_cache`` under a key of what it depends on (the model
section, the precision, the accelerator: :func:`prediction_key`), written whole (a temporary file,
then a rename) and read back checked by content: a damaged or edited file is no prediction, said in
the log, and the next prediction replaces it. The ``parallel`` strategy packs a sweep's cells by
it (:mod:`foxhunt.sweeps.estimates`).

**activation_checkpointing: auto** (a model that has the key: the TFT's variable selections):
:func:`plan_activation_checkpointing` predicts the run's footprint with checkpointing off and
turns it on only when that prediction exceeds the limit the memory-budget callback holds the run
to: the model's ``memory_target_mb``, else the budget's available memory (``total_mb -
headroom_mb``; the prediction leaves out the CUDA context a GPU budget's NVML figure counts).
Recomputing activations trades speed for memory and changes no number: the same weights either
way (``tests/training/test_memory_plan.py``), so the choice is free to follow the budget. It is
made in the run, before its model is built; the config keeps ``auto`` (its hash, what ``resume``
and reproductions look up, does not depend on the choice), the model is built with the choice,
and the run's tag ``activation_checkpointing.choice`` and its log say what was chosen and why.
The probes run in the run's process with every random stream saved before and restored after, so
a run with a prediction to make trains as one that found it cached.

Written by hand: Lightning has no notion of a memory target, and torch's checkpointing is a switch
of the model, not a decision.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from foxhunt.config.schema import validate
from foxhunt.errors import one_line_error
from foxhunt.files import read_regular_file, write_whole
from foxhunt.memory import predict
from foxhunt.memory.budget import MemoryBudget
from foxhunt.training.parts import MEASURE_DATA_DAYS, MEASURING_RUNS

log = logging.getLogger(__name__)

#: The config key a model recomputes activations by, and the value that lets the budget decide.
CHECKPOINTING_KEY = "model.module.activation_checkpointing"
AUTO = "auto"
MAX_PREDICTION_BYTES = 64 * 1024  # a cached prediction is about 300 bytes; a larger file is not one


# ----------------------------------------------------------------------------------- prediction
def prediction_key(cfg: DictConfig) -> str:
    """What a prediction depends on: the model section, the precision, the accelerator."""
    part = {
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "precision": OmegaConf.to_container(cfg.precision, resolve=True),
        "accelerator": str(cfg.trainer.accelerator),
    }
    text = json.dumps(part, sort_keys=True, default=str)
    return f"{cfg.model.name}-{cfg.precision.name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def cached_prediction(cfg: DictConfig, cache_dir: str | Path) -> tuple[float, str]:
    """The predicted training footprint of ``cfg`` in MB and how it was obtained, from the cache
    in ``cache_dir`` or predicted now and cached. Raises what the prediction raises."""
    cache = Path(str(cache_dir)) / f"{prediction_key(cfg)}.json"
    cached = _read_cached(cache)
    if cached is not None:
        mb, how = cached
        return mb, f"predicted (cached in {cache}; {how})"
    mb, how = _predict(cfg, cache.parent / "probes")
    # whole or not at all: runs started at once may predict the same config, and a run killed
    # mid-write must not leave half a file for the next one to read
    write_whole(cache, json.dumps({"mb": mb, "how": how}, indent=2))
    return mb, f"predicted ({how})"


def _read_cached(cache: Path) -> tuple[float, str] | None:
    """A cached prediction checked by content (an object with a finite positive ``mb`` and a
    ``how`` text); a missing, unreadable or malformed file is no prediction (said in the log),
    and the next prediction replaces it."""
    if not cache.exists():
        return None
    try:
        text = read_regular_file(cache, MAX_PREDICTION_BYTES)
        data = json.loads(text) if text is not None else None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        log.warning("%s: ignored, not a prediction (%s)", cache, one_line_error(exc))
        return None
    mb = data.get("mb") if isinstance(data, dict) else None
    how = data.get("how") if isinstance(data, dict) else None
    if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not math.isfinite(mb) or mb <= 0 or not isinstance(how, str):
        log.warning('%s: ignored, not a prediction (expected {"mb": a positive number of MB, "how": text})', cache)
        return None
    return float(mb), how


def _predict(cfg: DictConfig, workdir: Path) -> tuple[float, str]:
    probe = copy.deepcopy(cfg)
    OmegaConf.update(probe, "paths.output_dir", str(workdir), merge=False)
    if "days" in probe.data.source:  # probe fits need a few days of bars, as foxhunt memory's
        OmegaConf.update(probe, "data.source.days", MEASURE_DATA_DAYS, merge=False)
    validate(probe)
    prediction = predict.predict_footprint(probe, MEASURING_RUNS, workdir=workdir)
    how = (
        f"predict_footprint: training footprint, {len(prediction.probes)} probe fits at "
        f"{prediction.batch_key}={[fit[0] for fit in prediction.probes]} extrapolated to {prediction.batch_size}, "
        f"{prediction.seconds:.1f} s"
    )
    return prediction.total_mb, how


# ----------------------------------------------------------------------------------- checkpointing
@dataclass(frozen=True)
class CheckpointingChoice:
    """``activation_checkpointing: auto`` decided: ``on``, and why."""

    on: bool
    why: str

    @property
    def line(self) -> str:
        return f"activation_checkpointing=auto: {'on' if self.on else 'off'} ({self.why})"


def plan_activation_checkpointing(cfg: DictConfig) -> tuple[DictConfig, CheckpointingChoice | None]:
    """``cfg`` with ``activation_checkpointing: auto`` decided (a copy, the key true or false), and
    the choice; ``cfg`` itself and None where the key is absent or not ``auto``. See the module doc."""
    if OmegaConf.select(cfg, CHECKPOINTING_KEY, default=None) != AUTO:
        return cfg, None
    off = _with_checkpointing(cfg, False)
    limit_mb, limit = _limit(cfg)
    try:
        with _random_streams_kept():
            predicted_mb, how = cached_prediction(off, cfg.paths.prediction_cache)
    except Exception as exc:  # no prediction: the model as it is, and the log says why
        choice = CheckpointingChoice(False, f"no prediction of its memory ({one_line_error(exc)})")
        log.warning("%s", choice.line)
        return off, choice
    on = predicted_mb > limit_mb
    verdict = ">" if on else "<="
    choice = CheckpointingChoice(
        on, f"the training footprint without it, {predicted_mb:.2f} MB {verdict} {limit_mb:.2f} MB {limit}; {how}"
    )
    log.info("%s", choice.line)
    return (_with_checkpointing(cfg, True) if on else off), choice


def _with_checkpointing(cfg: DictConfig, on: bool) -> DictConfig:
    chosen = copy.deepcopy(cfg)
    OmegaConf.update(chosen, CHECKPOINTING_KEY, on, merge=False)
    return chosen


def _limit(cfg: DictConfig) -> tuple[float, str]:
    """The limit the memory-budget callback holds the training footprint to."""
    if cfg.model.get("memory_target_mb") is not None:
        return float(cfg.model.memory_target_mb), "(model.memory_target_mb)"
    budget: MemoryBudget = instantiate(cfg.budget)
    return budget.available_mb, f"(budget {budget.name}: {budget.total_mb:g} MB total - {budget.headroom_mb:g} MB headroom)"


@contextmanager
def _random_streams_kept() -> Iterator[None]:
    """Python's, NumPy's and torch's random streams (CUDA's too, where initialized) as they were
    before the block: probe fits seed and draw, the run after them must not see it."""
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    seed_env = {name: os.environ.get(name) for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")}
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        for name, value in seed_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
