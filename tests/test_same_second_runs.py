"""Runs started in the same second keep their own folders and checkpoints (end to end, real
``foxhunt-train`` processes on a shared SQLite store, as tests/test_run_records.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from run_records_helpers import QUICK, TINY, _finish, _logged_checkpoints, _runs, _start

# foxhunt-train with Hydra's ${now:} at one instant for every process: the same second for sure
# (processes composing on two cores can straddle a second boundary).
RUN_AT = """
import sys
from datetime import datetime
import hydra.core.utils
from foxhunt.train import main

INSTANT = float(sys.argv[1])

class Frozen(datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime.fromtimestamp(INSTANT, tz)

hydra.core.utils.datetime = Frozen
sys.argv = ["foxhunt-train", *sys.argv[2:]]
main()
"""


def test_runs_started_in_the_same_second_keep_their_own_folders_and_checkpoints(tmp_path):
    """Two ``foxhunt-train seed=N`` at once, their run folders named in the same second: two
    folders, each run's logged checkpoints stamped with its own id and holding its own weights;
    then two ``foxhunt ensemble register`` at once: the champion is registered once."""
    import torch

    from foxhunt.training.checkpoint import read_stamp

    env = {**os.environ, "FOXHUNT_ROOT": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    instant = time.time()
    processes = [
        subprocess.Popen([sys.executable, "-c", RUN_AT, str(instant), f"seed={seed}", *QUICK, *TINY["dqn"]],
                         env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for seed in (1, 2)
    ]  # fmt: skip
    for seed, process in enumerate(processes, 1):
        _finish(process, f"seed {seed}")
    runs = {run_id: run for run_id, run in _runs(tmp_path).items() if run["status"] == "FINISHED"}
    assert sorted(run["tags"]["seed"] for run in runs.values()) == ["1", "2"]
    folders = {run["tags"]["output_dir"] for run in runs.values()}
    assert len(folders) == 2 and len({Path(f).name[:19] for f in folders}) == 1  # one second, two folders
    weights = {}
    for run_id in runs:
        stamps = _logged_checkpoints(tmp_path, run_id)
        assert {stamp["run_id"] for stamp in stamps.values()} == {run_id}
        folder = Path(runs[run_id]["tags"]["output_dir"]) / "checkpoints"
        assert set(stamps) == {"best.ckpt"}  # logger.log_checkpoints=best: a finished run stores its best
        local = {p.name: (read_stamp(p) or {}).get("run_id") for p in folder.glob("*.ckpt")}
        assert local == {"best.ckpt": run_id, "last.ckpt": run_id}  # nothing in its folder but its own
        weights[run_id] = torch.load(folder / "best.ckpt", weights_only=True)["state_dict"]
    first = next(iter(weights.values()))
    assert sum(all(torch.equal(first[k], w[k]) for k in first) for w in weights.values()) == 1  # two different models

    register = ["ensemble", "register", "ensemble.models=[dqn]", "ensemble.gate=none"]
    both = [_start(register, tmp_path, program="foxhunt") for _ in range(2)]
    for process in both:
        _finish(process, "foxhunt ensemble register")
    from foxhunt.runs.store import RunStore

    store = RunStore(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    assert store.get_version("foxhunt-dqn-es", 1) is not None and store.get_version("foxhunt-dqn-es", 2) is None
    champion = store.get_version_by_alias("foxhunt-dqn-es", "champion")
    assert champion.run_id in runs and champion.version == "1"
