"""The best checkpoint and its score survive a resume into another folder (issue 40).

Lightning's ``ModelCheckpoint`` reloads its best score only when the resumed Trainer writes to
the folder the checkpoint was written in; elsewhere it warns and starts the best from nothing, so
the second half's first validation became "the best" whatever the first half reached. The
``checkpoint_stamp`` callback carries the best file into the new folder first (when it is this
run's, by its stamp), so the best over both halves wins.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from foxhunt.training.checkpoint import RUN_ID, CheckpointStamp, read_stamp
from tiny_lightning import Regressor

SCORES = (1.0, 0.5, 0.9, 0.8)  # val/loss by epoch: the best (0.5) in the first half, the second half's best worse


class Scripted(Regressor):
    """val/loss is SCORES[epoch]; the weights move every step (each epoch's best file differs)."""

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", SCORES[self.current_epoch])


def _loader():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def _fit(folder: Path, epochs: int, ckpt_path: Path | None = None, run_id: str | None = None) -> ModelCheckpoint:
    best = ModelCheckpoint(dirpath=folder, filename="best", monitor="val/loss", mode="min", save_top_k=1, save_last=True,
                           auto_insert_metric_name=False)  # fmt: skip
    stamp = CheckpointStamp(model="tiny", module="tests.Scripted", precision="fp32")
    if run_id is not None:
        stamp.stamp[RUN_ID] = run_id
    trainer = pl.Trainer(max_epochs=epochs, callbacks=[best, stamp], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu", deterministic=True)  # fmt: skip
    pl.seed_everything(0, verbose=False)
    trainer.fit(Scripted(), train_dataloaders=_loader(), val_dataloaders=_loader(), ckpt_path=ckpt_path)
    return best


def _epoch_of(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=True)["epoch"])


def test_a_resume_into_a_new_folder_keeps_the_best_of_both_halves(tmp_path):
    first = _fit(tmp_path / "first", 2)
    assert float(first.best_model_score) == 0.5
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*dirpath has changed")  # Lightning's "... won't be reloaded"
        resumed = _fit(tmp_path / "second", 4, tmp_path / "first" / "last.ckpt")
    assert float(resumed.best_model_score) == 0.5  # not 0.8, the second half's best
    assert Path(resumed.best_model_path) == tmp_path / "second" / "best.ckpt"
    assert _epoch_of(tmp_path / "second" / "best.ckpt") == 1  # the first half's best weights, in the new folder
    assert _epoch_of(tmp_path / "first" / "best.ckpt") == 1  # the old folder untouched


def test_the_best_file_beside_a_downloaded_checkpoint_is_carried_when_its_folder_is_gone(tmp_path):
    """Resumed on another machine: the old folder is not here; the run's logged best.ckpt was
    downloaded beside its last.ckpt (runs.resume.plan_resume)."""
    _fit(tmp_path / "first", 2, run_id="r1")
    downloaded = tmp_path / "download" / "checkpoints"
    shutil.copytree(tmp_path / "first", downloaded)
    shutil.rmtree(tmp_path / "first")
    resumed = _fit(tmp_path / "second", 4, downloaded / "last.ckpt", run_id="r1")
    assert float(resumed.best_model_score) == 0.5
    assert _epoch_of(tmp_path / "second" / "best.ckpt") == 1
    assert read_stamp(tmp_path / "second" / "best.ckpt")[RUN_ID] == "r1"


def test_a_best_file_stamped_for_another_run_is_not_carried(tmp_path):
    """Trust by content: a best.ckpt that is not this run's (copied there) does not become its best."""
    _fit(tmp_path / "first", 2, run_id="r1")
    _fit(tmp_path / "other", 2, run_id="r2")
    (tmp_path / "first" / "best.ckpt").write_bytes((tmp_path / "other" / "best.ckpt").read_bytes())
    with pytest.warns(UserWarning, match="won't be reloaded"):  # Lightning's own behaviour: the score not reloaded
        resumed = _fit(tmp_path / "second", 4, tmp_path / "first" / "last.ckpt", run_id="r1")
    assert float(resumed.best_model_score) == pytest.approx(0.8)  # the second half's own best
    assert read_stamp(tmp_path / "second" / "best.ckpt")[RUN_ID] == "r1"
