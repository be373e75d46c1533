"""Checkpoints: stamped by every run, accepted by the check when they fit the config, and written
atomically (a ``kill -9`` in the middle of a write leaves the previous file loadable)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from foxhunt.checkpoint import STAMP_KEY, CheckpointError, check_checkpoint

MODELS = ["dqn", "ppo", "mamba2", "tft"]


@pytest.mark.parametrize("model", MODELS)
def test_a_stamped_checkpoint_of_the_configs_model_passes_the_check(compose_cfg, tmp_path, model):
    """The meta-device model the check compares with has the real model's weights, for every family."""
    import torch

    from foxhunt.build import build_model

    cfg = compose_cfg([f"model={model}"])
    built = build_model(cfg)
    path = tmp_path / f"{model}.ckpt"
    stamp = {"format": 1, "model": model, "module": cfg.model.module._target_, "precision": "fp32"}
    torch.save({"state_dict": built.state_dict(), "hyper_parameters": dict(built.hparams), STAMP_KEY: stamp}, path)
    assert check_checkpoint(cfg, path) == stamp
    assert check_checkpoint(compose_cfg([f"model={model}", "precision=bf16"]), path) == stamp  # same fp32 weights
    with pytest.raises(CheckpointError, match="precision=int8"):
        check_checkpoint(compose_cfg([f"model={model}", "precision=int8"]), path)


def test_a_run_stamps_its_checkpoints_and_starts_again_from_one(compose_cfg, tmp_path):
    import torch

    from foxhunt.train import train_run

    overrides = ["model=dqn", "trainer=smoke", "logger=none", "data.source.days=7", "evaluation.plot_equity=false"]
    train_run(compose_cfg(overrides))
    folder = tmp_path / "outputs" / "run" / "checkpoints"
    for name in ("best.ckpt", "last.ckpt"):
        state = torch.load(folder / name, weights_only=True)
        assert state[STAMP_KEY] == {"format": 1, "model": "dqn", "module": "foxhunt.models.dqn.DQNAgent", "precision": "fp32"}
    assert not list(folder.glob(".*.tmp"))  # no temporary file left behind
    again = train_run(compose_cfg([*overrides, f"ckpt={folder / 'last.ckpt'}", "trainer.max_epochs=2"]))
    assert again.status == "FINISHED"
    with pytest.raises(CheckpointError, match="a dqn checkpoint, but the config trains model=ppo"):
        train_run(compose_cfg([*overrides, "model=ppo", f"ckpt={folder / 'last.ckpt'}"]))


KILLED_WRITER = """
import sys, time
import torch
from foxhunt.checkpoint import atomic_save

path, marker = sys.argv[1], sys.argv[2]
atomic_save({"state_dict": {"w": torch.zeros(4)}, "global_step": 1}, path)  # the previous checkpoint

def slow_save(obj, handle, *args, **kwargs):  # half a new checkpoint reaches the disk, then the kill
    handle.write(b"PK\\x03\\x04" + b"\\x00" * 4096)
    handle.flush()
    open(marker, "w").close()
    time.sleep(120)

torch.save = slow_save
atomic_save({"state_dict": {"w": torch.ones(4)}, "global_step": 2}, path)
"""


def test_kill_9_during_a_checkpoint_write_leaves_the_previous_checkpoint_loadable(tmp_path):
    import torch

    path, marker = tmp_path / "last.ckpt", tmp_path / "writing"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path), str(marker)], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert writer.poll() is None, writer.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=30)
    assert writer.returncode == -signal.SIGKILL
    state = torch.load(path, weights_only=True)  # the previous file, whole
    assert state["global_step"] == 1 and torch.equal(state["state_dict"]["w"], torch.zeros(4))
