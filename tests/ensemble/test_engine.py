"""The streaming engine over many streams: several symbols' bars stepped together (one batched
call per member) decide exactly as each symbol streamed alone; slots are reused clean; int8
members stay close to fp32."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ensemble_helpers import STREAMING_SMALL as SMALL
from hydra.utils import instantiate

from foxhunt.ensemble.engine import MemberInputs, StreamingEngine
from foxhunt.ensemble.members import make_member
from foxhunt.training.parts import build_parts

RUNTIMES = {"dqn": ["numba", "numpy", "torch"], "ppo": ["numba"], "mamba2": ["numba", "torch"], "tft": ["onnx", "torch"]}
STREAMS, OFFSET, BARS = 5, 37, 160  # stream k reads the bars from k * OFFSET on: five different histories


def _setup(compose_cfg, family: str):
    cfg = compose_cfg([f"model={family}", "data.source.days=4", "logger=none", *SMALL[family]])
    torch.manual_seed(0)
    parts = build_parts(cfg)
    parts.model.eval()
    bars = instantiate(cfg.data.source).load(parts.asset)
    values = bars[["open", "high", "low", "close", "volume"]].to_numpy(np.float64)
    stamps = bars.index.as_unit("ns").asi8
    rows = [[(int(stamps[k * OFFSET + i]), *map(float, values[k * OFFSET + i])) for i in range(BARS)] for k in range(STREAMS)]
    return parts, rows


def _engine(parts, member) -> StreamingEngine:
    ds = parts.dataset
    return StreamingEngine([member], {member.name: MemberInputs(ds.feature_config, ds.observed_mean, ds.observed_std, ds.groups)},
                           parts.asset, rule="majority")  # fmt: skip


def _decisions(results) -> list[tuple]:
    return [(r.position, *((d.position, d.signal) for d in r.decisions.values())) for r in results]


@pytest.mark.parametrize(("family", "runtime"), [(f, r) for f, rs in RUNTIMES.items() for r in rs])
def test_streams_stepped_together_decide_as_each_stream_alone(compose_cfg, tmp_path, family, runtime):
    parts, rows = _setup(compose_cfg, family)
    member = make_member(family, family, parts.model, "fp32", None, runtime, 10, parts.dataset.groups, workdir=tmp_path)
    assert member.runtime == runtime
    engine = _engine(parts, member)
    streams = [engine.open_stream(f"S{k}") for k in range(STREAMS)]
    together: list[list] = [[] for _ in streams]
    for i in range(BARS):
        live = [k for k in range(STREAMS) if i >= k * 3]  # streams join at different bars: batches of 1 to 5
        for k, result in zip(live, engine.step_many([(streams[k], rows[k][i - k * 3]) for k in live])):
            together[k].append(result)
    for k in range(STREAMS):
        alone = _engine(parts, member)  # the same member: its pool now holds these streams' slots too
        solo = [alone.step(*bar) for bar in rows[k][: len(together[k])]]
        for got, want in zip(_decisions(together[k]), _decisions(solo)):
            assert got[0] == want[0] and len(got) == len(want)
            for (p, s), (q, t) in zip(got[1:], want[1:]):
                assert p == q and (s is None) == (t is None) and (s is None or abs(s - t) <= 1e-4)
    assert any(r.warm for r in together[0])


def test_a_freed_slot_starts_clean(compose_cfg, tmp_path):
    parts, rows = _setup(compose_cfg, "mamba2")
    member = make_member("mamba2", "mamba2", parts.model, "fp32", None, "numba", 10, parts.dataset.groups)
    engine = _engine(parts, member)
    first = engine.open_stream("A")
    for bar in rows[0][:80]:
        engine.step_many([(first, bar)])
    engine.close_stream(first)
    reused = engine.open_stream("B")
    assert reused.slots == first.slots  # the slot came back
    again = [engine.step_many([(reused, bar)])[0] for bar in rows[1]]
    fresh_engine = _engine(parts, make_member("mamba2", "mamba2", parts.model, "fp32", None, "numba", 10, parts.dataset.groups))
    fresh = [fresh_engine.step(*bar) for bar in rows[1]]
    assert _decisions(again) == _decisions(fresh)


def test_a_bad_bar_among_streams_is_answered_alone(compose_cfg):
    from foxhunt.data.errors import BarDataError

    parts, rows = _setup(compose_cfg, "dqn")
    engine = _engine(parts, make_member("dqn", "dqn", parts.model, "fp32", None, "numba", 10, parts.dataset.groups))
    a, b = engine.open_stream("A"), engine.open_stream("B")
    engine.step_many([(a, rows[0][0]), (b, rows[1][0])])
    ts, o, h, lo, c, v = rows[1][1]
    results = engine.step_many([(a, rows[0][1]), (b, (ts, o + 0.1, h, lo, c, v))])  # off the tick grid
    assert not isinstance(results[0], Exception) and isinstance(results[1], BarDataError)
    assert "off the tick grid" in str(results[1])
    assert not isinstance(engine.step_many([(b, rows[1][1])])[0], Exception)  # B took nothing of the bad bar


@pytest.mark.parametrize("family", ["dqn", "mamba2", "tft"])
def test_int8_members_forecast_close_to_fp32(compose_cfg, tmp_path, family):
    """int8 weights (numba rows with scales; ONNX Runtime's dynamic quantization for the TFT):
    forecasts within 10% of the signal's typical size of fp32's, the same runtime family."""
    parts, rows = _setup(compose_cfg, family)
    answers = {}
    for weights in ("fp32", "int8"):
        member = make_member(
            family, family, parts.model, weights, None, "auto", 10, parts.dataset.groups, workdir=tmp_path / weights
        )
        assert member.weights == weights and member.runtime in ("numba", "onnx")
        engine = _engine(parts, member)
        answers[weights] = [engine.step(*bar) for bar in rows[0]]
    if family == "dqn":
        agree = np.mean([a.position == b.position for a, b in zip(answers["fp32"], answers["int8"])])
        assert agree >= 0.95
        return
    signals = np.array([[r.decisions[family].signal for r in answers[w] if r.warm and r.decisions[family].signal is not None]
                        for w in ("fp32", "int8")])  # fmt: skip
    assert signals.shape[1] > 50
    scale = np.median(np.abs(signals[0]))
    assert np.max(np.abs(signals[0] - signals[1])) <= 0.1 * scale


@pytest.mark.parametrize("family", ["dqn", "mamba2"])
def test_a_dynamically_quantized_copy_streams_in_torch(compose_cfg, family):
    """``torch.ao.quantization.quantize_dynamic`` copies (the benchmark's int8 side-by-side): their
    projections' ``weight`` is a method, not a tensor, so the numba kernels refuse them and the
    torch runtime streams them (Mamba-2's state from its plain conv weights)."""
    import copy

    parts, rows = _setup(compose_cfg, family)
    quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(parts.model), {torch.nn.Linear}, dtype=torch.qint8)
    member = make_member(family, family, quantized, "fp32", None, "auto", 3, parts.dataset.groups)
    assert member.runtime == "torch"
    engine = _engine(parts, member)
    results = [engine.step(*bar) for bar in rows[0][:120]]
    assert any(r.warm for r in results)
