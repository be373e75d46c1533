"""The README's MLflow lines run as written from a fresh folder: ``export MLFLOW_TRACKING_URI=...``
in the folder holding mlruns/, then the ``pyfunc`` one-liner from another folder loads the
champion (without the URI MLflow made an empty ``mlflow.db`` in the current folder and found no
model). ``mlflow models serve`` reads the same variable (checked by hand: README's line answered
``POST /invocations`` from a fresh folder, 2026-12-03)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ensemble_helpers import FAST, SMALL, cli

from foxhunt.training.cell import train

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"```bash\n(?P<lines>export MLFLOW_TRACKING_URI=[^\n]*\n(?:[^`][^\n]*\n)+)```")


@pytest.fixture(scope="module")
def dqn_store(tmp_path_factory) -> tuple[Path, str]:
    """A store under a fresh folder with one DQN smoke run registered as foxhunt-dqn-es@champion."""
    from configs import compose_train_config

    root = tmp_path_factory.mktemp("store")
    train(compose_train_config(["model=dqn", *FAST, *SMALL["dqn"]], root))
    result = cli(root, "ensemble", "register", "asset=es", "ensemble.models=[dqn]", "ensemble.gate=none")
    assert result.exit_code == 0, result.output
    (run_id,) = re.findall(r"foxhunt-dqn-es version 1 @champion: registered.*run (\w+)", result.output)
    return root, run_id


def test_the_readme_pyfunc_line_loads_the_champion_from_a_fresh_folder(dqn_store, tmp_path):
    root, run_id = dqn_store
    (block,) = BLOCK.finditer(README.read_text())
    export, load = block.group("lines").splitlines()[:2]
    assert load.startswith("python -c 'import mlflow; ") and "models:/foxhunt-tft-es@champion" in load
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    script = f"{export}\ncd {fresh}\n{load.replace('foxhunt-tft-es', 'foxhunt-dqn-es')}\n"  # the test store's champion
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # python: this environment's
    done = subprocess.run(["bash", "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == run_id  # the registered run's model, found through the store
    assert list(fresh.iterdir()) == []  # no stray mlflow.db (nor anything else) where it ran
    assert sorted(p.name for p in root.glob("*.db")) == []
