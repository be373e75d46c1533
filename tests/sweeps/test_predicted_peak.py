"""A sweep cell's predicted memory peak (foxhunt.training.memory_plan, as foxhunt.sweeps.estimates reads it) reads the prediction's
probe fits as foxhunt.memory.predict makes them: (batch, activations, model state, allocator peak)."""

from __future__ import annotations

import logging

import pytest

from foxhunt.memory import predict
from foxhunt.memory.accounting import MemoryBreakdown
from foxhunt.memory.predict import Prediction
from foxhunt.sweeps import estimates
from foxhunt.training import memory_plan


def test_the_prediction_names_its_probe_batches(compose_cfg, monkeypatch, tmp_path):
    cfg = compose_cfg(["strategy=parallel", "model=dqn", "asset=es"])
    breakdown = MemoryBreakdown(params_bytes=3 << 20, activations_bytes=5 << 20)
    fits = ((4, 1 << 20, 2 << 20, None), (8, 2 << 20, 2 << 20, 1 << 20))  # an allocator peak only where CUDA ran
    prediction = Prediction("dqn", breakdown, "model.batch_size", 64, probes=fits, seconds=1.5)
    monkeypatch.setattr(predict, "predict_footprint", lambda *args, **kwargs: prediction)

    mb, how = memory_plan._predict(cfg, tmp_path / "probes")

    assert mb == prediction.total_mb
    assert "2 probe fits at model.batch_size=[4, 8] extrapolated to 64" in how


def _predicting(monkeypatch, mb: float, calls: list[int]) -> None:
    def predicted(cfg, workdir):
        calls.append(1)
        return mb, "2 probe fits (stub)"

    monkeypatch.setattr(memory_plan, "_predict", predicted)


def _parallel_cfg(compose_cfg, tmp_path):
    cfg = compose_cfg(["strategy=parallel", "model=dqn", "asset=es"])
    cfg.strategy.prediction_cache = str(tmp_path / "cache")
    return cfg


def test_a_prediction_is_cached_whole_and_read_back(compose_cfg, monkeypatch, tmp_path):
    cfg, calls = _parallel_cfg(compose_cfg, tmp_path), []
    _predicting(monkeypatch, 123.5, calls)

    first, second = estimates._predicted(cfg), estimates._predicted(cfg)

    assert first is not None and second is not None and first[0] == second[0] == 123.5 and calls == [1]
    assert "cached in" in second[1] and "2 probe fits (stub)" in second[1]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [f"{memory_plan.prediction_key(cfg)}.json"]  # no temporary left


@pytest.mark.parametrize(
    "content",
    [
        b'{"mb": 12',
        b"\xff\xfe",
        b"[1, 2]",
        b'{"mb": "9", "how": "x"}',
        b'{"mb": -1, "how": "x"}',
        b'{"mb": NaN, "how": "x"}',
        b'{"mb": true, "how": "x"}',
        b'{"mb": 5}',
    ],
    ids=["cut-short", "not-utf8", "a-list", "mb-a-string", "negative", "nan", "a-bool", "no-how"],
)
def test_a_damaged_cached_prediction_is_ignored_said_and_replaced(compose_cfg, monkeypatch, tmp_path, caplog, content):
    """A cache file half written (a sweep killed mid-write), or edited, is no prediction: the
    sweep predicts again and replaces it, where it used to stop with a traceback from json."""
    cfg, calls = _parallel_cfg(compose_cfg, tmp_path), []
    _predicting(monkeypatch, 77.0, calls)
    cache = tmp_path / "cache" / f"{memory_plan.prediction_key(cfg)}.json"
    cache.parent.mkdir(parents=True)
    cache.write_bytes(content)

    with caplog.at_level(logging.WARNING, logger="foxhunt.training.memory_plan"):
        found = estimates._predicted(cfg)

    assert found is not None and found[0] == 77.0 and calls == [1]
    assert f"{cache}: ignored, not a prediction" in caplog.text
    assert estimates._predicted(cfg)[0] == 77.0 and calls == [1]  # the replacement is read back
