"""Checkpoints: stamped by every run, accepted by the check when they fit the config, and written
atomically (a ``kill -9`` in the middle of a write leaves the previous file loadable)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from foxhunt.config.families import family_names
from foxhunt.training.checkpoint import STAMP_KEY, CheckpointError, check_checkpoint

MODELS = list(family_names())


@pytest.mark.parametrize("model", MODELS)
def test_a_stamped_checkpoint_of_the_configs_model_passes_the_check(compose_cfg, tmp_path, model):
    """The meta-device model the check compares with has the real model's weights, for every family."""
    import torch

    from foxhunt.training.parts import build_model

    cfg = compose_cfg([f"model={model}"])
    built = build_model(cfg)
    path = tmp_path / f"{model}.ckpt"
    stamp = {"format": 1, "model": model, "module": cfg.model.module._target_, "precision": "fp32"}
    torch.save({"state_dict": built.state_dict(), "hyper_parameters": dict(built.hparams), STAMP_KEY: stamp}, path)
    assert check_checkpoint(cfg, path).stamp == stamp
    assert check_checkpoint(compose_cfg([f"model={model}", "precision=bf16"]), path).stamp == stamp  # fp32 weights
    with pytest.raises(CheckpointError, match="precision=int8"):
        check_checkpoint(compose_cfg([f"model={model}", "precision=int8"]), path)


def test_a_mamba2_checkpoint_from_before_the_shared_quantile_head_still_passes(compose_cfg, tmp_path):
    """Mamba-2 checkpoints written before foxhunt.models.quantiles held the head as ``head.weight``
    / ``head.bias`` (now ``head.linear.*``): ``ckpt=`` and resume still take them, and the weights
    load into the model (seen failing before: 'head.linear.bias missing from the checkpoint')."""
    import torch

    from foxhunt.training.parts import build_model

    cfg = compose_cfg(["model=mamba2", "model.module.d_model=32", "model.module.n_layers=1"])
    built = build_model(cfg)
    old = {k.replace("head.linear.", "head."): v for k, v in built.state_dict().items()}
    assert "head.weight" in old and not any(k.startswith("head.linear.") for k in old)
    path = tmp_path / "old.ckpt"
    stamp = {"format": 1, "model": "mamba2", "module": cfg.model.module._target_, "precision": "fp32"}
    torch.save({"state_dict": old, "hyper_parameters": dict(built.hparams), STAMP_KEY: stamp}, path)
    assert check_checkpoint(cfg, path).stamp == stamp
    fresh = build_model(cfg)
    fresh.load_state_dict(torch.load(path, weights_only=True)["state_dict"])
    assert torch.equal(fresh.head.linear.weight, built.head.linear.weight)


def test_a_run_stamps_its_checkpoints_and_starts_again_from_one(compose_cfg, tmp_path):
    import torch

    from foxhunt.training.cell import run_cell

    overrides = ["model=dqn", "trainer=smoke", "logger=none", "data.source.days=7", "evaluation.plot_equity=false"]
    run_cell(compose_cfg(overrides))
    folder = tmp_path / "outputs" / "run" / "checkpoints"
    for name in ("best.ckpt", "last.ckpt"):
        state = torch.load(folder / name, weights_only=True)
        stamp = state[STAMP_KEY]
        assert stamp.pop("saved_at_ms") <= time.time() * 1000
        assert stamp == {"format": 1, "model": "dqn", "module": "foxhunt.models.dqn.DQNAgent", "precision": "fp32"}
    assert not list(folder.glob(".*.tmp"))  # no temporary file left behind
    again = run_cell(compose_cfg([*overrides, f"ckpt={folder / 'last.ckpt'}", "trainer.max_epochs=2"]))
    assert again.status == "FINISHED"
    with pytest.raises(CheckpointError, match="a dqn checkpoint, but the config trains model=ppo"):
        run_cell(compose_cfg([*overrides, "model=ppo", f"ckpt={folder / 'last.ckpt'}"]))


KILLED_WRITER = """
import sys, time
import torch
from foxhunt.training.checkpoint import atomic_save

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


def _train_process(args: list[str], root) -> subprocess.Popen:
    env = {**os.environ, "FOXHUNT_ROOT": str(root), "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-m", "foxhunt.train", *args], env=env, cwd=root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _history(uri: str, key: str) -> list[int]:
    from foxhunt.runs.store import RunStore

    store = RunStore(uri)
    (run,) = store.search("foxhunt")
    return sorted(m.step for m in store.client.get_metric_history(run.run_id, key))


@pytest.mark.slow
def test_resume_after_kill_9_continues_the_same_run_with_every_step_once(tmp_path):
    """A real ``foxhunt-train resume=true`` killed with SIGKILL in its second epoch, then started
    again: the same MLflow run ends FINISHED and its metric history has each step exactly once,
    the same steps as an uninterrupted run."""
    import sqlite3

    import torch

    from foxhunt.runs.environment import store_uri
    from foxhunt.runs.store import RunStore

    args = [
        "model=dqn", "trainer=smoke", "trainer.max_epochs=3", "trainer.limit_train_batches=150",
        "trainer.limit_val_batches=1", "data.source.days=7", "evaluation.plot_equity=false", "resume=true",
        "callbacks.progress.every_n_steps=1",
    ]  # fmt: skip
    killed_root, reference_root = tmp_path / "killed", tmp_path / "reference"
    for root in (killed_root, reference_root):
        root.mkdir()
    out = killed_root / "out"
    first = _train_process([*args, f"paths.output_dir={out}"], killed_root)
    last, database = out / "checkpoints" / "last.ckpt", killed_root / "mlruns" / "mlflow.db"
    deadline = time.monotonic() + 600
    while True:  # kill once the run has logged steps beyond its first epoch's checkpoint
        assert first.poll() is None, f"the run ended before the kill: {first.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline
        time.sleep(0.05)
        if not (last.is_file() and database.is_file()):
            continue
        saved = torch.load(last, weights_only=True)["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"]
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
            (logged,) = db.execute("SELECT max(step) FROM metrics WHERE key = 'progress'").fetchone()
        if logged is not None and logged >= saved + 20:
            break
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=60)
    assert (RunStore(store_uri(killed_root)).search("foxhunt")[0].status) == "RUNNING"  # as the kill left it

    second = _train_process([*args, f"paths.output_dir={out}"], killed_root)
    reference = _train_process([*args, f"paths.output_dir={reference_root / 'out'}"], reference_root)
    for process in (second, reference):
        assert process.wait(timeout=900) == 0, process.stderr.read()[-3000:]

    (run,) = RunStore(store_uri(killed_root)).search("foxhunt")  # the same run, continued
    assert run.status == "FINISHED" and run.tags["resume_count"] == "1"
    for key in ("progress", "train/epsilon"):  # (progress: its last step twice in both, at batch and fit end)
        steps = _history(store_uri(killed_root), key)
        assert steps == _history(store_uri(reference_root), key), f"{key}: a step lost or logged twice"
    # train/loss: once per step too; the resumed DQN refills its replay buffer (not in a checkpoint)
    # before it updates again, so the steps right after the checkpoint have no loss to log
    losses = _history(store_uri(killed_root), "train/loss")
    assert len(losses) == len(set(losses)) and max(losses) == max(_history(store_uri(reference_root), "train/loss"))


def test_a_checkpoint_names_its_run_and_is_refused_where_it_belongs_to_another(compose_cfg, tmp_path):
    """Each logged run stamps its checkpoints with its run id; a checkpoint planted in another
    run's folder is refused by ``ckpt=`` and by a check for that run, naming both runs; a run's
    own checkpoint starts a new run, which records where it started from."""
    import shutil

    import torch

    from foxhunt.runs.store import RunStore
    from foxhunt.training.cell import run_cell

    quick = ["model=dqn", "trainer=smoke", "data.source.days=7", "evaluation.plot_equity=false", "evaluation.max_bars=200"]
    first = run_cell(compose_cfg([*quick, f"paths.output_dir={tmp_path / 'a'}"]))
    second = run_cell(compose_cfg([*quick, "seed=7", f"paths.output_dir={tmp_path / 'b'}"]))
    own = tmp_path / "a" / "checkpoints" / "best.ckpt"
    assert torch.load(own, weights_only=True)[STAMP_KEY]["run_id"] == first.run_id
    planted = tmp_path / "b" / "checkpoints" / "best.ckpt"
    shutil.copy(own, planted)  # run a's weights in run b's folder
    with pytest.raises(CheckpointError) as refused:
        run_cell(compose_cfg([*quick, f"ckpt={planted}", f"paths.output_dir={tmp_path / 'c'}"]))
    assert str(refused.value) == (f"ckpt={planted} (in the folder of run {second.run_id}): stamped for run {first.run_id}, "
                                  f"not for run {second.run_id} (a checkpoint belongs to the run that wrote it)")  # fmt: skip
    with pytest.raises(CheckpointError, match=f"stamped for run {first.run_id}, not for run {second.run_id}"):
        check_checkpoint(compose_cfg(quick), planted, key="resume", run_id=second.run_id)
    started = run_cell(compose_cfg([*quick, f"ckpt={own}", "trainer.max_epochs=2", f"paths.output_dir={tmp_path / 'd'}"]))
    store = RunStore(compose_cfg(quick).logger.tracking_uri)
    assert store.get(started.run_id).tags["ckpt.run_id"] == first.run_id
    # run b killed with kill -9 (the store still says RUNNING) and its last.ckpt damaged: resume=true refuses the
    # checkpoint in one line, and the run stayed RUNNING with its process gone (found by a helper probing resume);
    # it ends KILLED, as a stale run not continued does
    from mlflow.tracking import MlflowClient

    from foxhunt.runs.resume import SETTLED_REASON

    client = MlflowClient(compose_cfg(quick).logger.tracking_uri)
    client.set_tag(second.run_id, "pid", "999999999")
    client.update_run(second.run_id, status="RUNNING")
    (tmp_path / "b" / "checkpoints" / "last.ckpt").write_bytes(b"PK\x03\x04 cut off")
    with pytest.raises(CheckpointError, match=f"resume of run {second.run_id}: checkpoint=.*last.ckpt: not a torch checkpoint"):
        run_cell(compose_cfg([*quick, "seed=7", f"paths.output_dir={tmp_path / 'b'}", "resume=true"]))
    run = client.get_run(second.run_id)
    assert (run.info.status, run.data.tags["stop_reason"]) == ("KILLED", SETTLED_REASON)


def test_register_refuses_a_logged_checkpoint_stamped_for_another_run(compose_cfg, tmp_path):
    import torch

    from foxhunt.ensemble.registry import register_champions
    from foxhunt.runs.store import RunStore
    from foxhunt.training.cell import run_cell
    from foxhunt.training.checkpoint import CheckpointError

    cfg = compose_cfg(["model=dqn", "trainer=smoke", "data.source.days=7", "evaluation.plot_equity=false"])
    outcome = run_cell(cfg)
    store = RunStore(cfg.logger.tracking_uri)
    logged = Path(store.get(outcome.run_id).artifact_uri.removeprefix("file://")) / "checkpoints"
    for path in logged.glob("*.ckpt"):  # as a run sharing its folder with another would have logged them
        state = torch.load(path, weights_only=True)
        state[STAMP_KEY]["run_id"] = "0" * 32
        torch.save(state, path)
    with pytest.raises(CheckpointError, match=f"stamped for run {'0' * 32}, not for run {outcome.run_id}"):
        register_champions(
            cfg.logger.tracking_uri,
            "foxhunt",
            "es",
            ["dqn"],
            "val/sharpe",
            "foxhunt",
            "champion",
            False,
            gate="none",
            example_decided=4,
        )
    assert store.get_version("foxhunt-dqn-es", 1) is None


def test_a_save_removes_what_killed_writers_left_and_writes_through_no_link(tmp_path):
    """A write killed mid-way leaves '.last.ckpt.<pid>.tmp' behind (0 bytes to the whole file):
    the next save of that file removes those of processes gone, and its own temporary is created
    afresh (a link planted at its name is replaced, never written through)."""
    import os
    import subprocess
    import sys

    import torch

    from foxhunt.training.checkpoint import atomic_save

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    stale = tmp_path / f".last.ckpt.{dead}.tmp"
    stale.write_bytes(b"half a checkpoint")
    other = tmp_path / f".best.ckpt.{dead}.tmp"  # another file's temporary: its own save removes it
    other.write_bytes(b"x")
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / f".last.ckpt.{os.getpid()}.tmp").symlink_to(victim)

    atomic_save({"state_dict": {"w": torch.ones(2)}}, tmp_path / "last.ckpt")

    assert not stale.exists() and other.exists() and victim.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([other.name, "last.ckpt", "victim"])
    assert torch.equal(torch.load(tmp_path / "last.ckpt", weights_only=True)["state_dict"]["w"], torch.ones(2))
