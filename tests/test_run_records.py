"""Every run records only its own: checkpoints, metrics and workers never cross between runs.

End to end, as a user runs foxhunt: ``foxhunt-train`` with the default callbacks, against the
SQLite store its runs share.

- every model x precision trains through the entry point with every default callback on
  (the allocator-peak meter of the memory callback and torchao's compiled 8-bit update), in the
  test's process (tests/train_entry.py): no process boundary is checked here, and each family
  has a store of its own;
- runs started in the same second get folders of their own, log only their own checkpoints
  (each stamped with its run's id), and two ``foxhunt ensemble register`` at once register once:
  real processes, tests/test_same_second_runs.py;
- killed with SIGKILL and resumed: a real process, tests/test_kill_resume.py.

(Each file holds one such test: pytest-xdist runs a file whole on one worker, and two of these
minute-long tests in one file queued on it.)
"""

from __future__ import annotations

from run_records_helpers import QUICK, TINY, _db, _logged_checkpoints, _repeated_metric_steps, _runs, _train_here


def test_every_model_and_precision_trains_through_foxhunt_train_with_the_default_callbacks(tmp_path, monkeypatch, capfd):
    """One ``foxhunt-train -m precision=fp32,bf16,int8`` sweep per family, one after another:
    every cell FINISHED with its memory figures and its checkpoints, each (metric, step) once."""
    for model, sizes in TINY.items():
        root = tmp_path / model
        root.mkdir()
        _train_here(monkeypatch, capfd, root, ["-m", f"model={model}", "precision=fp32,bf16,int8", *QUICK, *sizes,
                                               "trainer.limit_train_batches=3"], f"{model} sweep")  # fmt: skip
        cells = {run["name"]: (run_id, run) for run_id, run in _runs(root).items() if "config_hash" in run["tags"]}
        assert sorted(cells) == [f"{model}-es-{p}" for p in ("bf16", "fp32", "int8")]
        for name, (run_id, run) in cells.items():
            assert run["status"] == "FINISHED", f"{name}: {run['tags'].get('error')}"
            with _db(root) as db:
                logged = {k for (k,) in db.execute("SELECT DISTINCT key FROM metrics WHERE run_uuid = ?", (run_id,))}
            assert {"memory/peak_mb", "memory/optimizer_mb", "val/sharpe", "test/sharpe"} <= logged, name
            assert _repeated_metric_steps(root, run_id) == [], name
            stamps = _logged_checkpoints(root, run_id)
            assert set(stamps) == {"best.ckpt"}, name  # logger.log_checkpoints=best: a finished run's best only
            assert {stamp["run_id"] for stamp in stamps.values()} == {run_id}, name
