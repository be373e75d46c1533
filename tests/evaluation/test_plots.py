"""The equity plot writes a PNG and leaves no matplotlib state behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib._pylab_helpers import Gcf
from omegaconf import OmegaConf

from foxhunt.assets import AssetSpec
from foxhunt.evaluation import backtest, plot_equity

CONF_ASSET = Path(__file__).resolve().parents[2] / "conf" / "asset"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def es() -> AssetSpec:
    raw = OmegaConf.to_container(OmegaConf.load(CONF_ASSET / "es.yaml"))
    return AssetSpec(**{k: v for k, v in raw.items() if k != "_target_"})


def test_plot_equity_writes_a_png(tmp_path, es):
    rng = np.random.default_rng(0)
    n = 500
    close = 4800.0 + 0.25 * np.cumsum(rng.integers(-4, 5, n))
    positions = rng.integers(-1, 2, n)
    timestamps = pd.date_range("2024-03-04 14:30", periods=n, freq="1min", tz="UTC")
    result = backtest(positions, close, timestamps, es, 2.0, 1.0, bars_per_year=1e5)

    out = plot_equity(result, timestamps, tmp_path / "sub" / "equity.png", title="dqn-es-fp32")

    assert out == tmp_path / "sub" / "equity.png"
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 10_000  # a drawn figure, not an empty canvas
    assert Gcf.get_num_fig_managers() == 0  # nothing registered with pyplot


def test_plot_equity_rejects_mismatched_timestamps(tmp_path, es):
    timestamps = pd.date_range("2024-03-04", periods=4, freq="1min", tz="UTC")
    result = backtest([1, 0, -1, 0], [1.0, 1.25, 1.0, 1.5], timestamps, es, 0.0, 0.0, bars_per_year=1e5)
    with pytest.raises(ValueError, match="timestamps: length 3"):
        plot_equity(result, timestamps[:3], tmp_path / "x.png", title="x")
