"""A sweep cell's predicted memory peak (foxhunt.sweeps.estimates._predict) reads the prediction's
probe fits as foxhunt.memory.predict makes them: (batch, activations, model state, allocator peak)."""

from __future__ import annotations

from foxhunt.memory import predict
from foxhunt.memory.accounting import MemoryBreakdown
from foxhunt.memory.predict import Prediction
from foxhunt.sweeps import estimates


def test_the_prediction_names_its_probe_batches(compose_cfg, monkeypatch, tmp_path):
    cfg = compose_cfg(["strategy=parallel", "model=dqn", "asset=es"])
    breakdown = MemoryBreakdown(params_bytes=3 << 20, activations_bytes=5 << 20)
    fits = ((4, 1 << 20, 2 << 20, None), (8, 2 << 20, 2 << 20, 1 << 20))  # an allocator peak only where CUDA ran
    prediction = Prediction("dqn", breakdown, "model.batch_size", 64, probes=fits, seconds=1.5)
    monkeypatch.setattr(predict, "predict_footprint", lambda *args, **kwargs: prediction)

    mb, how = estimates._predict(cfg, tmp_path / "probes")

    assert mb == prediction.total_mb
    assert "2 probe fits at model.batch_size=[4, 8] extrapolated to 64" in how
