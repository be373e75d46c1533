"""The benchmark's settings: ``conf/bench/default.yaml``, ``--quick``, ``--set`` overrides.

The file is read with OmegaConf (it is not a Hydra group of ``conf/train.yaml``); the runs the
benchmark builds compose ``conf/train.yaml`` through :func:`foxhunt.config.compose.compose_config` with
``train_overrides`` and paths under ``work_dir``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from foxhunt.errors import UserError

#: The settings file shipped with the package (conf/ is linked into src/foxhunt/conf).
DEFAULT_SETTINGS = Path(__file__).resolve().parents[1] / "conf" / "bench" / "default.yaml"
SECTIONS = ("rl", "tft", "latency", "overhead", "ensemble", "system", "checkpoint", "roll")
QUICK_KEY = "quick"
#: Where the training sections (rl, tft) train: foxhunt, its peers and the bare loop alike.
DEVICES = ("cpu", "cuda")


class BenchSettingsError(UserError, ValueError):
    """A bad benchmark setting; the message names the key and the file (``scripts/benchmark.py``
    prints it as one line)."""

    kind = "settings"


def load_settings(path: str | Path | None = None, quick: bool = False, overrides: Sequence[str] = ()) -> DictConfig:
    """Settings from ``path`` (default :data:`DEFAULT_SETTINGS`), with the ``quick`` node merged
    over them when ``quick``, then dotted ``key=value`` ``overrides``; checked."""
    source = Path(path) if path else DEFAULT_SETTINGS
    if not source.is_file():
        raise BenchSettingsError(f"benchmark settings {source}: no such file")
    base = OmegaConf.load(source)
    if not isinstance(base, DictConfig):
        raise BenchSettingsError(f"benchmark settings {source}: expected a mapping of sections, got a list")
    quick_node = base.pop(QUICK_KEY, None)
    if quick and quick_node is not None:
        merged = OmegaConf.merge(base, quick_node)
        assert isinstance(merged, DictConfig)  # a mapping merged with a node stays one (a list node raises)
        base = merged
    for item in overrides:
        if "=" not in item:
            raise BenchSettingsError(f"benchmark setting {item!r}: expected key=value ({source})")
        key, value = item.split("=", 1)
        if OmegaConf.select(base, key, default=None) is None:
            raise BenchSettingsError(f"benchmark setting {key!r}: unknown key in {source}")
        OmegaConf.update(base, key, yaml.safe_load(value), merge=False)
    _check(base, source)
    return base


def _check(cfg: DictConfig, source: Path) -> None:
    device = cfg.get("device")
    if device not in DEVICES:
        raise BenchSettingsError(f"device={device!r}: must be one of {list(DEVICES)} ({source})")
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchSettingsError(f"device=cuda: torch sees no CUDA device on this machine ({source})")
    for key in ("repeats",):
        if int(cfg[key]) < 1:
            raise BenchSettingsError(f"{key}={cfg[key]}: must be >= 1 ({source})")
    confidence = cfg.get("confidence")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise BenchSettingsError(f"confidence={confidence!r}: must be a number between 0 and 1, e.g. 0.9 ({source})")
    threads = list(cfg.threads)
    if not threads or any(int(t) < 1 for t in threads):
        raise BenchSettingsError(f"threads={threads}: need a list of integers >= 1 ({source})")
    unknown = [s for s in cfg.sections if s not in SECTIONS]
    if unknown:
        raise BenchSettingsError(f"sections: unknown {unknown}, use any of {list(SECTIONS)} ({source})")
    for section, key in (
        ("rl.ppo", "steps"),
        ("rl.dqn", "steps"),
        ("tft", "steps"),
        ("latency", "iterations"),
        ("overhead", "train_batches"),
    ):
        value = OmegaConf.select(cfg, f"{section}.{key}")
        if value is None or int(value) < 1:
            raise BenchSettingsError(f"{section}.{key}={value}: must be >= 1 ({source})")
