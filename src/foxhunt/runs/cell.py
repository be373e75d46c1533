"""A cell of the model x asset grid: its key, and the result a sweep records for it.

:class:`CellKey` is what names a cell everywhere: model, asset, precision and seed (the
``CELL_TAGS`` of its runs), and the config hash (:mod:`foxhunt.runs.config_hash`) that says
"the same training". A job's plan, its views and the sweep's results all hold one.

:class:`CellResult` is what became of a cell in one sweep: FINISHED, FAILED, KILLED, or
SKIPPED (``resume=true`` found it FINISHED in an earlier run, whose metrics it reports). A
sweep job writes it as ``cell.json`` in its folder (read back for the summary); a skip is also
written as a tag on the sweep's parent run (``Tag.SKIPPED_PREFIX``), since the cell has no run
of its own in that sweep and ``foxhunt train status`` shows it from there.

In a search sweep (``hparams_search=...``) every job is a *trial*: the sweeper picks its
config, so several trials share a cell's model, asset and precision. A trial's result carries
its number (the Hydra job number), the overrides the sweeper gave it and the value the job
returned to the sweeper (``objective``); its name, :func:`cell_name`, is the cell's with
``-trial<N>`` (MLflow run name, summary row).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from foxhunt.runs.status import Status
from foxhunt.runs.tags import Tag

log = logging.getLogger(__name__)

CELL_RESULT_FILE = "cell.json"  # a sweep job's result, in its own folder of the sweep


@dataclass(frozen=True)
class CellKey:
    model: str
    asset: str
    precision: str
    seed: str = ""
    config_hash: str = ""

    @property
    def name(self) -> str:
        """``{model}-{asset}-{precision}``: the MLflow run name and the cell's folder."""
        return f"{self.model}-{self.asset}-{self.precision}"

    @property
    def grid(self) -> tuple[str, str, str, str]:
        """Its place in a job's grid (a job's cells differ in these, whatever their hashes)."""
        return (self.model, self.asset, self.precision, self.seed)

    def tags(self) -> dict[str, str]:
        tags = {Tag.MODEL: self.model, Tag.ASSET: self.asset, Tag.PRECISION: self.precision, Tag.SEED: self.seed}
        if self.config_hash:
            tags[Tag.CONFIG_HASH] = self.config_hash
        return tags

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> CellKey:
        return cls(*(str(tags.get(key, "")) for key in (Tag.MODEL, Tag.ASSET, Tag.PRECISION, Tag.SEED, Tag.CONFIG_HASH)))

    @classmethod
    def from_config(cls, cfg: Any, config_hash: str = "") -> CellKey:
        return cls(str(cfg.model.name), str(cfg.asset.key), str(cfg.precision.name), str(cfg.seed), config_hash)

    def to_dict(self) -> dict[str, str]:
        return {"model": self.model, "asset": self.asset, "precision": self.precision, "seed": self.seed,
                "config_hash": self.config_hash}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CellKey:
        return cls(str(data["model"]), str(data["asset"]), str(data["precision"]), str(data.get("seed") or ""),
                   str(data.get("config_hash") or ""))  # fmt: skip


def cell_name(key: CellKey, trial: int | None = None) -> str:
    """A cell's name, or a search trial's: ``dqn-es-fp32``, ``dqn-es-fp32-trial3``."""
    return key.name if trial is None else f"{key.name}-trial{trial}"


#: Metrics a skipped cell's parent-run tag keeps (what the job commands show).
SKIP_TAG_METRICS = ("train/loss", "val/sharpe", "memory/peak_mb")


@dataclass
class CellResult:
    key: CellKey
    status: str = Status.FAILED
    run_id: str | None = None  # the run that holds the result (a skipped cell: the earlier one)
    error: str | None = None
    wall_s: float | None = None  # a skipped cell: the earlier run's duration
    note: str | None = None  # what resume did: skipped for / resumed from which run and checkpoint
    metrics: dict[str, float] = field(default_factory=dict)
    trial: int | None = None  # a search sweep's trial number; None for a grid cell
    overrides: list[str] | None = None  # a trial's Hydra overrides (what the sweeper chose among them)
    objective: float | None = None  # what the job returned to the sweeper (None: nothing, or it failed)
    scores: dict = field(
        default_factory=dict, repr=False, compare=False
    )  # split -> SplitScore of a run trained in this process (not in cell.json)

    @property
    def cell(self) -> str:
        return cell_name(self.key, self.trial)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {**self.key.to_dict(), "status": str(self.status), "run_id": self.run_id, "error": self.error,
                "wall_s": self.wall_s, "note": self.note, "metrics": dict(self.metrics)}  # fmt: skip
        if self.trial is not None:
            data.update(trial=self.trial, overrides=self.overrides, objective=self.objective)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], status: str = Status.FAILED) -> CellResult:
        wall, trial, objective, overrides = (data.get(k) for k in ("wall_s", "trial", "objective", "overrides"))
        return cls(
            key=CellKey.from_dict(data), status=str(data.get("status") or status), run_id=data.get("run_id"),
            error=data.get("error"), wall_s=None if wall is None else float(wall), note=data.get("note"),
            metrics={str(k): float(v) for k, v in (data.get("metrics") or {}).items()},
            trial=None if trial is None else int(trial), overrides=None if overrides is None else [str(o) for o in overrides],
            objective=None if objective is None else float(objective),
        )  # fmt: skip

    # -- cell.json -----------------------------------------------------------------------
    def write(self, folder: Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / CELL_RESULT_FILE
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True, default=float))
        return path

    @classmethod
    def read(cls, path: Path) -> CellResult:
        return cls.from_dict(json.loads(Path(path).read_text()))

    # -- the parent-run tag of a skip --------------------------------------------------------
    def skip_tag(self) -> tuple[str, str]:
        """The (key, value) of the sweep parent-run tag that records this skip."""
        kept = {k: float(v) for k, v in self.metrics.items() if k in SKIP_TAG_METRICS and v == v}
        value = replace(self, metrics=kept, overrides=None).to_dict()
        return f"{Tag.SKIPPED_PREFIX}{self.cell}-s{self.key.seed}", json.dumps(value, sort_keys=True)

    @classmethod
    def from_skip_tag(cls, value: str) -> CellResult | None:
        """The skip a tag records; None for a value this reader does not understand."""
        try:
            return cls.from_dict(json.loads(value), status=Status.SKIPPED)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def skipped_cells(tags: Mapping[str, str]) -> list[CellResult]:
    """The cells a parent run's tags record as skipped (``Tag.SKIPPED_PREFIX``)."""
    found = (CellResult.from_skip_tag(v) for k, v in sorted(tags.items()) if k.startswith(Tag.SKIPPED_PREFIX))
    return [cell for cell in found if cell is not None]


def read_results(sweep_dir: Path) -> list[CellResult]:
    """Every job's ``cell.json`` in a sweep folder, by cell (a search's trials: by number); an unreadable one is logged."""
    results = []
    for path in sorted(Path(sweep_dir).glob(f"*/{CELL_RESULT_FILE}")):
        try:
            results.append(CellResult.read(path))
        except (OSError, ValueError, TypeError, KeyError, RecursionError) as exc:
            log.error("unreadable cell result %s: %s", path, type(exc).__name__ if isinstance(exc, RecursionError) else exc)
    return sorted(results, key=lambda r: (r.trial is not None, r.trial or 0, r.key.model, r.key.asset, r.key.precision))
