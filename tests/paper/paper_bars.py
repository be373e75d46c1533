"""Helpers of the paper unit tests: the ES contract, feed bars on the tick grid, random bar paths."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from hypothesis import strategies as st
from omegaconf import OmegaConf

from foxhunt.assets import AssetSpec
from foxhunt.paper.feeds import FeedBar

REPO = Path(__file__).resolve().parents[2]
MINUTE_NS = 60_000_000_000
# Tuesday 2024-03-12 15:00 UTC: ES is open (10:00 New York), trading date 2024-03-12
START_NS = int(np.datetime64("2024-03-12T15:00", "ns").astype(np.int64))
CAPITAL = 100_000.0


def es() -> AssetSpec:
    raw = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "asset" / "es.yaml"))
    return AssetSpec(**{k: v for k, v in raw.items() if k != "_target_"})


ES = es()  # tick 0.25, multiplier 50


def bar(i: int, open_: float, close: float, roll: float = math.nan, ts_ns: int | None = None, symbol: str = "ES.FUT") -> FeedBar:
    """Bar ``i`` of a path (one minute apart from :data:`START_NS`), raw prices = adjusted prices."""
    ts = START_NS + i * MINUTE_NS if ts_ns is None else ts_ns
    high, low = max(open_, close) + 0.25, min(open_, close) - 0.25
    return FeedBar(symbol, ts, open_, high, low, close, 10.0, open_, close, roll)


@st.composite
def bar_paths(draw, min_bars: int = 2, max_bars: int = 40, rolls: bool = True) -> list[FeedBar]:
    """Bars on ES's tick grid around 4800: a random walk of closes, opens gapping a few ticks from
    the previous close, and (``rolls``) some roll bars whose new contract is a few points away."""
    n = draw(st.integers(min_bars, max_bars))
    steps = draw(st.lists(st.integers(-8, 8), min_size=n, max_size=n))
    gaps = draw(st.lists(st.integers(-4, 4), min_size=n, max_size=n))
    rolled = draw(st.lists(st.booleans() if rolls else st.just(False), min_size=n, max_size=n))
    spreads = draw(st.lists(st.integers(-80, 80), min_size=n, max_size=n))
    ticks = 19_200  # 4800.00
    bars = []
    for i in range(n):
        roll = math.nan
        if rolled[i] and i > 0:
            ticks += spreads[i]  # the new contract trades at another level: its close moves from there
            roll = (ticks + gaps[i]) * ES.tick_size  # the new contract's last close seen before the roll
        open_ticks = ticks + gaps[i]
        ticks += steps[i]
        bars.append(bar(i, open_ticks * ES.tick_size, ticks * ES.tick_size, roll))
    return bars


def refused(call, *contains: str, unchanged: Path | None = None) -> str:
    """``call()`` refused as a user error in one line holding every text of ``contains``; the file
    ``unchanged`` (when given) byte-identical after the refusal. The line, as the CLI prints it."""
    import pytest

    from foxhunt.errors import UserError, error_line

    before = unchanged.read_bytes() if unchanged is not None else None
    with pytest.raises(UserError) as error:
        call()
    line = error_line(error.value, limit=None)
    assert "\n" not in str(error.value) and all(text in line for text in contains), line
    if unchanged is not None:
        assert unchanged.read_bytes() == before, f"{unchanged} changed by a refused open"
    return line
