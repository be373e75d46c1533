"""How much memory each cell of a sweep will need, and how many cells fit at once.

A cell's peak is the first of:

1. **measured, same config**: the largest ``memory/device_peak_mb`` (else ``memory/peak_mb``) of
   the FINISHED MLflow runs with the cell's ``config_hash``. The device peak is the figure the
   memory-budget callback checks against the budget (NVML minus its baseline on a GPU budget,
   RSS on a CPU budget, the accounted components with no CUDA device), so it is the one that
   must fit;
2. **predicted** (``strategy.predict_memory: true``) by
   :func:`foxhunt.training.memory_plan.cached_prediction`: parameters, gradients and optimizer state
   from a meta-device model, activations and model-owned state from two probe fits at tiny
   batches. It is the training footprint (accounted components, or CUDA-allocated bytes on a
   GPU): it leaves out the CUDA context that NVML counts. The probes take seconds to a minute
   per model on a CPU, so predictions are cached per model config (model section, precision,
   accelerator: the asset changes no tensor's shape) in ``strategy.prediction_cache``;
3. **measured, same cell**: as 1, among FINISHED runs with the same ``model``, ``asset`` and
   ``precision`` tags on the same budget (param ``budget.name``), whatever their other settings;
4. **fallback**: the model's own ``model.memory_target_mb``, the limit the memory-budget callback
   holds the run's peak to; a model without a target counts as the whole available budget, so
   it runs alone.

Packing (:func:`pack`): jobs on one device (or on the CPU) share the budget, so ``n_jobs`` is
the largest ``k`` such that the ``k`` largest peaks together fit in ``available_mb`` (any ``k``
cells may run at the same time, the largest ones included), never above the cores nor the
number of cells. On several GPUs each job has a device of its own: ``n_jobs`` is at most the
number of devices and each cell only has to fit alone. A cell whose peak alone exceeds the
available memory is left out of the packing; its job fails fast with one line, before
training (:func:`check_fits`).

A search sweep (``plan.search``: what each searched key was planned at) has one estimate per
cell of its largest trial (:mod:`foxhunt.sweeps.search`) and up to ``trials`` trials at
once (``hydra.sweeper.n_jobs``): ``n_jobs`` is the largest ``k`` such that ``k`` copies of
the largest estimate fit. A trial fits when that bound does; otherwise its own peak is
estimated when it starts (:func:`estimate_peak`, the sources above) and checked the same way.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, cast

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from foxhunt.config.schema import MAX_CORES
from foxhunt.errors import UserError, one_line_error
from foxhunt.files import read_regular_file, write_whole
from foxhunt.runs.cell import CellKey, cell_name
from foxhunt.runs.config_hash import config_hash
from foxhunt.runs.status import Status
from foxhunt.runs.store import RunStore
from foxhunt.runs.tags import Param, Tag
from foxhunt.sweeps.resources import AUTO, threads_per_job
from foxhunt.sweeps.search import trial_number
from foxhunt.training import memory_plan

log = logging.getLogger(__name__)

PLAN_FILE = "packing.json"  # in the sweep folder, read by each job
MEASURED_METRICS = ("memory/device_peak_mb", "memory/peak_mb")
MEASURED_RUNS_LIMIT = 50  # most recent matching runs read per cell


class CellExceedsBudget(RuntimeError):
    """A cell whose estimated peak alone exceeds the budget; raised before training."""


@dataclass(frozen=True)
class PeakEstimate:
    cell: str
    mb: float
    source: str  # how the figure was obtained (predicted / measured / fallback, and from what)


@dataclass
class PackingPlan:
    """The ``parallel`` strategy's decision, written to ``<sweep dir>/packing.json``."""

    n_jobs: int
    threads_per_job: int
    cores: int
    devices: int
    budget: str
    available_mb: float
    limited_by: str
    estimates: dict[str, PeakEstimate] = field(default_factory=dict)
    seconds: float = 0.0  # time spent estimating and planning, before any job
    search: dict[str, str] | None = None  # a search sweep: the value each searched key was planned at

    @property
    def too_big(self) -> list[str]:
        return sorted({e.cell for e in self.estimates.values() if e.mb > self.available_mb})

    @property
    def bound_mb(self) -> float:
        """A search sweep's bound on every trial's peak: its largest trial's estimate."""
        return max((e.mb for e in self.estimates.values()), default=0.0)

    def describe(self) -> str:
        what = "largest trial of a search" if self.search is not None else f"{len(self.estimates)} cells"
        line = (
            f"packing: {what}, n_jobs={self.n_jobs} ({self.limited_by}), "
            f"{self.threads_per_job} torch thread(s) per job, budget {self.budget} {self.available_mb:g} MB, "
            f"planned in {self.seconds:.1f} s"
        )
        if self.search is not None and self.too_big:
            line += f"; the largest trial ({self.bound_mb:.0f} MB) is over the budget: each trial is estimated when it starts"
        elif self.too_big:
            line += f"; over the budget alone, will fail: {', '.join(self.too_big)}"
        return line

    def write(self, sweep_dir: Path) -> Path:
        """``<sweep_dir>/packing.json``, whole or not at all (a job never reads half a plan)."""
        path = Path(sweep_dir) / PLAN_FILE
        write_whole(path, json.dumps(asdict(self), indent=2, sort_keys=True))
        return path

    @classmethod
    def read(cls, sweep_dir: Path) -> PackingPlan | None:
        """The plan in ``sweep_dir`` (None when there is none), checked by content: a regular file
        of at most :data:`MAX_PLAN_BYTES` whose fields have the types and ranges :meth:`write`
        gives them. The sweep folder may be written by others, and the plan's values reach
        ``torch.set_num_threads`` and the budget check: a bad one is a :class:`PlanFileError`
        naming the file and the field, and no job trains on it."""
        path = Path(sweep_dir) / PLAN_FILE
        if not os.path.lexists(path):
            return None
        try:
            text = read_regular_file(path, MAX_PLAN_BYTES)
            if text is None:
                raise ValueError(f"not a regular file of at most {MAX_PLAN_BYTES} bytes")
            return cls.from_dict(json.loads(text))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            reason = "nested too deep" if isinstance(exc, RecursionError) else one_line_error(exc, with_type=False, limit=200)
            raise PlanFileError(f"{path}: not a packing plan foxhunt wrote ({reason}): not started") from None

    @classmethod
    def from_dict(cls, data: Any) -> PackingPlan:
        """The plan ``data`` describes; ``ValueError`` naming the first field that is not as
        :meth:`write` writes it."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        unknown = sorted(set(data) - set(_PLAN_FIELDS))
        missing = sorted(set(_PLAN_FIELDS) - set(data))
        if unknown:
            raise ValueError(f"fields foxhunt does not write: {', '.join(unknown)}"[:200])
        if missing:
            raise ValueError(f"fields missing: {', '.join(missing)}")
        for name in ("n_jobs", "threads_per_job", "cores"):
            _check_count(name, data[name], 1)
        _check_count("devices", data["devices"], 0)
        for name in ("available_mb", "seconds"):
            _check_amount(name, data[name])
        for name in ("budget", "limited_by"):
            _check_text(name, data[name])
        estimates = data["estimates"]
        if not isinstance(estimates, dict):
            raise ValueError("estimates: not an object")
        checked = {}
        for key, value in estimates.items():
            if not isinstance(value, dict) or set(value) != {"cell", "mb", "source"}:
                raise ValueError(f"estimates[{key[:40]!r}]: not an object of cell, mb and source")
            _check_text(f"estimates[{key[:40]!r}].cell", value["cell"])
            _check_text(f"estimates[{key[:40]!r}].source", value["source"])
            _check_amount(f"estimates[{key[:40]!r}].mb", value["mb"])
            checked[key] = PeakEstimate(value["cell"], float(value["mb"]), value["source"])
        search = data["search"]
        if search is not None and not (isinstance(search, dict) and all(isinstance(v, str) for v in search.values())):
            raise ValueError("search: not null or an object of texts")
        values = {**data, "estimates": checked, "available_mb": float(data["available_mb"]), "seconds": float(data["seconds"])}
        return cls(**values)


class PlanFileError(UserError, ValueError):
    """A sweep folder's ``packing.json`` that foxhunt did not write as it stands."""

    kind = "sweep"


MAX_PLAN_BYTES = 64 * 1024 * 1024  # about 200 bytes a cell: a grid of 300,000 cells
_PLAN_FIELDS = {f.name for f in fields(PackingPlan)}


def _check_count(name: str, value: Any, low: int) -> None:
    """Cores, jobs, threads or devices: the config's bound on them (torch.set_num_threads reads one)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_CORES:
        raise ValueError(f"{name}: {str(value)[:40]!r} is not an integer in [{low}, {MAX_CORES}]")


def _check_amount(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}: {str(value)[:40]!r} is not a finite number >= 0")


def _check_text(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name}: {str(value)[:40]!r} is not a text")


def available_mb(cfg: DictConfig) -> float:
    return float(cfg.budget.total_mb) - float(cfg.budget.headroom_mb)


def budget_text(cfg: DictConfig) -> str:
    return (
        f"{available_mb(cfg):g} MB available on budget {cfg.budget.name} "
        f"({cfg.budget.total_mb:g} MB total - {cfg.budget.headroom_mb:g} MB headroom)"
    )


def estimate_peak(cfg: DictConfig, digest: str) -> PeakEstimate:
    """The cell's peak memory (see the module doc for the order of the sources)."""
    key = CellKey.from_config(cfg, digest)
    name = key.name
    tracked = bool(cfg.logger.enabled)
    found = _measured(cfg, {Tag.CONFIG_HASH: digest}, {}, "same config") if tracked else None
    if found is None and cfg.strategy.get("predict_memory", False):
        found = _predicted(cfg)
    if found is None and tracked:
        same_cell = {Tag.MODEL: key.model, Tag.ASSET: key.asset, Tag.PRECISION: key.precision}
        found = _measured(cfg, same_cell, {Param.BUDGET_NAME: str(cfg.budget.name)}, "same model, asset, precision and budget")
    if found is not None:
        return PeakEstimate(name, *found)
    if cfg.model.memory_target_mb is not None:
        return PeakEstimate(
            name, float(cfg.model.memory_target_mb), "fallback: model.memory_target_mb (no measurement, no prediction)"
        )
    return PeakEstimate(name, available_mb(cfg), "fallback: no target, measurement or prediction: the whole budget")


def _measured(cfg: DictConfig, tags: dict, params: dict, what: str) -> tuple[float, str] | None:
    runs = RunStore(cfg.logger.tracking_uri).search(
        cfg.logger.experiment, tags=tags, params=params, status=Status.FINISHED, max_results=MEASURED_RUNS_LIMIT
    )
    for metric in MEASURED_METRICS:
        values = [(r.metrics[metric].value, r.run_id) for r in runs if metric in r.metrics]
        if values:
            mb, run_id = max(values)
            return mb, f"measured: max {metric} of {len(values)} FINISHED run(s) with the {what} (run {run_id})"
    return None


def _predicted(cfg: DictConfig) -> tuple[float, str] | None:
    """The cell's predicted training footprint (:func:`foxhunt.training.memory_plan.cached_prediction`,
    cached in ``strategy.prediction_cache``); ``None`` when it fails."""
    try:
        return memory_plan.cached_prediction(cfg, cfg.strategy.prediction_cache)
    except Exception as exc:  # a prediction that cannot run leaves the next source
        log.warning("%s: no memory prediction (%s)", CellKey.from_config(cfg).name, one_line_error(exc))
        return None


def pack(peaks: list[float], available: float, cap: int) -> int:
    """Largest ``k <= cap`` such that the ``k`` largest fitting peaks sum to ``<= available``."""
    fitting = sorted((p for p in peaks if p <= available), reverse=True)
    total, k = 0.0, 0
    for peak in fitting[: max(1, cap)]:
        if total + peak > available:
            break
        total += peak
        k += 1
    return max(1, k)


def plan_packing(
    estimates: dict[str, PeakEstimate],
    available: float,
    budget: str,
    cores: int,
    devices: int,
    requested: int | str,
    trials: int | None = None,
) -> PackingPlan:
    """``n_jobs`` and threads per job for these cells, or for up to ``trials`` trials at once
    of a search bounded by the largest of these estimates (see the module doc)."""
    if trials is None:
        limits = {"cores": cores, "cells": max(1, len(estimates))}
        peaks = [e.mb for e in estimates.values()]
    else:
        limits = {"cores": cores, "hydra.sweeper.n_jobs": max(1, trials)}
        peaks = [max((e.mb for e in estimates.values()), default=0.0)] * max(1, trials)
    if devices > 1:
        limits["devices"] = devices
    if str(requested) != AUTO:
        limits["strategy.n_jobs"] = int(requested)
    cap_name = min(limits, key=lambda k: limits[k])
    cap = limits[cap_name]
    if str(requested) != AUTO and int(requested) > cap:
        log.warning("strategy.n_jobs=%s lowered to %d (%s)", requested, cap, cap_name)
    n_jobs, limited_by = cap, f"{cap_name}: {cap}"
    if devices <= 1:  # every job on the same memory
        packed = pack(peaks, available, cap)
        if packed < cap:
            n_jobs, limited_by = packed, f"memory: the {packed + 1} largest peaks exceed {available:g} MB"
    return PackingPlan(n_jobs, threads_per_job(n_jobs, cores), cores, devices, budget, available, limited_by, estimates)


def check_fits(cfg: DictConfig, sweep_dir: Path) -> None:
    """Raise :class:`CellExceedsBudget` (one line) when the packing plan found this cell too big."""
    plan = PackingPlan.read(sweep_dir)
    if plan is None:
        return
    if plan.search is not None:  # a trial: within the bound, or its own estimate
        if plan.bound_mb <= available_mb(cfg):
            return

        found = estimate_peak(cfg, config_hash(cfg))
        estimate: PeakEstimate | None = PeakEstimate(cell_name(CellKey.from_config(cfg), trial_number()), found.mb, found.source)
    else:  # the plan lists the jobs by number (Hydra's job.num); called outside a job: by the cell's name
        estimate = plan.estimates.get(str(_job_number()))
        if estimate is None:
            name = CellKey.from_config(cfg).name
            estimate = max((e for e in plan.estimates.values() if e.cell == name), key=lambda e: e.mb, default=None)
    if estimate is not None and estimate.mb > available_mb(cfg):
        raise CellExceedsBudget(
            f"{'trial' if plan.search is not None else 'cell'} {estimate.cell} needs {estimate.mb:.0f} MB ({estimate.source}) > {budget_text(cfg)}: not started"
        )


def _job_number() -> int | None:
    if not HydraConfig.initialized():
        return None
    hydra_cfg = cast(DictConfig, HydraConfig.get())  # typed as the HydraConf dataclass; it is its DictConfig
    return OmegaConf.select(hydra_cfg, "job.num", default=None, throw_on_missing=False)
