"""Replaying a split bar by bar gives the batch path's decisions: identical positions for every
family, forecasts within 1e-5 (the members built straight from the models by ``make_member``,
which picks each one's member from what its model offers; the registry round trip is tested in
test_registry.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ensemble_helpers import STREAMING_SMALL as SMALL
from hydra.utils import instantiate

from foxhunt.ensemble.engine import MemberInputs, StreamingEngine
from foxhunt.ensemble.members import TFTMember, WindowMember, make_member
from foxhunt.ensemble.replay import replay_bars
from foxhunt.training.parts import build_parts

DATA = ["data.source.days=4", "logger=none"]


def _parts(compose_cfg, model: str, *extra: str):
    cfg = compose_cfg([f"model={model}", *DATA, *SMALL[model], *extra])
    torch.manual_seed(0)
    parts = build_parts(cfg)
    parts.model.eval()
    return cfg, parts


def member_of(family: str, model, dataset, runtime: str = "auto", workdir=None, weights: str = "fp32"):
    return make_member(family, family, model, weights, None, runtime, probe_calls=20, groups=dataset.groups, workdir=workdir)


def replay_split(cfg, parts, member, split: str):
    dataset = parts.dataset
    inputs = {member.name: MemberInputs(dataset.feature_config, dataset.observed_mean, dataset.observed_std, dataset.groups)}
    engine = StreamingEngine([member], inputs, parts.asset, rule="majority")
    bars = instantiate(cfg.data.source).load(parts.asset)
    stamps = dataset.splits[split].timestamps
    start, stop = int(stamps[0].astype("datetime64[ns]").astype(np.int64)), int(stamps[-1].astype(np.int64)) + 1
    return replay_bars(engine, bars, start_ns=start, stop_ns=stop)


@pytest.mark.parametrize("family,runtime", [(f, r) for f in ("dqn", "ppo") for r in ("numba", "numpy", "torch")])
def test_agents_stream_the_greedy_walk(compose_cfg, family, runtime):
    cfg, parts = _parts(compose_cfg, family)
    replayed = replay_split(cfg, parts, member_of(family, parts.model, parts.dataset, runtime), "test")
    batch = parts.model.trading_positions(parts.datamodule, "test")
    assert len(replayed.close) == len(batch) and replayed.warm_bars == 0
    np.testing.assert_array_equal(replayed.close, parts.dataset.splits["test"].close)
    streamed = replayed.positions[family]
    assert (streamed != 0).sum() > len(batch) // 10  # the walk really trades
    np.testing.assert_array_equal(streamed[:-1], batch[:-1])  # the batch walk closes flat on the last bar


@pytest.mark.parametrize("runtime", ["numba", "torch"])
def test_mamba2_streams_its_recurrent_state(compose_cfg, runtime):
    cfg, parts = _parts(compose_cfg, "mamba2")
    model = parts.model
    member = member_of("mamba2", model, parts.dataset, runtime)
    assert member.runtime == runtime
    replayed = replay_split(cfg, parts, member, "val")
    batch = model.trading_positions(parts.datamodule, "val")
    np.testing.assert_array_equal(replayed.positions["mamba2"], batch)
    assert (batch != 0).sum() > len(batch) // 10
    features = torch.from_numpy(parts.dataset.splits["val"].features)[None]
    with torch.no_grad():
        forecasts = model.forecast_stream(features)[0][0]
    expected = forecasts[..., model.median_index].sum(-1).numpy()
    ready = ~np.isnan(replayed.signals["mamba2"])
    assert ready.sum() == len(batch) - model.seq_len + 1
    np.testing.assert_allclose(replayed.signals["mamba2"][ready], expected[ready], atol=1e-5, rtol=0)


@pytest.mark.parametrize("runtime", ["onnx", "torch"])
def test_tft_reuses_past_encodings_and_matches_the_windows(compose_cfg, tmp_path, runtime):
    cfg, parts = _parts(compose_cfg, "tft")
    model = parts.model
    member = member_of("tft", model, parts.dataset, runtime, workdir=tmp_path)
    assert isinstance(member, TFTMember) and member.runtime == runtime
    replayed = replay_split(cfg, parts, member, "test")
    batch = model.trading_positions(parts.datamodule, "test")
    np.testing.assert_array_equal(replayed.positions["tft"], batch)
    assert (batch != 0).sum() > len(batch) // 10
    windows = parts.datamodule.input_windows("test")
    forecasts = model.predict_windows(windows, 512)
    expected = forecasts[..., model.median_index].sum(-1).numpy()
    got = replayed.signals["tft"][windows["bar_index"].numpy()]
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def test_dlinear_streams_as_a_window_forecaster_and_matches_the_windows(compose_cfg):
    """A family with no streaming code of its own (DLinear) streams through the generic window
    member, bar for bar the batch path's positions and forecasts."""
    cfg, parts = _parts(compose_cfg, "dlinear")
    model = parts.model
    member = member_of("dlinear", model, parts.dataset)
    assert isinstance(member, WindowMember) and member.family == "dlinear"
    replayed = replay_split(cfg, parts, member, "test")
    batch = model.trading_positions(parts.datamodule, "test")
    np.testing.assert_array_equal(replayed.positions["dlinear"], batch)
    assert (batch != 0).sum() > len(batch) // 10
    windows = parts.datamodule.input_windows("test")
    expected = model.predict_windows(windows, 512)[..., model.median_index].sum(-1).numpy()
    np.testing.assert_allclose(replayed.signals["dlinear"][windows["bar_index"].numpy()], expected, atol=1e-5, rtol=0)
