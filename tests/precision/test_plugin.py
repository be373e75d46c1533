"""The Trainer's precision plugin carries the run's policy: Lightning's plugin of the policy's
precision, converting the module and the optimizer the model built."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.plugins.precision import HalfPrecision, MixedPrecision, Precision
from torch.utils.data import DataLoader, TensorDataset

from foxhunt.precision.callback import PrecisionCallback
from foxhunt.precision.plugin import policy_of, precision_plugin
from foxhunt.precision.policy import PrecisionPolicy
from foxhunt.precision.quantize import is_int8_weight

INT8 = PrecisionPolicy(name="int8", trainer_precision="32-true", weights="int8", optimizer_states="fp8",
                       optimizer_block_size=256, compile_optimizer=False, quantize_types=("Linear",),
                       min_quantized_numel=4096)  # fmt: skip


class TinyRegressor(pl.LightningModule):
    """A plain model: torch's AdamW and, optionally, a step LR scheduler."""

    def __init__(self, scheduled: bool = False) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
        self.scheduled = scheduled

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.0)
        if not self.scheduled:
            return optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _fit(model, plugin, callbacks=(), steps: int = 3) -> pl.Trainer:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=generator)
    loader = DataLoader(TensorDataset(x, x[:, :1] * 2.0), batch_size=16)
    trainer = pl.Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, plugins=[plugin],
                         callbacks=list(callbacks))  # fmt: skip
    trainer.fit(model, loader)
    return trainer


@pytest.mark.parametrize(
    ("precision", "base"),
    [("32-true", Precision), ("bf16-mixed", MixedPrecision), ("16-mixed", MixedPrecision), ("bf16-true", HalfPrecision)],
)
def test_each_precision_is_lightnings_own_plugin_holding_the_policy(precision, base):
    policy = PrecisionPolicy(name="p", trainer_precision=precision)
    plugin = precision_plugin(policy, "cpu")
    assert isinstance(plugin, base) and plugin.precision == precision and plugin.policy is policy


def test_int8_quantizes_the_weights_and_trains_with_torchaos_8bit_states_without_the_callback():
    from torchao.optim import AdamWFp8

    model = TinyRegressor()
    before = model.net[0].weight.detach().clone()
    trainer = _fit(model, precision_plugin(INT8, "cpu"))
    assert policy_of(trainer) is INT8
    assert is_int8_weight(model.net[0].weight) and not is_int8_weight(model.net[2].weight)  # 512 < 4096 elements
    (optimizer,) = trainer.optimizers
    assert isinstance(optimizer, AdamWFp8) and optimizer.param_groups[0]["lr"] == 1e-2
    assert not torch.equal(model.net[0].weight.dequantize(), before)  # it trained
    assert [p for group in optimizer.param_groups for p in group["params"]] == list(model.parameters())


def test_a_scheduler_steps_the_optimizer_that_trains():
    model = TinyRegressor(scheduled=True)
    trainer = _fit(model, precision_plugin(INT8, "cpu"), steps=2)
    (config,) = trainer.lr_scheduler_configs
    (optimizer,) = trainer.optimizers
    assert config.scheduler.optimizer is optimizer
    assert float(optimizer.param_groups[0]["lr"]) == pytest.approx(1e-2 * 0.5**2)  # StepLR stepped it twice


def test_fp32_leaves_the_models_optimizer_as_built():
    model = TinyRegressor()
    trainer = _fit(model, precision_plugin(PrecisionPolicy(name="fp32", trainer_precision="32-true"), "cpu"))
    assert type(trainer.optimizers[0]) is torch.optim.AdamW


def test_the_precision_callback_refuses_a_trainer_without_the_plugin():
    trainer = pl.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[PrecisionCallback()])  # fmt: skip
    with pytest.raises(TypeError, match=r"precision plugin is Lightning's Precision: build it with plugins=\["):
        trainer.fit(TinyRegressor(), DataLoader(TensorDataset(torch.randn(4, 8), torch.randn(4, 1))))
