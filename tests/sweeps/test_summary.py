"""The end-of-sweep summary: text table, markdown pivot, heatmap."""

from __future__ import annotations

import dataclasses

import pytest

from foxhunt.runs.cell import CellKey, CellResult
from foxhunt.sweeps.summary import (
    deflated_sharpes,
    failures,
    format_markdown,
    format_table,
    plot_heatmap,
)


def _results() -> list[CellResult]:
    ok = {"test/sharpe": 1.23456, "val/loss": 0.98765, "memory/device_peak_mb": 612.4}
    return [
        CellResult(
            CellKey("dqn", "es", "fp32", "42", "h1"),
            "FINISHED",
            "r1",
            None,
            12.34,
            None,
            {
                "test/sharpe": -0.5,
                "test/sortino": -0.7,
                "test/calmar": -1.25,
                "test/max_drawdown": 1234.4,
                "test/exposure": 0.625,
                "memory/device_peak_mb": 80.0,
            },
        ),  # fmt: skip
        CellResult(
            CellKey("dqn", "nq", "fp32", "42", "h2"),
            "FAILED",
            "r2",
            "BarDataError: bad.csv line 3: price not on the tick grid",
            1.0,
        ),
        CellResult(
            CellKey("tft", "es", "fp32", "42", "h3"), "SKIPPED", "r3", None, 30.0, "skipped: FINISHED earlier in run r3", ok
        ),
        CellResult(CellKey("tft", "nq", "fp32", "42", "h4"), "FINISHED", "r4", None, 31.0, None, ok),
    ]


def test_table_has_one_line_per_cell_with_the_figures():
    lines = format_table(_results()).splitlines()
    assert lines[0].split() == ["cell", "status", "test/sharpe", "interval", "best", "baseline", "DSR", "flags",
                                "sortino", "calmar", "max", "DD", "$", "exposure", "val/loss", "peak", "MB", "wall",
                                "s", "error", "/", "note"]  # fmt: skip
    assert lines[2].split() == ["dqn-es-fp32", "FINISHED", "-0.500", "-", "-", "-", "-0.700", "-1.25", "1234", "0.62",
                                "-", "80", "12.3"]  # fmt: skip
    assert lines[3].split()[:4] == ["dqn-nq-fp32", "FAILED", "-", "-"]
    assert "price not on the tick grid" in lines[3]
    assert lines[5].split()[:6] == ["tft-nq-fp32", "FINISHED", "1.235", "-", "-", "-"]
    assert "0.9877" in lines[5] and "612" in lines[5]
    assert lines[-1].startswith("interval: block bootstrap")
    assert [r.cell for r in failures(_results())] == ["dqn-nq-fp32"]


def scored(sharpe: float, low: float, high: float, per_step: float, baseline: float) -> dict[str, float]:
    return {"test/sharpe": sharpe, "test/sharpe_ci_low": low, "test/sharpe_ci_high": high,
            "test/sharpe_per_step": per_step, "test/steps": 5000.0, "test/pnl_skew": 0.0, "test/pnl_kurtosis": 3.0,
            "test/baseline/flat/sharpe": 0.0, "test/baseline/momentum/sharpe": baseline}  # fmt: skip


def test_interval_baseline_dsr_and_flags():
    results = [
        CellResult(CellKey("dqn", "es", "fp32", "42", "a"), "FINISHED", "r1", None, 1.0, None, scored(40.0, 10.0, 70.0, 0.07, 5.0)),
        CellResult(CellKey("ppo", "es", "fp32", "42", "b"), "FINISHED", "r2", None, 1.0, None, scored(3.0, -20.0, 26.0, 0.005, 9.0)),
        CellResult(CellKey("tft", "es", "fp32", "42", "c"), "FINISHED", "r3", None, 1.0, None, scored(-8.0, -30.0, 14.0, -0.013, -1.0)),
    ]  # fmt: skip
    dsr = deflated_sharpes(results)
    # PSR of each cell against the best of 3 unskilled cells, by hand (normal moments: skew 0, kurtosis 3)
    from statistics import NormalDist, variance

    trials = [0.07, 0.005, -0.013]
    gamma, z = 0.5772156649015329, NormalDist().inv_cdf
    benchmark = variance(trials) ** 0.5 * ((1 - gamma) * z(1 - 1 / 3) + gamma * z(1 - 1 / (3 * 2.718281828459045)))
    for result, sr in zip(results, trials):
        expected = NormalDist().cdf((sr - benchmark) * 4999**0.5 / (1 + 0.5 * sr**2) ** 0.5)
        assert dsr[result.cell] == pytest.approx(expected, rel=1e-9)
    lines = format_table(results).splitlines()
    assert "[10.00, 70.00]" in lines[2] and "momentum 5.000" in lines[2] and "CI~0" not in lines[2]
    assert "CI~0" in lines[3] and "<=base" in lines[3]  # 3.0 <= momentum's 9.0
    assert "CI~0" in lines[4] and "<=base" in lines[4]  # -8 <= flat's 0
    assert "DSR: deflated Sharpe ratio against the best of 3 cells" in format_markdown(results, "t")


def test_markdown_has_the_model_by_asset_pivot_and_names_failures():
    text = format_markdown(_results(), "sweep x")
    assert "| model | es | nq |" in text
    assert "| dqn | -0.500 | FAILED |" in text
    assert "| tft | 1.235 | 1.235 |" in text
    assert text.rstrip().endswith("3 of 4 cells ok; failed: dqn-nq-fp32")


def test_heatmap_is_a_png(tmp_path):
    path = plot_heatmap(_results(), tmp_path / "summary.png", "sweep x")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_deflated_sharpe_is_per_data_set_never_pooling_es_with_nq():
    """Each cell is judged against the best of the cells on its own bars (its asset's): ES's three
    cells against ES's spread, NQ's two against NQ's (it pooled all five: NQ's strong cells deflated
    ES's, and N was 5 for both)."""
    from foxhunt.evaluation.deflated import deflated_sharpe_ratio

    per_step = {("dqn", "es"): 0.02, ("ppo", "es"): 0.01, ("tft", "es"): -0.005, ("dqn", "nq"): 0.09, ("ppo", "nq"): 0.07}
    results = [CellResult(CellKey(model, asset, "fp32", "42", model + asset), "FINISHED", model + asset, None, 1.0, None,
                          scored(sr * 70, -1.0, 1.0, sr, 0.0)) for (model, asset), sr in per_step.items()]  # fmt: skip
    dsr = deflated_sharpes(results)
    for (model, asset), sr in per_step.items():
        trials = [v for (_, a), v in per_step.items() if a == asset]
        assert dsr[f"{model}-{asset}-fp32"] == pytest.approx(deflated_sharpe_ratio(sr, trials, 5000, 0.0, 3.0), rel=1e-9)
    text = format_markdown(results, "t")
    assert "against the best of the cells on its own data set (es: 3 cells, nq: 2 cells)" in text
    # a search's study of N trials across both assets: each asset's N is its own trials, pruned and failed ones too
    failed = CellResult(CellKey("tft", "nq", "fp32", "42", "x"), "FAILED", None, "boom", 1.0, trial=9)
    searched = [dataclasses.replace(r, trial=i) for i, r in enumerate(results)] + [failed]
    dsr = deflated_sharpes(searched, n_trials=6)
    nq = [v for (_, a), v in per_step.items() if a == "nq"]
    assert dsr[searched[3].cell] == pytest.approx(deflated_sharpe_ratio(0.09, nq, 5000, 0.0, 3.0, 3), rel=1e-9)
