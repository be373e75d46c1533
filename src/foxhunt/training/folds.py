"""A cell evaluated several times: walk-forward folds and seeds, nested under the cell's run.

With ``evaluation.protocol=walk_forward`` or ``evaluation.seeds=[...]``, a cell is no longer one
training: :func:`foxhunt.training.cell.run_cell` opens the cell's MLflow run (the one a sweep
nests under its parent, with the cell's tags and config hash) and runs each of its
:func:`children` as a cell of its own (one child run per seed and fold, nested under it,
``foxhunt.role`` = ``fold``, each in its own folder ``<cell>/seed<s>_fold<k>``); this module
makes the children and records their aggregate (:func:`record_protocol`), and calls no cell.

- **Folds** (:class:`foxhunt.data.splits.WalkForwardConfig`): each child trains and scores on
  its fold's blocks, its features normalized with its own training window's statistics.
- **Seeds**: each child seeds model init, env starts and sampling with its seed; the bars stay
  those of the cell's ``seed`` (``data.source.seed`` is pinned to it), so seeds differ only in
  what the model does.

**What the cell's run gets.** Per seed, the folds' validation blocks and test blocks are pooled
(:func:`foxhunt.evaluation.scoring.pool_scores`: the out-of-sample blocks of the walk-forward as one)
and scored like one split, intervals and baselines included; the cell's ``val/<m>`` and
``test/<m>`` are the mean of those figures across seeds, ``<m>_std`` their standard deviation
across seeds (ddof=1, with two seeds or more), and ``test/sharpe_fold_mean`` /
``test/sharpe_fold_std`` (and ``val/``) the spread across folds. Metrics the children log
besides the backtest's (``val/loss``, ``test/mean_reward``, ...) are averaged over folds, then
across seeds the same way; ``memory/*`` peaks are the largest child's. ``val/sharpe`` of the cell (the pooled validation blocks) is what a
sweep optimizes and ``foxhunt ensemble register`` selects on. Artifacts: ``folds.md`` (one row
per child: its blocks' dates and figures) and ``equity_walk_forward.png`` (the pooled test
blocks of the first seed, with the baselines' figures in the title).

**Resume.** Each child has its own config hash, so ``resume=true`` skips the folds that finished
and resumes an interrupted one from its checkpoint; their scores are read back from their runs.
An interrupted cell run is reopened (``resume_run_id``: :mod:`foxhunt.runs.resume`), so the kept
folds and the resumed ones stay nested under the one cell run, and no cell run stays RUNNING.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from foxhunt.data.dataset import DATASET_FILE
from foxhunt.evaluation.backtest import evaluation_annualization
from foxhunt.evaluation.plots import plot_equity
from foxhunt.evaluation.scoring import ScoringSettings, SplitScore, pool_scores, summary_lines
from foxhunt.runs.provenance import file_sha256
from foxhunt.runs.store import RunStore, StoreError
from foxhunt.runs.tags import ROLE_FOLD, Tag
from foxhunt.training.scoring import SCORES_DIR, scores_digest_tag, scores_file

log = logging.getLogger("foxhunt.protocol")

SCORED_SPLITS = ("val", "test")
MEMORY_PREFIX = "memory/"
FOLDS_TABLE = "folds.md"
EQUITY_PNG = "equity_walk_forward.png"


def needs_protocol(cfg: DictConfig) -> bool:
    """True for a cell run made of children (folds or seeds); False for one run, a child's too."""
    evaluation = cfg.evaluation
    if evaluation.get("fold") is not None:
        return False
    return evaluation.protocol == "walk_forward" or bool(evaluation.get("seeds"))


@dataclass(frozen=True)
class Child:
    seed: int
    fold: int | None
    cfg: DictConfig

    @property
    def label(self) -> str:
        return f"seed{self.seed}" + ("" if self.fold is None else f"_fold{self.fold}")


def children(cfg: DictConfig, out_dir: Path) -> list[Child]:
    """One config per seed and fold, each with its own folder under ``out_dir``."""
    evaluation = cfg.evaluation
    seeds = [int(s) for s in evaluation.seeds] if evaluation.get("seeds") else [int(cfg.seed)]
    folds = list(range(int(evaluation.walk_forward.folds))) if evaluation.protocol == "walk_forward" else [None]
    data_seed = OmegaConf.select(cfg, "data.source.seed")  # resolved now: the bars stay the cell's
    made = []
    for seed in seeds:
        for fold in folds:
            child = Child(seed, fold, copy.deepcopy(cfg))
            with open_dict(child.cfg):
                child.cfg.seed = seed
                child.cfg.evaluation.seeds = None
                child.cfg.evaluation.fold = fold
                child.cfg.paths.output_dir = str(out_dir / child.label)
                if data_seed is not None:
                    child.cfg.data.source.seed = data_seed
            made.append(child)
    return made


def child_tags(child: Child) -> dict[str, str]:
    tags = {Tag.ROLE: ROLE_FOLD}
    if child.fold is not None:
        tags[Tag.FOLD] = str(child.fold)
    return tags


def record_protocol(results: list[ChildResult], cfg: DictConfig, name: str, out_dir: Path, run) -> dict[str, float]:
    """The cell's aggregate of its children's ``results`` (module doc), its folds table and
    walk-forward equity in ``out_dir`` and on the cell's ``run`` (None: no store), printed."""
    metrics = aggregate(results, cfg)
    table = folds_table(results)
    (out_dir / FOLDS_TABLE).write_text(table)
    png = plot_walk_forward(results, cfg, out_dir / EQUITY_PNG, title=f"{name}: {describe_protocol(cfg)}")
    if run is not None:
        run.log_metrics(metrics)
        run.log_artifact(out_dir / FOLDS_TABLE)
        if png is not None:
            run.log_artifact(png)
    print(table + cell_summary(name, cfg, metrics))
    return metrics


def cell_summary(name: str, cfg: DictConfig, metrics: dict[str, float]) -> str:
    """The cell's figures for the console: its pooled test blocks (mean across seeds)."""
    seeds = int(metrics.get("protocol/seeds", 1))
    lines = [f"{name}: {describe_protocol(cfg)}: test blocks pooled per seed" + (f", mean of {seeds} seeds" if seeds > 1 else ""),
             *summary_lines({k: v for k, v in metrics.items() if not k.endswith("_std")}, "test/")]  # fmt: skip
    if seeds > 1:
        lines.append(
            f"  test/sharpe across seeds: {metrics['test/sharpe']:.4g} +- {metrics.get('test/sharpe_std', float('nan')):.3g} (std)"
        )
    lines.append(f"  {evaluation_annualization(instantiate(cfg.asset), cfg.evaluation).announced()}")
    return "\n".join(lines)


def describe_protocol(cfg: DictConfig) -> str:
    evaluation = cfg.evaluation
    parts = []
    if evaluation.protocol == "walk_forward":
        wf = evaluation.walk_forward
        parts.append(f"walk-forward {wf.folds} folds {wf.window} (purge {wf.purge_bars} bars)")
    else:
        parts.append("single split")
    if evaluation.get("seeds"):
        parts.append(f"seeds {list(evaluation.seeds)}")
    return ", ".join(parts)


@dataclass
class ChildResult:
    seed: int
    fold: int | None
    run_id: str | None
    status: str
    metrics: dict[str, float]
    scores: dict  # split -> SplitScore
    extents: dict  # split -> {"rows", "first_bar", "last_bar"}

    @classmethod
    def of(cls, child: Child, outcome, cfg: DictConfig) -> ChildResult:
        scores = dict(getattr(outcome, "scores", None) or {})
        folder = Path(child.cfg.paths.output_dir)
        if set(scores) != set(SCORED_SPLITS):  # a child resume=true skipped: read its run back
            scores = _downloaded_scores(cfg, outcome.run_id, folder)
        return cls(child.seed, child.fold, outcome.run_id, outcome.status, dict(outcome.metrics), scores,
                   _extents(cfg, outcome.run_id, folder))  # fmt: skip


def _downloaded_scores(cfg: DictConfig, run_id: str | None, folder: Path) -> dict:
    """A skipped child's scores, read back from its run's artifacts, each checked against the
    SHA-256 its run recorded (a tag, the tracking store's record) before it is read: an edited
    ``scores/val.npz`` entered the cell's pooled metrics, a forged val/sharpe that registration
    selects by, and a malformed one was a broadcasting traceback (found by a helper probing stored files)."""
    if run_id is None or not cfg.logger.enabled:
        raise RuntimeError(f"{folder}: a skipped child without a run to read its scores from")
    store = RunStore(cfg.logger.tracking_uri)
    tags = store.get(run_id).tags
    target = folder / "downloaded"
    target.mkdir(parents=True, exist_ok=True)
    scores = {}
    for split in SCORED_SPLITS:
        name = f"{SCORES_DIR}/{scores_file(split)}"
        path = store.download(run_id, name, target)
        recorded = tags.get(scores_digest_tag(split))
        if recorded is None or file_sha256(Path(path)) != recorded:
            why = "its run recorded no digest of it" if recorded is None else "it is not the file its run logged (SHA-256)"
            raise StoreError(f"run {run_id}: {name}: {why}; refused, not pooled into the cell (resume=false trains the "
                              "cell again)")  # fmt: skip
        scores[split] = SplitScore.load(path)
    return scores


def _extents(cfg: DictConfig, run_id: str | None, folder: Path) -> dict:
    path = folder / DATASET_FILE
    if not path.is_file() and run_id is not None and cfg.logger.enabled:
        try:
            path = RunStore(cfg.logger.tracking_uri).download(run_id, DATASET_FILE, folder / "downloaded")
        except Exception:  # noqa: BLE001 (an older run without dataset.json: the table shows no dates)
            return {}
    if not path.is_file():
        return {}
    return json.loads(path.read_text()).get("splits", {})


def aggregate(results: list[ChildResult], cfg: DictConfig) -> dict[str, float]:
    """The cell's metrics from its children's (module doc)."""
    settings = ScoringSettings.from_config(cfg, instantiate(cfg.asset))
    per_seed: dict[int, dict[str, float]] = {}
    for seed in dict.fromkeys(r.seed for r in results):
        mine = [r for r in results if r.seed == seed]
        values: dict[str, float] = {}
        for split in SCORED_SPLITS:
            pooled = pool_scores([r.scores[split] for r in mine])
            values.update({f"{split}/{k}": v for k, v in pooled.metrics(settings).items()})
            sharpes = [r.scores[split].model.metrics["sharpe"] for r in mine]
            values[f"{split}/sharpe_fold_mean"] = float(np.mean(sharpes))
            if len(sharpes) > 1:
                values[f"{split}/sharpe_fold_std"] = float(np.std(sharpes, ddof=1))
        others = {k for r in mine for k in r.metrics if k.startswith(SCORED_SPLITS) and k not in values}
        for name in sorted(others):
            found = [r.metrics[name] for r in mine if name in r.metrics and math.isfinite(r.metrics[name])]
            if found:
                values[name] = float(np.mean(found))
        per_seed[seed] = values
    metrics: dict[str, float] = {}
    names = sorted({k for v in per_seed.values() for k in v})
    for name in names:
        found = [v[name] for v in per_seed.values() if name in v]
        metrics[name] = float(np.mean(found))
        if len(found) > 1 and not name.endswith(("_fold_std",)):
            metrics[f"{name}_std"] = float(np.std(found, ddof=1))
    for name in sorted({k for r in results for k in r.metrics if k.startswith(MEMORY_PREFIX)}):
        metrics[name] = max(r.metrics[name] for r in results if name in r.metrics)  # the cell's peak: its largest child's
    metrics["protocol/children"] = float(len(results))
    metrics["protocol/seeds"] = float(len(per_seed))
    return metrics


def folds_table(results: list[ChildResult]) -> str:
    """One markdown row per child: seed, fold, its blocks' dates and rows, and its figures."""
    header = ("seed", "fold", "train", "val", "test", "val sharpe", "test sharpe [CI]", "test pnl", "run")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        test = r.scores["test"].model.metrics
        ci = r.metrics.get("test/sharpe_ci_low"), r.metrics.get("test/sharpe_ci_high")
        interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if None not in ci else ""
        lines.append("| " + " | ".join((
            str(r.seed), "-" if r.fold is None else str(r.fold), *(_extent(r.extents.get(s)) for s in ("train", "val", "test")),
            f"{r.scores['val'].model.metrics['sharpe']:.3f}", f"{test['sharpe']:.3f}{interval}", f"{test['pnl']:,.0f}",
            f"{r.run_id or '-'} ({r.status})",
        )) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _extent(extent: dict | None) -> str:
    if not extent or not extent.get("rows"):
        return "-"
    return f"{extent['first_bar'][:16]} .. {extent['last_bar'][:16]} ({extent['rows']})"


def plot_walk_forward(results: list[ChildResult], cfg: DictConfig, path: Path, title: str) -> Path | None:
    """The first seed's pooled test blocks as an equity curve (PNG); ``None`` when not plotted."""
    if not cfg.evaluation.plot_equity:
        return None

    first = [r for r in results if r.seed == results[0].seed]
    pooled = pool_scores([r.scores["test"] for r in first])
    baselines = ", ".join(f"{name} {b.metrics['sharpe']:.2f}" for name, b in pooled.baselines.items())
    full = f"{title}\npooled test blocks of {len(first)} run(s); baselines' Sharpe: {baselines}"
    return plot_equity(pooled.model, pooled.timestamps, path, title=full)
