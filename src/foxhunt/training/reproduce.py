"""Retraining a run from its stored config, for ``foxhunt runs reproduce`` (the comparison is
:mod:`foxhunt.runs.reproduce`'s).

The stored config (the original run's ``config.yaml`` artifact, checked by
:func:`foxhunt.config.stored.load_stored_config` before this module sees it) is the run's
resolved config, every path in it resolved. The reproduction changes only where it writes and
reads back nothing it did not make:

- every path under the original's ``paths.output_dir`` (its checkpoints, reports) moves to the
  reproduction's folder, ``outputs/reproductions/<date>_<time>_<run name>_<8 hex digits>``, as
  ``${paths.output_dir}/...`` again (a stored config is resolved: written so, the config hash,
  which masks ``paths``, is the original's);
- ``data.cache_dir`` is ``${paths.cache_dir}``, a fresh folder inside it: the bars are read from
  the source again, never from a feature cache another run wrote; ``paths.prediction_cache`` is
  a fresh folder inside it too (the hash masks ``paths``: a stored one could name any folder);
- its MLflow run lands in the store the original was read from, in the experiment
  :data:`~foxhunt.runs.tags.REPRODUCTIONS_EXPERIMENT` (not the original's: leaderboards, selection,
  deflated Sharpe ratios and ``resume=true`` never count a reproduction), tagged
  ``reproduction_of=<the original run>``, with its checkpoints logged; ``resume`` is off;
- torch's intra-op threads are set to those the original trained with (``device.json``), where
  this machine has as many cores: a float reduction split over another number of threads may
  round differently.

Everything else (model, data source and files, split, seed, trainer, precision, ``ckpt``) is the
original's, so its config hash is the original's too. :func:`check_stored_hash` refuses a stored
config that is not the file its run logged: that is what keeps an edited ``config.yaml``
artifact from choosing where a reproduction, a roll's challenger or a registered version writes
or what it trains (a checkpoint folder named into another run's artifacts, a ``../`` file name,
another data file: found by a helper probing stored files). The run's ``config.sha256`` tag is in
the tracking store, the record foxhunt trusts; the artifact store's file is checked against it.
"""

from __future__ import annotations

import copy
import datetime
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from foxhunt.config.resolvers import run_suffix
from foxhunt.errors import ConfigError
from foxhunt.runs.config_hash import config_hash
from foxhunt.runs.provenance import file_sha256
from foxhunt.runs.tags import REPRODUCTIONS_EXPERIMENT, Tag
from foxhunt.training.cell import run_cell

REPRODUCTIONS_FOLDER = Path("outputs") / "reproductions"  # under the project folder
FEATURE_CACHE_FOLDER = "feature_cache"  # inside the reproduction's folder: empty, so never a hit
PREDICTION_CACHE_FOLDER = "memory_predictions"  # inside it too: predicted footprints it made itself
OUTPUT_DIR, CACHE_DIR = "${paths.output_dir}", "${paths.cache_dir}"  # as conf/ writes them


def reproduction_folder(root: Path, run_name: str) -> Path:
    """A new folder for one reproduction under ``root`` (module doc)."""
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in run_name) or "run"
    return root / REPRODUCTIONS_FOLDER / f"{stamp}_{name}_{run_suffix()}"


def reproduction_config(stored: DictConfig, out_dir: Path, tracking_uri: str, artifact_location: str | None) -> DictConfig:
    """The original's stored config, writing into ``out_dir`` and the store at ``tracking_uri``
    (module doc)."""
    plain = OmegaConf.to_container(stored, resolve=False)
    assert isinstance(plain, dict)  # a run's config is a mapping
    old = str(plain.get("paths", {}).get("output_dir") or "")
    if old:
        plain = _moved(plain, old.rstrip("/"), OUTPUT_DIR)
    plain.setdefault("paths", {}).update(output_dir=str(out_dir), cache_dir=str(out_dir / FEATURE_CACHE_FOLDER),
                                         prediction_cache=str(out_dir / PREDICTION_CACHE_FOLDER))  # fmt: skip
    plain.setdefault("data", {})["cache_dir"] = CACHE_DIR
    if isinstance(plain.get("strategy"), dict) and plain["strategy"].get("prediction_cache"):  # unhashed, as strategy is
        plain["strategy"]["prediction_cache"] = "${paths.prediction_cache}"
    logger = plain.setdefault("logger", {})
    logger.update(enabled=True, tracking_uri=tracking_uri, artifact_location=artifact_location,
                  experiment=REPRODUCTIONS_EXPERIMENT, log_checkpoints=True)  # fmt: skip
    plain["resume"] = False
    moved = OmegaConf.create(plain)
    assert isinstance(moved, DictConfig)
    return moved


def stored_hash(stored: DictConfig) -> str:
    """The config hash of a stored (resolved) config as the run that stored it computed it: its
    folders moved back under ``${paths.output_dir}``, as a reproduction moves them (the hash masks
    ``paths`` and ignores the logger, so the folder and store given here do not count)."""
    return config_hash(reproduction_config(stored, Path(OUTPUT_DIR), "", None))


def check_stored_hash(stored: DictConfig, tags: Mapping[str, str], origin: str, path: Path) -> None:
    """Refuse, in one line naming ``origin``, a stored config (its file ``path``, read as
    ``stored``) that is not what its run logged (module doc): its SHA-256 against the run's
    ``config.sha256`` tag; a run logged before that tag, its config hash against ``config_hash``
    (a user's ``${...}`` in an override can make an honest one differ: hashed as typed, stored resolved)."""
    digest = tags.get(Tag.CONFIG_DIGEST)
    if digest:
        if file_sha256(path) != digest:
            raise ConfigError(f"{origin}: config.yaml is not the file its run logged (its SHA-256 differs from the run's "
                              f"{Tag.CONFIG_DIGEST}): the file was changed after the run; refused, nothing trained or written from it")  # fmt: skip
        return
    expected = tags.get(Tag.CONFIG_HASH)
    if not expected:
        raise ConfigError(f"{origin}: its run has no {Tag.CONFIG_DIGEST} or config_hash tag, so its config.yaml cannot be "
                          "checked; refused")  # fmt: skip
    found = stored_hash(stored)
    if found != expected:
        raise ConfigError(f"{origin}: config.yaml hashes to {found}, its run recorded config_hash={expected}: the file was "
                          "changed after the run; refused, nothing trained or written from it")  # fmt: skip


def _moved(node: Any, old: str, new: str) -> Any:
    """``node`` with every string that is ``old`` or a path under it moved under ``new`` (a
    ``paths.output_dir`` itself stays a plain folder: it is set after)."""
    if isinstance(node, dict):
        return {key: _moved(value, old, new) for key, value in node.items()}
    if isinstance(node, list):
        return [_moved(value, old, new) for value in node]
    if isinstance(node, str) and (node == old or node.startswith(old + "/")):
        return new + node[len(old) :]
    return copy.deepcopy(node)


def retrain(cfg: DictConfig, original_run_id: str, run_name: str, threads: int | None) -> str:
    """Train ``cfg`` (a :func:`reproduction_config`) as one run tagged a reproduction of
    ``original_run_id``; its run id."""
    result = run_cell(cfg, before_fit=_thread_setter(threads), extra_tags={Tag.REPRODUCTION_OF: original_run_id},
                      run_name=run_name)  # fmt: skip
    return str(result.run_id)


def _thread_setter(threads: int | None) -> Callable[[], None] | None:
    if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= (os.cpu_count() or 1):
        return None

    def set_threads() -> None:
        torch.set_num_threads(threads)

    return set_threads
