"""A split's score: the model's positions and the baselines' through the shared backtest, with
intervals.

Every scored split (a run's ``val`` and ``test``, a walk-forward's pooled out-of-sample blocks)
yields the same metrics, unprefixed here (``train`` prefixes them with the split):

- the backtest's (:func:`foxhunt.evaluation.backtest.backtest`): ``pnl``, ``mean_pnl``,
  ``sharpe``, ``max_drawdown``, ``hit_rate``, ``turnover``, ``trades``, ``steps``;
- ``sharpe_ci_low`` / ``sharpe_ci_high`` and ``mean_pnl_ci_low`` / ``mean_pnl_ci_high``: the
  block bootstrap interval over bars (:func:`foxhunt.evaluation.stats.block_bootstrap`,
  ``evaluation.bootstrap``: blocks of ``block_bars`` consecutive steps, seeded);
- ``sharpe_per_step`` (not annualized), ``pnl_skew`` / ``pnl_kurtosis`` (non-excess) of the
  per-step PnL: what the deflated Sharpe ratio of a sweep needs besides ``steps``;
- ``baseline/<name>/sharpe`` and ``baseline/<name>/pnl`` for each of ``evaluation.baselines``
  (:mod:`foxhunt.evaluation.baselines`), traded on the same bars with the same costs.

A :class:`SplitScore` keeps the backtests themselves, so that a walk-forward pools its folds'
test blocks (:func:`pool_scores`), and saves to one ``.npz`` (a resumed walk-forward reads a
finished fold's back from its run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from foxhunt.evaluation.backtest import (
    BacktestResult,
    backtest,
    evaluation_annualization,
    from_steps,
    pooled,
)
from foxhunt.evaluation.baselines import BASELINES, baseline_positions
from foxhunt.evaluation.stats import block_bootstrap, pnl_moments, sharpe_ratio

BASELINE_PREFIX = "baseline/"
BASELINE_METRICS = ("sharpe", "pnl")
#: Every metric a SplitScore yields itself (the rest of a split's metrics are the model's own).
BACKTEST_NAMES = frozenset({
    "pnl", "mean_pnl", "sharpe", "sortino", "calmar", "max_drawdown", "exposure", "hit_rate", "turnover", "trades",
    "steps", "sharpe_ci_low",
    "sharpe_ci_high", "mean_pnl_ci_low", "mean_pnl_ci_high", "pnl_skew", "pnl_kurtosis", "sharpe_per_step",
})  # fmt: skip
MODEL = "model"


@dataclass(frozen=True)
class BootstrapSettings:
    """``evaluation.bootstrap``: replicates, block length in steps, confidence and seed."""

    samples: int
    block_bars: int
    confidence: float
    seed: int


@dataclass(frozen=True)
class ScoringSettings:
    """How a split is scored: costs, annualization, intervals, baselines and their seed."""

    commission_usd: float
    slippage_ticks: float
    bars_per_year: float
    bootstrap: BootstrapSettings
    baselines: tuple[str, ...]
    seed: int  # the random baseline's

    @classmethod
    def from_config(cls, cfg: Any, asset) -> ScoringSettings:
        """From a composed training config (``execution``, ``evaluation``, ``seed``)."""
        evaluation = cfg.evaluation
        unknown = [name for name in evaluation.baselines if name not in BASELINES]
        if unknown:
            raise ValueError(f"evaluation.baselines: unknown {unknown[0]!r} (allowed: {', '.join(BASELINES)})")
        boot = evaluation.bootstrap
        return cls(
            commission_usd=float(cfg.execution.commission_usd),
            slippage_ticks=float(cfg.execution.slippage_ticks),
            bars_per_year=evaluation_annualization(asset, evaluation).bars_per_year,
            bootstrap=BootstrapSettings(int(boot.samples), int(boot.block_bars), float(boot.confidence), int(boot.seed)),
            baselines=tuple(str(name) for name in evaluation.baselines),
            seed=int(cfg.seed),
        )


@dataclass
class SplitScore:
    """The backtests of one scored stretch of bars: the model's and each baseline's, and the
    bar times (``len(steps) + 1``: the first bar's, then each step's end)."""

    model: BacktestResult
    timestamps: np.ndarray
    baselines: dict[str, BacktestResult] = field(default_factory=dict)

    def metrics(self, settings: ScoringSettings) -> dict[str, float]:
        """Every metric of the module doc, unprefixed."""
        metrics = dict(self.model.metrics)
        metrics.update(interval_metrics(self.model, settings.bootstrap))
        for name, result in self.baselines.items():
            metrics.update({f"{BASELINE_PREFIX}{name}/{m}": float(result.metrics[m]) for m in BASELINE_METRICS})
        return metrics

    def save(self, path: Path) -> Path:
        """One ``.npz`` of a scored stretch that started flat (what a run saves per split; a
        pooled score is rebuilt from its parts, not saved)."""
        arrays: dict[str, np.ndarray | np.float64] = {
            "timestamps": self.timestamps,
            "bars_per_year": np.float64(self.model.bars_per_year),
        }
        for name, result in {MODEL: self.model, **self.baselines}.items():
            arrays.update(
                {f"{name}.positions": result.positions, f"{name}.gross": result.gross_pnl, f"{name}.costs": result.costs}
            )
        np.savez_compressed(path, allow_pickle=True, **arrays)  # named: numpy's stubs would read the ** as allow_pickle
        return path

    @classmethod
    def load(cls, path: Path) -> SplitScore:
        """A score saved by :meth:`save`."""
        with np.load(path) as data:
            rate = float(data["bars_per_year"])
            names = sorted({key.split(".", 1)[0] for key in data.files if "." in key})
            results = {
                name: from_steps(data[f"{name}.positions"], data[f"{name}.gross"], data[f"{name}.costs"], rate) for name in names
            }
            stamps = data["timestamps"]
        model = results.pop(MODEL)
        return cls(model=model, baselines=results, timestamps=stamps)


def score_positions(positions, close, timestamps, asset, settings: ScoringSettings, roll_price=None) -> SplitScore:
    """The model's ``positions`` and every baseline's, backtested on the raw ``close`` (T,)
    with the rolls of ``roll_price`` (see :func:`foxhunt.evaluation.backtest.backtest`)."""

    def run(pos) -> BacktestResult:
        return backtest(pos, close, timestamps, asset, settings.commission_usd, settings.slippage_ticks,
                        bars_per_year=settings.bars_per_year, roll_price=roll_price)  # fmt: skip

    baselines = {
        name: run(baseline_positions(name, close, seed=settings.seed, roll_price=roll_price)) for name in settings.baselines
    }
    return SplitScore(model=run(positions), baselines=baselines, timestamps=_utc_ns(timestamps))


def _utc_ns(timestamps) -> np.ndarray:
    index = pd.DatetimeIndex(timestamps)
    if index.tz is not None:
        index = index.tz_convert("UTC").tz_localize(None)
    return index.as_unit("ns").to_numpy()


def pool_scores(scores: list[SplitScore]) -> SplitScore:
    """The scores' steps joined in order (each stretch started flat): a walk-forward's pooled blocks."""
    names = set(scores[0].baselines)
    if any(set(s.baselines) != names for s in scores):
        raise ValueError("pool_scores: the scores were made with different baselines")
    stamps = [scores[0].timestamps[:1]] + [s.timestamps[1:] for s in scores]
    return SplitScore(
        model=pooled([s.model for s in scores]),
        baselines={name: pooled([s.baselines[name] for s in scores]) for name in sorted(names)},
        timestamps=np.concatenate(stamps),
    )


def interval_metrics(result: BacktestResult, settings: BootstrapSettings) -> dict[str, float]:
    """The bootstrap intervals of the Sharpe ratio and the mean PnL, and the PnL's moments."""
    pnl = result.pnl
    metrics: dict[str, float] = {}
    if len(pnl) >= 2 and np.std(pnl) > 0:
        intervals = block_bootstrap(
            pnl, block_bars=min(settings.block_bars, len(pnl)), samples=settings.samples,
            confidence=settings.confidence, seed=settings.seed, periods_per_year=result.bars_per_year,
        )  # fmt: skip
        skew, kurtosis = pnl_moments(pnl)
        metrics.update(
            sharpe_per_step=sharpe_ratio(pnl),
            sharpe_ci_low=intervals.sharpe[0], sharpe_ci_high=intervals.sharpe[1],
            mean_pnl_ci_low=intervals.mean_pnl[0], mean_pnl_ci_high=intervals.mean_pnl[1],
            pnl_skew=skew, pnl_kurtosis=kurtosis,
        )  # fmt: skip
    else:  # no variation (always flat, or one step): the interval is the point
        mean = float(pnl.mean()) if len(pnl) else 0.0
        metrics.update(sharpe_per_step=0.0, sharpe_ci_low=0.0, sharpe_ci_high=0.0, mean_pnl_ci_low=mean, mean_pnl_ci_high=mean,
                       pnl_skew=0.0, pnl_kurtosis=3.0)  # fmt: skip
    return {k: float(v) for k, v in metrics.items()}


def summary_lines(metrics: dict[str, float], prefix: str) -> list[str]:
    """A split's figures for the console: the backtest's, the Sharpe ratio's interval, and each
    baseline's Sharpe ratio beside it (``prefix``: ``test/``, ``val/``)."""

    def get(name: str) -> float | None:
        return metrics.get(f"{prefix}{name}")

    lines = []
    sharpe, low, high = get("sharpe"), get("sharpe_ci_low"), get("sharpe_ci_high")
    if sharpe is not None:
        interval = f"  [{low:.3f}, {high:.3f}] block bootstrap" if low is not None and high is not None else ""
        lines.append(f"  {prefix}sharpe        {sharpe:.4g}{interval}")
    for name in ("sortino", "calmar", "pnl", "mean_pnl", "max_drawdown", "exposure", "hit_rate", "trades", "steps"):
        if get(name) is not None:
            lines.append(f"  {prefix}{name:<13} {get(name):.6g}")
    baselines = sorted({k[len(prefix) + len(BASELINE_PREFIX):].split("/")[0] for k in metrics
                        if k.startswith(prefix + BASELINE_PREFIX)})  # fmt: skip
    if baselines:
        figures = ", ".join(f"{name} {get(f'{BASELINE_PREFIX}{name}/sharpe'):.3g}" for name in baselines)
        lines.append(f"  baselines' sharpe: {figures}")
    others = sorted(k for k in metrics if k.startswith(prefix) and not k.startswith(prefix + BASELINE_PREFIX)
                    and k[len(prefix):] not in BACKTEST_NAMES)  # fmt: skip
    lines += [f"  {k:<19} {metrics[k]:.6g}" for k in others]
    return lines
