"""Hot swap of the stateful members (foxhunt.ensemble.loading.SwappableEngine.swap): a Mamba-2
(its recurrent state) and a TFT (its window of encoder inputs) swapped in mid-stream step through
the stream's latest bars first, and then forecast exactly as the same version that ran since the
stream started; swapped in cold (no bars to warm on), they do not."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from ensemble_helpers import DATA, cli

MEMBERS_START, SWAP_AT, END = 200, 500, 700  # bars: members start deciding, the swap, the end


@pytest.fixture(scope="module")
def registered(store_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("swap-state") / "root"
    shutil.copytree(store_root, root, ignore=shutil.ignore_patterns("outputs", ".cache"))
    assert cli(root, "ensemble", "register", "asset=es", "ensemble.gate=none", *DATA).exit_code == 0
    return root


def _signals(family: str, root, tmp_path, warm_bars: int) -> tuple[list, list]:
    """The member's signals after the swap: one engine ran the version from the start, the
    other swaps a fresh load of it in at SWAP_AT with ``roll.swap.warm_bars=warm_bars``."""
    from hydra.utils import instantiate

    from foxhunt.ensemble.loading import ensemble_engine, load_member
    from foxhunt.training.parts import compose_config

    cfg = compose_config(["asset=es", f"ensemble.models=[{family}]", *DATA, "ensemble.runtime=numpy",
                          f"roll.swap.warm_bars={warm_bars}"], root_dir=root, config_name="ensemble")  # fmt: skip
    asset = instantiate(cfg.asset)
    bars = instantiate(cfg.data.source).load(asset)
    values = bars[["open", "high", "low", "close", "volume"]].to_numpy(np.float64).tolist()
    stamps = bars.index.as_unit("ns").asi8.tolist()
    name = f"foxhunt-{family}-es"
    engines = [
        ensemble_engine([load_member(cfg, name, None, "fp32", tmp_path / f"{side}")], asset, cfg, side)
        for side in ("ran", "swapped")
    ]
    for engine in engines:
        for i in range(MEMBERS_START):
            engine.warm(stamps[i], *values[i])
        engine.reset_members()
    ran, swapped = [], []
    for i in range(MEMBERS_START, END):
        if i == SWAP_AT:
            fresh = load_member(cfg, name, None, "fp32", tmp_path / "fresh")
            engines[1].swap(fresh.member, fresh.inputs, fresh.value, [])
        for engine, out in zip(engines, (ran, swapped)):
            result = engine.step(stamps[i], *values[i])
            out.append(result.decisions[name].signal if result.warm else None)
    return ran[SWAP_AT - MEMBERS_START :], swapped[SWAP_AT - MEMBERS_START :]


@pytest.mark.parametrize("family", ["mamba2", "tft"])
def test_a_swapped_in_stateful_member_forecasts_as_one_that_ran_since_the_stream_started(family, registered, tmp_path):
    ran, swapped = _signals(family, registered, tmp_path, warm_bars=1000)
    assert all(s is not None for s in ran)
    np.testing.assert_allclose(np.asarray(swapped, float), np.asarray(ran, float), rtol=1e-5, atol=1e-6)
    cold_ran, cold = _signals(family, registered, tmp_path / "cold", warm_bars=0)
    assert cold_ran == ran  # the member that ran along is the same either way
    differ = [i for i, (a, b) in enumerate(zip(ran, cold)) if b is None or not np.isclose(a, b, rtol=1e-5, atol=1e-6)]
    assert differ and differ[0] == 0  # cold, its first forecasts are not the warmed ones
