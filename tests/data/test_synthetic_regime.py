"""The synthetic source's regime change: the planted AR(1) pattern changes sign at a known date
(what the rolling ensemble's demonstration trains on: docs/how-to/roll.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from configs import synthetic_source
from foxhunt.assets import AssetSpec

REPO = Path(__file__).resolve().parents[2]
ES = AssetSpec(
    **{k: v for k, v in OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "asset" / "es.yaml")).items() if k != "_target_"}
)


def _lag1(bars: pd.DataFrame) -> float:
    """Lag-1 autocorrelation of one-bar log returns within sessions (no gap across a break)."""
    close, open_ = np.log(bars["close"].to_numpy()), np.log(bars["open"].to_numpy())
    returns = close - open_
    stamps = bars.index.as_unit("ns").asi8
    same = np.diff(stamps) == 60_000_000_000
    a, b = returns[:-1][same], returns[1:][same]
    return float(np.corrcoef(a, b)[0, 1])


def test_the_pattern_changes_sign_at_the_date():
    bars = synthetic_source(days=60, seed=3, autocorrelation=0.3, change_date="2024-02-01", autocorrelation_after=-0.3).load(ES)
    cut = bars.index.searchsorted(pd.Timestamp("2024-02-01", tz="UTC"))
    assert _lag1(bars.iloc[:cut]) == pytest.approx(0.3, abs=0.05)
    assert _lag1(bars.iloc[cut:]) == pytest.approx(-0.3, abs=0.05)


def test_without_a_change_the_bars_are_as_before():
    one = synthetic_source(days=10, seed=4, autocorrelation=0.2).load(ES)
    again = synthetic_source(days=10, seed=4, autocorrelation=0.2, change_date="2030-01-01", autocorrelation_after=-0.2).load(ES)
    pd.testing.assert_frame_equal(one, again)  # a change after the last bar changes nothing
    assert synthetic_source(days=10, seed=4).fingerprint(ES) != synthetic_source(
        days=10, seed=4, change_date="2024-01-05", autocorrelation_after=0.1).fingerprint(ES)  # fmt: skip


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"change_date": "2024-02-01"}, "autocorrelation_after=None: set it with change_date"),
    ({"autocorrelation_after": -0.3}, "change_date=None: set it with autocorrelation_after"),
    ({"change_date": "2024-02-30", "autocorrelation_after": -0.3}, "change_date='2024-02-30': must be a date"),
    ({"change_date": "2024-02-01", "autocorrelation_after": -1.0}, r"autocorrelation_after=-1.0: must lie in \(-1, 1\)"),
])  # fmt: skip
def test_a_bad_change_names_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        synthetic_source(seed=0, **kwargs)


def test_conf_has_no_change_by_default():
    cfg = OmegaConf.merge({"seed": 5}, OmegaConf.load(REPO / "conf" / "data" / "synthetic.yaml"))
    source = instantiate(cfg.source)
    assert source.change_date is None and source.autocorrelation_after is None
