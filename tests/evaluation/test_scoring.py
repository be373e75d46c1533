"""A split's score: model and baselines on the same bars, intervals, pooling and the saved form."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from tests.evaluation.test_backtest import ES

from foxhunt.evaluation.backtest import backtest
from foxhunt.evaluation.baselines import baseline_positions
from foxhunt.evaluation.scoring import (
    BootstrapSettings,
    ScoringSettings,
    SplitScore,
    pool_scores,
    score_positions,
    summary_lines,
)

SETTINGS = ScoringSettings(commission_usd=2.5, slippage_ticks=0.5, bars_per_year=1380 * 252,
                           bootstrap=BootstrapSettings(samples=200, block_bars=10, confidence=0.9, seed=3),
                           baselines=("flat", "buy_and_hold", "random", "momentum"), seed=7)  # fmt: skip


def stretch(n: int, seed: int, start: str):
    rng = np.random.default_rng(seed)
    close = 4800 + np.cumsum(rng.integers(-2, 3, n)) * 0.25
    times = pd.date_range(start, periods=n, freq="1min", tz="UTC")
    return rng.integers(-1, 2, n), close, times


def test_baselines_trade_the_same_bars_with_the_same_costs():
    positions, close, times = stretch(400, 0, "2024-03-04 14:30")
    score = score_positions(positions, close, times, ES, SETTINGS)
    for name, result in score.baselines.items():
        expected = backtest(baseline_positions(name, close, seed=7), close, times, ES, 2.5, 0.5, bars_per_year=1380 * 252)
        np.testing.assert_array_equal(result.pnl, expected.pnl)
    metrics = score.metrics(SETTINGS)
    assert metrics["baseline/flat/sharpe"] == 0.0 and metrics["baseline/flat/pnl"] == 0.0
    assert metrics["sharpe_ci_low"] < metrics["sharpe"] < metrics["sharpe_ci_high"]
    assert metrics["mean_pnl_ci_low"] < metrics["mean_pnl"] < metrics["mean_pnl_ci_high"]
    assert metrics["sharpe_per_step"] == pytest.approx(metrics["sharpe"] / np.sqrt(1380 * 252))


def test_always_flat_model_has_a_point_interval():
    _, close, times = stretch(100, 1, "2024-03-04 14:30")
    metrics = score_positions(np.zeros(100), close, times, ES, SETTINGS).metrics(SETTINGS)
    assert metrics["sharpe_ci_low"] == metrics["sharpe_ci_high"] == 0.0


def test_pooled_score_is_the_folds_steps_in_order():
    a = score_positions(*stretch(300, 2, "2024-03-04 14:30"), ES, SETTINGS)
    b = score_positions(*stretch(200, 3, "2024-03-05 14:30"), ES, SETTINGS)
    joined = pool_scores([a, b])
    np.testing.assert_array_equal(joined.model.pnl, np.concatenate([a.model.pnl, b.model.pnl]))
    np.testing.assert_array_equal(joined.baselines["random"].pnl,
                                  np.concatenate([a.baselines["random"].pnl, b.baselines["random"].pnl]))  # fmt: skip
    assert len(joined.timestamps) == len(joined.model.equity) + 1
    assert joined.timestamps[0] == a.timestamps[0] and joined.timestamps[-1] == b.timestamps[-1]


def test_saved_score_loads_back_equal(tmp_path):
    score = score_positions(*stretch(250, 4, "2024-03-04 14:30"), ES, SETTINGS)
    loaded = SplitScore.load(score.save(tmp_path / "test.npz"))
    assert loaded.metrics(SETTINGS) == score.metrics(SETTINGS)
    np.testing.assert_array_equal(loaded.timestamps, score.timestamps)


def test_unknown_baseline_is_one_line():
    cfg = OmegaConf.create({"seed": 1, "execution": {"commission_usd": 1.0, "slippage_ticks": 0.0},
                            "evaluation": {"sessions_per_year": 252, "baselines": ["flat", "oracle"],
                                           "bootstrap": {"samples": 10, "block_bars": 5, "confidence": 0.9, "seed": 0}}})  # fmt: skip
    with pytest.raises(ValueError, match=r"evaluation.baselines: unknown 'oracle' \(allowed: flat, buy_and_hold"):
        ScoringSettings.from_config(cfg, ES)


def test_summary_lines_show_the_interval_and_each_baseline():
    score = score_positions(*stretch(300, 5, "2024-03-04 14:30"), ES, SETTINGS)
    metrics = {f"test/{k}": v for k, v in score.metrics(SETTINGS).items()} | {"test/loss": 0.25}
    text = "\n".join(summary_lines(metrics, "test/"))
    assert "block bootstrap" in text and "baselines' sharpe: buy_and_hold" in text and "momentum" in text
    assert "test/loss" in text and "test/baseline/" not in text
