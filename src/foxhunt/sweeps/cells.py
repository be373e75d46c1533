"""Identity of one grid cell: its name, its sweep folder, its result record, its config hash.

The config hash says "the same training": two runs with the same hash would train the same
model on the same data with the same settings, whatever folder, launcher or tracking store
they used. It is the SHA-256 of the resolved config with the ``paths`` values masked (a sweep
writes into a new timestamped folder each time) and without the keys that choose how a run is
launched or recorded (``strategy``, ``resume``, ``logger``, Hydra's own node). Every run
carries it as the MLflow tag ``config_hash``; ``resume=true`` finds earlier runs by it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

CELL_RECORD = "cell.json"  # a job's result, in its own folder of the sweep
HASH_EXCLUDED_KEYS = ("hydra", "strategy", "resume", "logger")
HASH_LENGTH = 16  # hex digits kept

# Statuses of a cell in a sweep: MLflow's run statuses, plus SKIPPED for a cell that
# resume=true found FINISHED in an earlier run (its metrics are that run's).
FINISHED, FAILED, KILLED, SKIPPED = "FINISHED", "FAILED", "KILLED", "SKIPPED"
OK_STATUSES = (FINISHED, SKIPPED)


def cell_name(cfg: DictConfig) -> str:
    """``{model}-{asset}-{precision}``: the MLflow run name and the key of a cell in a sweep."""
    return f"{cfg.model.name}-{cfg.asset.key}-{cfg.precision.name}"


def config_hash(cfg: DictConfig) -> str:
    """The hash of what a run trains (see the module doc)."""
    container = OmegaConf.to_container(cfg, resolve=False)
    for key in HASH_EXCLUDED_KEYS:
        container.pop(key, None)
    container["paths"] = {key: f"<paths.{key}>" for key in container.get("paths", {})}
    resolved = OmegaConf.to_container(OmegaConf.create(container), resolve=True)
    text = json.dumps(resolved, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


def in_multirun() -> bool:
    """True inside a job of ``foxhunt-train -m``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def current_sweep_dir() -> Path:
    """The sweep folder of the running job (``hydra.sweep.dir``)."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().sweep.dir)


@dataclass
class CellRecord:
    """What one job of a sweep reports (``cell.json`` in its folder), read by the summary."""

    cell: str
    model: str
    asset: str
    precision: str
    config_hash: str
    status: str = FAILED
    run_id: str | None = None
    error: str | None = None
    wall_s: float | None = None
    note: str | None = None  # skipped / resumed: from which run or checkpoint
    metrics: dict[str, float] = field(default_factory=dict)

    @classmethod
    def for_config(cls, cfg: DictConfig, digest: str) -> "CellRecord":
        return cls(cell_name(cfg), cfg.model.name, cfg.asset.key, cfg.precision.name, digest)

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / CELL_RECORD
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True, default=float))
        return path

    @classmethod
    def read(cls, path: Path) -> "CellRecord":
        data: dict[str, Any] = json.loads(path.read_text())
        return cls(**data)


def read_records(sweep_dir: Path) -> list[CellRecord]:
    """Every job's record in a sweep folder, by cell name; an unreadable one is logged."""
    records = []
    for path in sorted(Path(sweep_dir).glob(f"*/{CELL_RECORD}")):
        try:
            records.append(CellRecord.read(path))
        except (OSError, ValueError, TypeError) as exc:
            log.error("unreadable cell record %s: %s", path, exc)
    return sorted(records, key=lambda r: (r.model, r.asset, r.precision))
