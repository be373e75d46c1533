"""Shared LightningModule base for the quantile forecasters (Temporal Fusion Transformer, Mamba-2).

A forecaster maps one window batch of `ForecastDataModule` (a dict of float32 tensors:
`static` (B, 4), `known` (B, seq_len + horizon, 8), `observed` (B, seq_len, 4), `target`
(B, horizon)) to quantile forecasts of the next `horizon` one-bar log returns, in target-scale
units: `forward(batch) -> Tensor[B, horizon, n_quantiles]`. Subclasses implement `forward` and
call this base's constructor with the hyperparameters it owns; everything else lives here:

- `quantile_loss`, the pinball loss averaged over quantiles, horizon steps and batch, written as
  a pure function (a dozen lines; no library we depend on ships it for plain tensors);
- training / validation / test steps logging `train/loss`, `val/loss`, `test/loss`, and
  `val/direction_accuracy` / `test/direction_accuracy` (sign of the median forecast's first step
  against the sign of the target's first step, counted over nonzero targets, accumulated over
  the whole epoch);
- AdamW with weight decay equal to the config's L2 coefficient;
- `trading_positions`, which turns forecasts into positions for the shared backtest: at every
  bar with `seq_len` bars of history, the sign of the median forecast summed over the horizon
  when its magnitude exceeds `position_threshold` (target-scale units), flat otherwise.

The hyperparameters every forecaster takes are defined once here
(:class:`ForecasterHyperparameters`); each forecaster's definition inherits them
(:mod:`foxhunt.config.model_schemas`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, cast

import numpy as np
import torch
from lightning import LightningModule
from omegaconf import DictConfig, ListConfig, OmegaConf
from pydantic import Field, field_validator
from torch import Tensor
from torchmetrics import MeanMetric

from foxhunt.config.model_schemas import MAX_LENGTH, MAX_WIDTH, Hyperparameters
from foxhunt.precision.optim import make_optimizer

#: Keys of a window batch that the forecasters read as inputs (``target`` is the label).
INPUT_KEYS = ("static", "known", "observed")
#: Quantile level whose forecast is the point forecast.
MEDIAN_LEVEL = 0.5
TRAIN_LOSS_KEY = "foxhunt_train_loss"  # a checkpoint's key of the epoch's running training loss
#: Tolerance when looking for the median among configured quantile levels.
_LEVEL_TOLERANCE = 1e-9


def forecast_signal(forecasts, median_index: int):
    """The forecasters' signal: the median forecast summed over the horizon, per window, of
    forecasts (..., horizon, Q) as a torch tensor or a numpy array (the batch path's, a streaming
    member's, a replay's: this one expression)."""
    return forecasts[..., median_index].sum(-1)


def signal_position(signal: float, threshold: float) -> int:
    """The forecasters' trading rule, the one place it is written: long (1) or short (-1) by the
    signal's sign when its magnitude exceeds ``threshold`` (``position_threshold``, target-scale
    units), else flat (0). The batch path, every streaming member and the ensemble's
    ``mean_forecast`` rule decide by it."""
    if abs(signal) > threshold:
        return 1 if signal > 0 else -1
    return 0


class ForecasterHyperparameters(Hyperparameters):
    """What every forecaster takes (``model.module.*`` of conf/model/<forecaster>.yaml)."""

    input_dim: Annotated[int, Field(ge=1, le=MAX_WIDTH, description="features per bar: static (broadcast over time) + known past + observed")]  # fmt: skip
    seq_len: Annotated[int, Field(ge=1, le=MAX_LENGTH, description="past bars in a window (model.window.seq_len)")]
    horizon: Annotated[int, Field(ge=1, le=MAX_LENGTH, description="future one-bar returns forecast (model.window.horizon)")]
    dropout: Annotated[float, Field(ge=0, lt=1, description="dropout probability")]
    quantiles: Annotated[list[Annotated[float, Field(gt=0, lt=1)]],
                         Field(min_length=1, strict=False, description="forecast quantile levels, increasing, holding the median 0.5")]  # fmt: skip
    learning_rate: Annotated[float, Field(gt=0, le=10, description="AdamW learning rate")]
    weight_decay: Annotated[float, Field(ge=0, le=10, description="AdamW weight decay (the L2 coefficient)")]
    position_threshold: Annotated[float, Field(ge=0, le=1e6, description="|median forecast summed over the horizon| (target-scale units) above which a position is taken")]  # fmt: skip

    @field_validator("quantiles")
    @classmethod
    def _ordered_around_the_median(cls, levels: list[float]) -> list[float]:
        if any(not low < high for low, high in zip(levels, levels[1:])):
            raise ValueError("must be strictly increasing")
        if not any(abs(q - MEDIAN_LEVEL) <= _LEVEL_TOLERANCE for q in levels):
            raise ValueError("must include the median 0.5 (positions follow the median forecast)")
        return levels


def bar_features(batch: Mapping[str, Tensor], seq_len: int, input_dim: int) -> Tensor:
    """The window's bars as rows of every input (B, seq_len, input_dim): the static features
    broadcast over time, the known calendar of the past bars (the next ``horizon`` minutes'
    calendar is left out) and the observed features, in that order (the dataset's column order,
    which the streaming members' input rows also follow)."""
    observed, known = batch["observed"], batch["known"]
    if observed.shape[1] != seq_len or known.shape[1] < seq_len:
        raise ValueError(
            f"window batch: observed has {observed.shape[1]} bars and known {known.shape[1]}, "
            f"model.module.seq_len is {seq_len} (known needs at least that)"
        )
    static = batch["static"].unsqueeze(1).expand(-1, seq_len, -1)
    features = torch.cat([static, known[:, :seq_len], observed], dim=-1)
    if features.shape[-1] != input_dim:
        raise ValueError(
            f"window batch: {features.shape[-1]} features per bar (static+known+observed), model.module.input_dim is {input_dim}"
        )
    return features


def quantile_loss(pred: Tensor, target: Tensor, quantiles: Tensor | Sequence[float]) -> Tensor:
    """Pinball loss averaged over quantiles, horizon steps and batch.

    pred: (B, H, Q) quantile forecasts; target: (B, H); quantiles: the Q levels.
    For error e = target - pred at level q the loss is max(q * e, (q - 1) * e).
    """
    if pred.dim() != 3 or target.shape != pred.shape[:2]:
        raise ValueError(
            f"quantile_loss: pred must be (B, H, Q) and target (B, H), got {tuple(pred.shape)} and {tuple(target.shape)}"
        )
    levels = torch.as_tensor(quantiles, dtype=pred.dtype, device=pred.device)
    if levels.shape != (pred.shape[-1],):
        raise ValueError(f"quantile_loss: {pred.shape[-1]} forecast quantiles but {levels.numel()} levels")
    error = target.unsqueeze(-1) - pred
    return torch.maximum(levels * error, (levels - 1.0) * error).mean()


def _plain(value: Any) -> Any:
    """OmegaConf containers -> plain lists/dicts; anything else unchanged."""
    if isinstance(value, (ListConfig, DictConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


class ForecasterModule(LightningModule):
    """Base for quantile forecasters; subclasses implement `forward(batch) -> (B, horizon, Q)`.

    Constructor arguments: the forecaster's validated hyperparameters that this base uses
    (:class:`ForecasterHyperparameters`: each forecaster's class is
    :func:`~foxhunt.config.model_schemas.defined_by` its own definition, which inherits it).
    Subclasses call ``self.save_hyperparameters()`` after ``super().__init__``.
    """

    monitor_metric: str = "val/loss"
    monitor_mode: str = "min"
    hyperparameters: ClassVar[type[ForecasterHyperparameters]]
    quantile_levels: Tensor  # the quantiles as a buffer (registered in __init__: it follows the module's device)

    def __init__(
        self,
        *,
        quantiles: Sequence[float],
        horizon: int,
        learning_rate: float,
        weight_decay: float,
        position_threshold: float,
    ) -> None:
        super().__init__()
        self.quantiles = [float(q) for q in quantiles]
        self.horizon = int(horizon)
        self.learning_rate = float(learning_rate)
        self.weight_decay = float(weight_decay)
        self.position_threshold = float(position_threshold)
        self.median_index = next(i for i, q in enumerate(self.quantiles) if abs(q - MEDIAN_LEVEL) <= _LEVEL_TOLERANCE)
        self.register_buffer("quantile_levels", torch.tensor(self.quantiles, dtype=torch.float32), persistent=False)
        self.val_direction_accuracy = MeanMetric()
        self.test_direction_accuracy = MeanMetric()
        # The epoch's mean training loss: its running state is in every checkpoint, so an epoch
        # resumed in its middle reports the mean over all its batches (Lightning's own epoch
        # aggregation is not checkpointed).
        self.train_loss = MeanMetric()
        self._resumed_train_loss: dict[str, Tensor] | None = None

    @property
    def n_quantiles(self) -> int:
        """Number of forecast quantiles (size of the output's last axis)."""
        return len(self.quantiles)

    # ----------------------------------------------------------------------------- steps
    def _loss(self, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        pred = self(batch)
        target = batch["target"]
        expected = (target.shape[0], self.horizon, self.n_quantiles)
        if tuple(pred.shape) != expected:
            raise ValueError(f"{type(self).__name__}.forward returned {tuple(pred.shape)}, expected {expected}")
        # the loss is computed in float32 even when the forward pass ran under bf16 autocast
        pred = pred.float()
        loss = quantile_loss(pred, target.float(), self.quantile_levels)
        return loss, pred

    def _update_direction(self, metric: MeanMetric, pred: Tensor, target: Tensor) -> None:
        first_target = target[:, 0]
        nonzero = first_target != 0
        if bool(nonzero.any()):
            median_first = pred[:, 0, self.median_index]
            hits = (torch.sign(median_first) == torch.sign(first_target))[nonzero]
            metric.update(hits.float())

    def training_step(self, batch: Mapping[str, Tensor], batch_idx: int) -> Tensor:
        loss, _ = self._loss(batch)
        size = len(batch["target"])
        self.train_loss.update(loss.detach(), weight=size)
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=size)
        self.log("train/loss_epoch", self.train_loss, on_step=False, on_epoch=True)
        return loss

    def on_train_start(self) -> None:
        """A fit resumed in the middle of an epoch: the epoch's running loss put back (a fit
        resumed at an epoch's end starts the next epoch afresh)."""
        saved, self._resumed_train_loss = self._resumed_train_loss, None
        # Lightning types the counters as _ReadyCompletedTracker; a _BatchProgress holds _ProcessedTrackers
        done = int(self.trainer.fit_loop.epoch_loop.batch_progress.current.processed)  # type: ignore[attr-defined]
        if saved is None or not 0 < done < self.trainer.num_training_batches:
            return
        for name, value in saved.items():
            setattr(self.train_loss, name, value.to(self.device))
        self.train_loss._update_count = 1  # it has a value: the epoch's batches before the checkpoint

    def validation_step(self, batch: Mapping[str, Tensor], batch_idx: int) -> Tensor:
        loss, pred = self._loss(batch)
        self._update_direction(self.val_direction_accuracy, pred, batch["target"])
        self.log("val/loss", loss, on_epoch=True, prog_bar=True, batch_size=len(batch["target"]))
        self.log("val/direction_accuracy", self.val_direction_accuracy, on_epoch=True)
        return loss

    def test_step(self, batch: Mapping[str, Tensor], batch_idx: int) -> Tensor:
        loss, pred = self._loss(batch)
        self._update_direction(self.test_direction_accuracy, pred, batch["target"])
        self.log("test/loss", loss, on_epoch=True, batch_size=len(batch["target"]))
        self.log("test/direction_accuracy", self.test_direction_accuracy, on_epoch=True)
        return loss

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Store hyperparameters as plain Python containers (Hydra passes OmegaConf lists), so the
        checkpoint loads with ``torch.load(weights_only=True)``, and the epoch's running training
        loss (:attr:`train_loss`)."""
        hparams = checkpoint.get("hyper_parameters")
        if hparams:
            checkpoint["hyper_parameters"] = {key: _plain(value) for key, value in hparams.items()}
        states = self.train_loss.metric_state.items()  # a MeanMetric's states are tensors (a list is a cat metric's)
        checkpoint[TRAIN_LOSS_KEY] = {name: cast(Tensor, value).detach().cpu().clone() for name, value in states}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._resumed_train_loss = checkpoint.get(TRAIN_LOSS_KEY)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self.parameters(), "adamw", lr=self.learning_rate, weight_decay=self.weight_decay)

    # ------------------------------------------------------------------------- positions
    @torch.no_grad()
    def predict_windows(self, windows: Mapping[str, Any], batch_size: int) -> Tensor:
        """Quantile forecasts (N, horizon, Q) on CPU for every window of `windows`, in order."""
        n = len(windows["bar_index"])
        outputs: list[Tensor] = []
        was_training = self.training
        self.eval()
        try:
            for start in range(0, n, batch_size):
                chunk = {key: torch.as_tensor(windows[key][start : start + batch_size]).to(self.device) for key in INPUT_KEYS}
                outputs.append(self(chunk).float().cpu())
        finally:
            self.train(was_training)
        if not outputs:
            return torch.zeros(0, self.horizon, self.n_quantiles)
        return torch.cat(outputs)

    def interpret_split(self, datamodule: Any, split: str, max_windows: int | None) -> Any:
        """What the model's inputs weighed on ``split`` (:class:`foxhunt.evaluation.interpret.Interpretation`),
        for a forecaster that can say (the TFT overrides this); ``None`` here: nothing to log."""
        return None

    def positions_from_forecasts(self, forecasts: Tensor) -> np.ndarray:
        """Positions in {-1, 0, 1} from forecasts (N, horizon, Q): sign of the summed median when
        its magnitude exceeds `position_threshold`, else 0."""
        signals = forecast_signal(forecasts, self.median_index).tolist()
        return np.array([signal_position(s, self.position_threshold) for s in signals], dtype=np.int8)

    def trading_positions(self, datamodule: Any, split: str) -> np.ndarray:
        """Positions (T,) in {-1, 0, 1} aligned with `datamodule.dataset.splits[split].close`.

        Every bar with ``seq_len`` bars of history decides its position from the window of
        inputs ending there (`datamodule.input_windows`: the past bars and the calendar of the
        next ``horizon`` minutes, nothing of the future bars), the last ``horizon`` bars
        included; the first seq_len - 1 bars of the split stay 0.
        """
        n_bars = len(datamodule.dataset.splits[split].close)
        windows = datamodule.input_windows(split)
        bar_index = np.asarray(torch.as_tensor(windows["bar_index"]).cpu().numpy(), dtype=np.int64)
        positions = np.zeros(n_bars, dtype=np.int8)
        if bar_index.size == 0:
            return positions
        if bar_index.min() < 0 or bar_index.max() >= n_bars:
            raise ValueError(
                f"datamodule.input_windows({split!r}) bar_index spans [{bar_index.min()}, {bar_index.max()}] "
                f"outside the split's {n_bars} bars"
            )
        forecasts = self.predict_windows(windows, int(getattr(datamodule, "eval_batch_size", datamodule.batch_size)))
        positions[bar_index] = self.positions_from_forecasts(forecasts)
        return positions
