"""A sweep's cell results (``cell.json``), its identity (sweep hash), the SLURM strategy's sizes."""

from __future__ import annotations

import json
from pathlib import Path

from sweep_helpers import with_task_overrides

from foxhunt.runs.cell import CellKey, CellResult, read_results


def test_results_round_trip_and_a_broken_one_is_skipped(tmp_path):
    key = CellKey("dqn", "es", "fp32", "42", "abc")
    result = CellResult(key, status="FINISHED", run_id="r1", wall_s=1.5, metrics={"test/sharpe": 0.5})
    result.write(tmp_path / "dqn_es_fp32")
    CellResult(CellKey("tft", "nq", "fp32", "42", "def"), error="ValueError: bad").write(tmp_path / "tft_nq_fp32")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "cell.json").write_text("{not json")
    results = read_results(tmp_path)
    assert [r.cell for r in results] == ["dqn-es-fp32", "tft-nq-fp32"]
    assert results[0] == result
    assert results[1].status == "FAILED" and results[1].error == "ValueError: bad"
    assert json.loads((tmp_path / "dqn_es_fp32" / "cell.json").read_text())["metrics"] == {"test/sharpe": 0.5}


def test_sweep_hash_ignores_launch_choices(sweep_config):
    from foxhunt.sweeps.callback import sweep_hash

    base = sweep_hash(sweep_config)
    task = list(sweep_config.hydra.overrides.task)
    launch = with_task_overrides(sweep_config, [*task, "strategy=parallel", "resume=true", "strategy.n_jobs=2"])
    assert sweep_hash(launch) == base
    assert sweep_hash(with_task_overrides(sweep_config, [*task, "trainer=smoke"])) != base


def test_slurm_strategy_sizes_each_job_from_the_strategy_keys(tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    conf_dir = Path(__file__).resolve().parents[2] / "conf"
    overrides = [
        f"paths.root_dir={tmp_path}",
        "strategy=slurm",
        "strategy.partition=gpu",
        "strategy.gpus_per_job=2",
        "strategy.time_min=90",
        "strategy.setup=[module load cuda]",
    ]
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    assert launcher["_target_"] == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    resolved = {
        key: OmegaConf.select(cfg, f"hydra.launcher.{key}")
        for key in ("partition", "gpus_per_node", "timeout_min", "cpus_per_task", "setup")
    }
    assert resolved == {
        "partition": "gpu",
        "gpus_per_node": 2,
        "timeout_min": 90,
        "cpus_per_task": 8,
        "setup": ["module load cuda"],
    }
