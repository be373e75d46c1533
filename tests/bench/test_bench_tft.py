"""The TFT section's rows say how foxhunt's side ran (in-process, from worker results)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from foxhunt.bench.tft import FOXHUNT, PEER, _rows

GOALS = OmegaConf.create({"tft_speed_vs_peer": 2.0, "tft_memory_vs_peer": 0.6})


def result(side: str, rate: float, checkpointing: bool | None, **extra) -> dict:
    run = {"side": side, "parameters": 10, "samples_per_s": rate, "samples_per_cpu_s": rate,
           "peak_rss_mb": 100.0, "rss_before_fit_mb": 50.0, **extra}  # fmt: skip
    if checkpointing is not None or side == PEER:
        run["activation_checkpointing"] = checkpointing
    return run


@pytest.mark.parametrize(
    ("states", "said"),
    [([False, False], "off"), ([True, True], "on"), ([True, False], "unknown"), ([None, None], "unknown")],
    ids=["off", "on", "mixed", "written-before"],
)
def test_rows_say_whether_foxhunt_recomputed_activations(states, said):
    fox = [result(FOXHUNT, 60.0, state) for state in states]
    peer = [result(PEER, 30.0, None) for _ in states]
    speed, memory = _rows(1, "pytorch-forecasting", fox, peer, GOALS.tft_speed_vs_peer, GOALS.tft_memory_vs_peer, 0.9)
    assert f"foxhunt activation checkpointing {said}" in speed.note
    assert f"foxhunt activation checkpointing {said}" in memory.note
    assert speed.figure == pytest.approx(2.0)
