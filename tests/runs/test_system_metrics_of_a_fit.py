"""A short training fit samples the machine into its run's System metrics tab (``system/*``)
when ``logger.system_metrics_s`` is set (issue 40).

The fit is :func:`foxhunt.training.fit.fit_and_score` in its MLflow run, as a cell calls it, with
the key as a user sets it (conf/logger/mlflow.yaml: every 10 s by default; logger=none: null)."""

from __future__ import annotations

import threading

from foxhunt.runs.store import RunStore
from foxhunt.runs.tracked_run import TrackedRun
from foxhunt.training.fit import SYSTEM_METRICS_KEY, build_callbacks, fit_and_score

SMOKE = [
    "model=dqn",
    "trainer=smoke",
    "trainer.limit_train_batches=3",
    "data.source.days=7",
    "evaluation.plot_equity=false",
    "evaluation.max_bars=300",
]


def test_a_short_fit_has_system_metrics_in_the_store_when_asked(compose_cfg, tmp_path):
    """(Off, None: tests/runs/test_tracked_run samples nothing.)"""
    interval = 0.2
    assert compose_cfg(SMOKE).logger.system_metrics_s == 10 and compose_cfg(["logger=none"]).logger.system_metrics_s is None
    cfg = compose_cfg([*SMOKE, f"{SYSTEM_METRICS_KEY}={interval}"])
    with TrackedRun(cfg.logger.tracking_uri, "unit", cfg.logger.artifact_location, "dqn-es-fp32", {}) as run:
        (tmp_path / "out").mkdir()
        fit_and_score(cfg, build_callbacks(cfg, terminal=False), run, tmp_path / "out", None)
    assert not [t for t in threading.enumerate() if t.name == "SystemMetricsMonitor"]
    system = {key for key in RunStore(cfg.logger.tracking_uri).get(run.run_id).metrics if key.startswith("system/")}
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= system
