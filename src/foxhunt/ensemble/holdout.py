"""The lockbox, opened once: each registered champion scored on the bars nothing else ever read.

``evaluation.holdout`` keeps the last fraction of the bars out of every split and fold
(:mod:`foxhunt.data.splits`): no training, selection, sweep or search reads them.
``foxhunt ensemble register --holdout`` opens the lockbox for the champions it registered (or
kept): each champion's model is rebuilt from its registered version (weights and the deployed
run's resolved config, so the lockbox is exactly the one that run kept), its positions on the
lockbox bars go through the shared backtest with the baselines, and the figures are recorded on
the champion's training run (the cell run for a walk-forward cell) as ``holdout/<metric>``
metrics with the tags ``holdout.opened`` (when, UTC) and ``holdout.version`` (the registered
version scored).

Once: a run whose lockbox was opened is not scored again; its recorded figures are reported,
with when they were recorded, so looking again cannot turn the lockbox into one more selection
split. A champion trained without a lockbox (``evaluation.holdout=null``) is said so in its line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch
from hydra.utils import instantiate

from foxhunt.data.splits import HOLDOUT
from foxhunt.ensemble.member_files import ARTIFACTS_DIR, MemberFiles
from foxhunt.ensemble.rebuild import rebuild_model
from foxhunt.ensemble.registry import Registered, download_version
from foxhunt.evaluation.scoring import ScoringSettings, score_positions
from foxhunt.runs.store import RunStore
from foxhunt.training.parts import build_datamodule, build_dataset

PREFIX = "holdout/"
OPENED_TAG, VERSION_TAG = "holdout.opened", "holdout.version"
SHOWN = ("sharpe", "sharpe_ci_low", "sharpe_ci_high", "sortino", "pnl", "max_drawdown", "exposure", "steps")


@dataclass
class HoldoutReport:
    """One champion's lockbox figures: measured now, recorded earlier, or why there are none."""

    name: str
    version: str | None
    run_id: str
    metrics: dict[str, float] = field(default_factory=dict)
    opened: str | None = None  # when the figures were recorded (UTC ISO)
    fresh: bool = False  # scored by this call
    note: str = ""

    def line(self) -> str:
        if not self.metrics:
            return f"{self.name} version {self.version}: {self.note}"
        figures = ", ".join(f"{k} {self.metrics[PREFIX + k]:.4g}" for k in SHOWN if PREFIX + k in self.metrics)
        base = _best_baseline(self.metrics)
        when = f"opened now ({self.opened})" if self.fresh else f"opened {self.opened}: its recorded figures, not scored again"
        return f"{self.name} version {self.version} on the lockbox, {when}: {figures}{base}"


def open_lockbox(tracking_uri: str, registered: list[Registered], workdir: Path) -> list[HoldoutReport]:
    """Score each registered champion on its lockbox once, or read back what was recorded."""
    store = RunStore(tracking_uri)
    reports = []
    for entry in registered:
        run = store.get(entry.run_id)
        if run.tags.get(OPENED_TAG):
            recorded = {k: v for k, v in run.metric_values().items() if k.startswith(PREFIX)}
            reports.append(HoldoutReport(entry.name, run.tags.get(VERSION_TAG, entry.version), entry.run_id, recorded,
                                         run.tags[OPENED_TAG]))  # fmt: skip
            continue
        folder, _ = download_version(tracking_uri, entry.name, None, int(entry.version), workdir / entry.name)
        report = _score(MemberFiles.read(folder / ARTIFACTS_DIR, entry.name), entry)
        if report.metrics:
            store.log_metrics(entry.run_id, report.metrics)
            store.tag(entry.run_id, {OPENED_TAG: report.opened, VERSION_TAG: entry.version})
        reports.append(report)
    return reports


def _score(files: MemberFiles, entry: Registered) -> HoldoutReport:
    cfg = files.cfg
    if not cfg.evaluation.get("holdout"):
        return HoldoutReport(entry.name, entry.version, entry.run_id,
                             note="trained without a lockbox (evaluation.holdout=null): nothing to open")  # fmt: skip
    asset = instantiate(cfg.asset)
    dataset = build_dataset(cfg, asset, open_holdout=True, cached=False)
    model = rebuild_model(cfg, files.state, origin=f"{entry.name} version {entry.version}")
    arrays = dataset.splits[HOLDOUT]
    settings = ScoringSettings.from_config(cfg, asset)
    with torch.inference_mode():
        positions = model.trading_positions(build_datamodule(cfg, dataset), HOLDOUT)
    score = score_positions(positions, arrays.close, arrays.timestamps, asset, settings, roll_price=arrays.roll_price)
    metrics = {f"{PREFIX}{k}": float(v) for k, v in score.metrics(settings).items()}
    opened = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return HoldoutReport(entry.name, entry.version, entry.run_id, metrics, opened, fresh=True)


def _best_baseline(metrics: dict[str, float]) -> str:
    found = {k.split("/")[-2]: v for k, v in metrics.items() if k.startswith(f"{PREFIX}baseline/") and k.endswith("/sharpe")}
    if not found:
        return ""
    name, value = max(found.items(), key=lambda item: item[1])
    return f"; best baseline {name} {value:.4g}"
