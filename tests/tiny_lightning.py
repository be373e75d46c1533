"""A LightningModule for tests of callbacks and the fit loop: a linear regression on four
features, trained with SGD (no data module, no foxhunt model)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch


class Regressor(pl.LightningModule):
    def __init__(self, lr: float = 0.01) -> None:
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)
