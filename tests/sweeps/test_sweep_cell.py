"""One job of a sweep: the cell's result is written to its ``cell.json`` however the cell ends;
a failure is the sweep's to report (the job returns ``None``), a stop request ends the sweep
(re-raised, Lightning's code-less SIGTERM exit as status 143)."""

from __future__ import annotations

import pytest
from omegaconf import open_dict
from sweep_helpers import written

from foxhunt.runs.cell import CellKey, CellResult
from foxhunt.runs.environment import PARENT_RUN_ENV, SWEEP_PID_ENV
from foxhunt.sweeps.sweep_cell import run_sweep_cell


@pytest.fixture
def job(sweep_config, tmp_path, monkeypatch):
    """A grid job's config with its own folder; no parent run, no sweep process to watch."""
    monkeypatch.delenv(PARENT_RUN_ENV, raising=False)
    monkeypatch.delenv(SWEEP_PID_ENV, raising=False)
    with open_dict(sweep_config):
        sweep_config.paths.output_dir = str(tmp_path / "job0")
    return sweep_config


def test_a_finished_cell_returns_its_metrics_and_writes_its_result(job):
    key = CellKey("dqn", "es", "fp32", "42", "abc")
    outcome = CellResult(key, status="FINISHED", run_id="r1", metrics={"val/sharpe": 1.5}, scores={"test": object()})
    assert run_sweep_cell(job, lambda cfg, **kwargs: outcome) == {"val/sharpe": 1.5}
    result = written(job)
    assert (result.status, result.run_id, result.metrics, result.key) == ("FINISHED", "r1", {"val/sharpe": 1.5}, key)
    assert result.wall_s is not None and result.wall_s >= 0  # measured here when the cell did not say


def test_a_failed_cell_is_written_failed_and_the_sweep_goes_on(job):
    def fails(cfg, **kwargs):
        raise ValueError("loss is NaN at step 30")

    assert run_sweep_cell(job, fails) is None
    result = written(job)
    assert (result.status, result.error, result.cell) == ("FAILED", "ValueError: loss is NaN at step 30", "dqn-es-fp32")
    assert result.key.config_hash and result.wall_s >= 0  # the config's hash: resume finds the cell by it


@pytest.mark.parametrize("stop, raised", [(KeyboardInterrupt(), KeyboardInterrupt), (SystemExit(), SystemExit)])
def test_a_stop_request_is_written_killed_and_ends_the_sweep(job, stop, raised):
    def stopped(cfg, **kwargs):
        raise stop

    with pytest.raises(raised) as caught:
        run_sweep_cell(job, stopped)
    if raised is SystemExit:
        assert caught.value.code == 143  # Lightning's SIGTERMException carries no code: it would exit 0
    assert written(job).status == "KILLED"
