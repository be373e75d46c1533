"""DLinear quantile forecaster: a readable single-file reference implementation in plain PyTorch.

DLinear (Zeng et al. 2023, "Are Transformers Effective for Time Series Forecasting?", the
``DLinear`` model of its reference code) is the strong linear baseline of long-horizon
forecasting: each input series is split into a trend (its moving average) and a remainder, and
one linear map over time takes each part from the ``seq_len`` past bars to the ``horizon``
future steps. foxhunt's targets are quantiles of the next ``horizon`` one-bar returns of one
instrument read from 16 features per bar, so the model here is:

1. **inputs**: the window's bars, ``(B, seq_len, C)`` with C = static + known past + observed
   features (:func:`foxhunt.models.forecaster.bar_features`, the same rows as Mamba-2's);
2. **decomposition**: ``trend = moving_average(x)`` over time with window ``moving_average``
   (odd; the series' first and last values repeated at the edges so the trend has ``seq_len``
   bars, as the reference pads), ``remainder = x - trend``;
3. **two linear maps over time**, shared by every feature (the reference's default,
   ``individual=False``): ``remainder_map`` and ``trend_map``, each ``seq_len -> horizon``,
   initialized to the mean of the window (weights ``1 / seq_len``, as the reference); their sum
   is ``(B, C, horizon)``: each feature's contribution to each future step;
4. **quantile head** (:class:`foxhunt.models.quantiles.QuantileHead`, the forecasters' one head):
   per future step, a linear map of the C contributions to Q ordered quantiles.

Everything but the ordering of the quantiles is linear, so the model has a few thousand
parameters and its forecast is an exact function of the window: the ensemble streams it with the
generic window member (:mod:`foxhunt.ensemble.members`), and it is scored, registered and
exported like every forecaster (:class:`foxhunt.models.forecaster.ForecasterModule` holds the
loss, the steps and the positions).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor, nn

from foxhunt.config.model_schemas import MAX_LENGTH, Related, defined_by
from foxhunt.models.forecaster import ForecasterHyperparameters, ForecasterModule, bar_features
from foxhunt.models.quantiles import QuantileHead


def moving_average(x: Tensor, window: int) -> Tensor:
    """The trend of x (B, L, C) along L: the mean of ``window`` bars centred on each bar, the
    first and last bars repeated beyond the edges (``window`` odd), so the result is (B, L, C)."""
    pad = (window - 1) // 2
    padded = torch.cat([x[:, :1].expand(-1, pad, -1), x, x[:, -1:].expand(-1, pad, -1)], dim=1)
    return F.avg_pool1d(padded.transpose(1, 2), kernel_size=window, stride=1).transpose(1, 2)


class DLinearHyperparameters(ForecasterHyperparameters):
    """DLinear's ``model.module`` (conf/model/dlinear.yaml): the forecasters' shared keys (its
    dropout acts on the features' contributions before the head) and the trend's window."""

    moving_average: Annotated[int, Field(ge=1, le=MAX_LENGTH, description="bars in the trend's centred moving average (odd, <= seq_len)")]  # fmt: skip

    @model_validator(mode="after")
    def _window_centred_in_the_sequence(self) -> DLinearHyperparameters:
        if self.moving_average % 2 != 1 or self.moving_average > self.seq_len:
            raise Related("moving_average", f"must be odd and <= model.module.seq_len ({self.seq_len})")
        return self


@defined_by(DLinearHyperparameters)
class DLinearForecaster(ForecasterModule):
    """DLinear quantile forecaster of the next ``horizon`` scaled one-bar log returns (module
    doc). Its arguments are ``model.module`` of conf/model/dlinear.yaml, defined (type, range,
    doc) by :class:`DLinearHyperparameters`.
    """

    def __init__(
        self,
        *,
        input_dim: int,
        seq_len: int,
        horizon: int,
        moving_average: int,
        dropout: float,
        quantiles: Sequence[float],
        learning_rate: float,
        weight_decay: float,
        position_threshold: float,
    ) -> None:
        super().__init__(
            quantiles=quantiles,
            horizon=horizon,
            learning_rate=learning_rate,
            weight_decay=weight_decay,
            position_threshold=position_threshold,
        )
        self.save_hyperparameters()
        self.input_dim = int(input_dim)
        self.seq_len = int(seq_len)
        self.moving_average = int(moving_average)
        self.remainder_map = nn.Linear(self.seq_len, self.horizon)
        self.trend_map = nn.Linear(self.seq_len, self.horizon)
        for linear in (self.remainder_map, self.trend_map):
            nn.init.constant_(linear.weight, 1.0 / self.seq_len)  # the window's mean, as the reference
        self.dropout = nn.Dropout(dropout)
        self.head = QuantileHead(self.input_dim, self.n_quantiles, self.median_index)

    def forward(self, batch: Mapping[str, Tensor]) -> Tensor:
        x = bar_features(batch, self.seq_len, self.input_dim)  # (B, L, C)
        trend = moving_average(x, self.moving_average)
        remainder = x - trend
        steps = self.remainder_map(remainder.transpose(1, 2)) + self.trend_map(trend.transpose(1, 2))  # (B, C, H)
        return self.head(self.dropout(steps.transpose(1, 2)))  # (B, H, Q)
