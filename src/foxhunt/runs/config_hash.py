"""The config hash: "the same training", the identity ``resume=true`` finds earlier runs by.

Two runs with the same hash train the same model on the same data with the same settings,
whatever folder, launcher or store they used, so their results are interchangeable. The hash
is the SHA-256 (:data:`HASH_LENGTH` hex digits kept) of the resolved config

- with the values of ``paths`` masked (every launch writes into a new timestamped folder; a
  value that interpolates a path, such as a checkpoint folder, resolves to the same mask), and
- without what does not change the result (:data:`HASH_IGNORED`): how the run is launched
  (``strategy``, Hydra's node) or recorded (``logger``), the ``resume`` switch itself, and what
  only displays or samples it: progress bars and the progress metric, the logging cadence, the
  model summary, the memory callback's sampling cadence, the equity plot, the jobs' progress
  weights (``model.expected_seconds_per_batch``, ``jobs``), where predicted footprints are cached
  (``paths.prediction_cache``: a key runs were hashed without), and
  ``precision=auto``'s explanation of its choice (the precision it chose counts: an auto run that
  chose bf16 hashes as a ``precision=bf16`` one).

Everything else counts: the model, the asset, the data (source, features, split), the
precision, the seed, the training length (``trainer.max_epochs``, ``max_steps``,
``limit_*_batches``), the execution costs, the evaluation (``evaluation.max_bars``), the
checkpoint selection and a starting ``ckpt``. Every training run carries its hash as the tag
``config_hash``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from omegaconf import OmegaConf

HASH_LENGTH = 16
HASH_IGNORED = (
    "hydra",
    "strategy",
    "resume",
    "logger",
    "trainer.log_every_n_steps",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "callbacks.progress",
    "callbacks.progress_bar",
    "callbacks.memory_budget.sample_every_n_steps",
    "callbacks.memory_budget.max_overhead_pct",
    "evaluation.plot_equity",
    "precision.choice",  # precision=auto's explanation (names the hardware); what it chose counts
    "model.expected_seconds_per_batch",  # the jobs' progress weights: how a plan is displayed
    "jobs",
    "paths.prediction_cache",  # where predicted footprints are kept, a key added after runs were hashed without it
)
HASH_MASKED = ("paths",)


def config_hash(cfg: Any) -> str:
    """The hash of what the run ``cfg`` trains (see the module doc)."""
    container = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(container, dict), type(container)  # a run's config is a mapping
    for dotted in HASH_IGNORED:
        _drop(container, dotted.split("."))
    for section in HASH_MASKED:
        if isinstance(container.get(section), dict):
            container[section] = {key: f"<{section}.{key}>" for key in container[section]}
    resolved = OmegaConf.to_container(OmegaConf.create(container), resolve=True)
    text = json.dumps(resolved, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


def _drop(node: dict, path: list[str]) -> None:
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            return
        node = child
    node.pop(path[-1], None)
