"""Int8 checkpoints: saved by Lightning, loaded with ``torch.load(weights_only=True)``, and a run
resumed from one takes the next steps with the losses and weights an uninterrupted run has."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from foxhunt.precision.callback import PrecisionCallback
from foxhunt.precision.quantize import SCALE_SUFFIX
from foxhunt.training.parts import build_parts

STEPS_PER_EPOCH = 2
SMALL = ["model=mamba2", "logger=none", "data.source.days=3", "model.module.d_model=64", "model.module.n_layers=1",
         "model.module.dropout=0.0", "precision=int8", "precision.compile_optimizer=false"]  # fmt: skip


class LossRecorder(pl.Callback):
    """Training losses per step."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def _fit(cfg, epochs: int, tmp_path, ckpt_path=None) -> tuple[pl.Trainer, LossRecorder, object]:
    torch.manual_seed(0)
    parts = build_parts(cfg)
    # the same batches in every process: train windows in order (the run's loader shuffles)
    windows = parts.datamodule.split_dataset("train")
    parts.datamodule.train_dataloader = lambda: DataLoader(windows, batch_size=parts.datamodule.batch_size)
    recorder = LossRecorder()
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=epochs, limit_train_batches=STEPS_PER_EPOCH, limit_val_batches=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[PrecisionCallback(report_dir=tmp_path), recorder], plugins=[parts.precision],
        default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(parts.model, datamodule=parts.datamodule, ckpt_path=ckpt_path, weights_only=True)
    return trainer, recorder, parts.model


def test_int8_checkpoint_loads_weights_only_and_resumes_exactly_as_the_uninterrupted_run(compose_cfg, tmp_path):
    cfg = compose_cfg(SMALL)
    _, uninterrupted, uninterrupted_model = _fit(cfg, epochs=2, tmp_path=tmp_path)

    trainer, first_half, model = _fit(cfg, epochs=1, tmp_path=tmp_path)
    path = tmp_path / "int8.ckpt"
    trainer.save_checkpoint(path)
    assert first_half.losses == uninterrupted.losses[:STEPS_PER_EPOCH]

    checkpoint = torch.load(path, weights_only=True)  # plain tensors: nothing to allow-list
    state = checkpoint["state_dict"]
    assert state["backbone.layers.0.mixer.out_proj.weight"].dtype == torch.int8
    assert "backbone.layers.0.mixer.out_proj.weight" + SCALE_SUFFIX in state
    states = checkpoint["optimizer_states"][0]["state"]
    formats = {v["format"] for s in states.values() for v in s.values() if isinstance(v, dict)}
    assert formats == {"fp8"}
    live = trainer.optimizers[0].state.values()  # the live optimizer keeps torchao's tensors
    assert any(type(v).__name__ == "OptimStateFp8" for s in live for v in s.values())

    _, resumed, resumed_model = _fit(compose_cfg(SMALL), epochs=2, tmp_path=tmp_path, ckpt_path=str(path))
    # the next steps, exactly: the stochastic rounding's draws are a function of what the checkpoint holds
    assert resumed.losses == uninterrupted.losses[STEPS_PER_EPOCH:]
    for (name, a), b in zip(uninterrupted_model.state_dict().items(), resumed_model.state_dict().values()):
        assert torch.equal(a, b), name
    weight = resumed_model.backbone.layers[0].mixer.out_proj.weight
    assert type(weight).__name__ == "Int8QuantizedTrainingLinearWeight"
