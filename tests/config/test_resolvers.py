"""foxhunt.config.resolvers: ``${foxhunt.run_suffix:}`` is one token per process, the same
everywhere in it, another in the next process, and the end of the run and sweep folders."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from omegaconf import OmegaConf

from foxhunt.config.resolvers import RUN_SUFFIX, register_resolvers, run_suffix

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")


def test_the_token_is_eight_hex_digits_fixed_for_the_process():
    token = run_suffix()
    assert re.fullmatch(r"[0-9a-f]{8}", token)
    register_resolvers()  # again: idempotent, the same token
    cfg = OmegaConf.create({"a": "${foxhunt.run_suffix:}", "b": "x_${foxhunt.run_suffix:}"})
    assert OmegaConf.has_resolver(RUN_SUFFIX)
    assert (cfg.a, cfg.b, run_suffix()) == (token, f"x_{token}", token)


def test_two_processes_get_two_tokens():
    code = "from foxhunt.config.resolvers import run_suffix; print(run_suffix())"
    env = {**os.environ, "PYTHONPATH": SRC}
    tokens = {subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()
              for _ in range(3)}  # fmt: skip
    assert len(tokens) == 3 and all(re.fullmatch(r"[0-9a-f]{8}", t) for t in tokens)
    assert run_suffix() not in tokens


def test_the_run_and_sweep_folders_end_with_the_token(compose_cfg):
    cfg = compose_cfg(["model=dqn", "asset=nq"])
    token = run_suffix()
    assert re.search(rf"/outputs/runs/\d{{4}}-\d\d-\d\d_\d\d-\d\d-\d\d_dqn-nq-fp32_{token}$", cfg.hydra.run.dir)
    assert cfg.hydra.sweep.dir.endswith(f"_{token}")
