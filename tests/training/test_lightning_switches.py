"""Lightning's and Hydra's own switches as their users type them: ``trainer.enable_progress_bar=false``
trains (Lightning refused it: the config's bar was in the callbacks), a log file gets plain
progress lines instead of carriage returns, a device the machine lacks and a sweeping preset
without ``-m`` are one line each, before any run is made."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import TQDMProgressBar

from foxhunt.errors import EXIT_USER_ERROR, ConfigError
from foxhunt.training.cell import train
from foxhunt.training.fit import build_callbacks
from foxhunt.training.progress import LineProgress
from train_entry import run_foxhunt_train

QUICK = ["trainer=smoke", "data.source.days=3", "logger=none", "evaluation.plot_equity=false"]


def _bars(callbacks) -> list[type]:
    return [type(c) for c in callbacks if isinstance(c, (TQDMProgressBar, LineProgress))]


def test_the_bar_is_a_terminals_plain_lines_elsewhere_and_none_when_switched_off(compose_cfg):
    assert _bars(build_callbacks(compose_cfg(QUICK), terminal=True)) == [TQDMProgressBar]
    assert _bars(build_callbacks(compose_cfg(QUICK), terminal=False)) == [LineProgress]
    assert _bars(build_callbacks(compose_cfg([*QUICK, "+trainer.enable_progress_bar=false"]), terminal=True)) == []


def test_enable_progress_bar_false_trains_and_a_log_gets_no_carriage_return(compose_cfg, capsys):
    """Seen failing before: MisconfigurationException 'Trainer was configured with
    enable_progress_bar=False but found TQDMProgressBar in callbacks list', a 70-line traceback."""
    metrics = train(compose_cfg([*QUICK, "+trainer.enable_progress_bar=false"]))
    assert "val/sharpe" in metrics
    train(compose_cfg(QUICK))  # captured output is not a terminal: plain lines
    out = capsys.readouterr().out
    assert "\r" not in out and "epoch 0: batch " in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a CUDA device")
def test_a_gpu_accelerator_without_cuda_is_one_line_before_any_run(compose_cfg, tmp_path):
    cfg = compose_cfg([*QUICK[:2], "trainer.accelerator=gpu", f"logger.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    with pytest.raises(ConfigError, match=r"^trainer.accelerator=gpu: this machine has no CUDA device"):
        train(cfg)
    assert not (tmp_path / "mlflow.db").exists()  # no run was made


@pytest.mark.parametrize("devices", ["trainer.devices=2", "trainer.devices=[0,1]", "trainer.devices='0,1'",
                                     "trainer.devices=-1", "+trainer.num_nodes=2"])  # fmt: skip
def test_several_devices_for_one_run_are_one_line_before_any_run(compose_cfg, tmp_path, devices):
    """trainer.devices=2 on a CPU ran Lightning's DDP: the whole cell twice, two FINISHED MLflow
    runs of one cell, the test table printed twice (found probing the CLI). One run is one
    process on one device; -1 asks for every core of a CPU, which is several here."""
    cfg = compose_cfg([*QUICK[:2], devices, f"logger.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    if devices == "trainer.devices=-1" and (torch.cuda.device_count() or __import__("os").cpu_count() or 1) < 2:
        pytest.skip("one device on this machine: -1 names one")
    with pytest.raises(ConfigError, match=r"^trainer\.(devices|num_nodes)=.*: foxhunt trains a run in one process on one device"):
        train(cfg)
    assert not (tmp_path / "mlflow.db").exists()  # no run was made


@pytest.mark.parametrize(
    ("preset", "line"),
    [("preset=grid", "preset=grid sweeps model, asset: run it with -m (foxhunt-train -m preset=grid)"),
     ("hparams_search=dqn_optuna", "hparams_search=dqn_optuna sweeps model.module.lr, ")],
)  # fmt: skip
def test_a_sweeping_preset_without_multirun_is_one_line(tmp_path, monkeypatch, capsys, preset, line):
    """Seen failing before: ``foxhunt-train preset=grid`` trained one default DQN cell."""
    code = run_foxhunt_train(monkeypatch, tmp_path, [preset, *QUICK])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == EXIT_USER_ERROR and len(err) == 1
    assert err[0].startswith("foxhunt-train: config error: ") and line in err[0]
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize(
    ("overrides", "line"),
    [(["+trainer.precision=bf16-mixed"], "trainer.precision='bf16-mixed': foxhunt sets this Trainer argument itself: choose the "
                                         "precision group"),
     (["+trainer.max_step=3"], "trainer.max_step: not a parameter of Trainer (allowed: "),  # said "no range is known"
     (["model=dqn", "trainer.gradient_clip_val=0.5"], "Lightning refuses the trainer and callback settings for model=dqn: "
                                                      "Automatic gradient clipping is not supported for manual optimization"),
     (["model=dlinear", "+trainer.val_check_interval=100"], "for model=dlinear: `val_check_interval` (100) must be less than"),
     (["model=dlinear", "+callbacks.early_stopping._target_=lightning.pytorch.callbacks.EarlyStopping",
       "+callbacks.early_stopping.monitor=val/los"], "for model=dlinear: Early stopping conditioned on metric `val/los`")],
)  # fmt: skip
def test_a_trainer_switch_lightning_refuses_is_one_line(tmp_path, monkeypatch, capsys, overrides, line):
    """Each was a traceback of 60-80 lines (found by a helper probing Lightning's switches): one
    line naming the setting and what Lightning said, exit 2."""
    code = run_foxhunt_train(monkeypatch, tmp_path, [*QUICK, *overrides])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == EXIT_USER_ERROR and "Traceback" not in "\n".join(err), err[-5:]
    assert err[-1].startswith("foxhunt-train: config error: ") and line in err[-1], err[-1]


def test_a_fast_dev_run_checkpoint_starts_a_later_run(compose_cfg, tmp_path):
    """Lightning's DummyLogger (fast_dev_run) answers run_id with a method, which was stamped on
    the checkpoint: every ckpt= of it was refused ("stamped for run <function DummyLogger...>")."""
    from pathlib import Path

    cfg = compose_cfg(["model=dlinear", "trainer=smoke", "data.source.days=3", "evaluation.plot_equity=false",
                       "+trainer.fast_dev_run=true"])  # fmt: skip
    train(cfg)
    (last,) = Path(cfg.paths.output_dir).rglob("last.ckpt")
    again = compose_cfg(["model=dlinear", "trainer=smoke", "data.source.days=3", "evaluation.plot_equity=false", f"ckpt={last}"])
    assert "val/sharpe" in train(again)
