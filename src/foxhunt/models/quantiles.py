"""The forecasters' ordered-quantile output head: the one place its formula is written.

Formula. Per forecast step a linear layer gives Q unconstrained values r_0 .. r_{Q-1}; with m the
median's index (``median_index``)::

    q_m = r_m                               the median is the raw value itself
    q_j = q_{j-1} + softplus(r_j)           for j > m: positive gaps cumulated upwards
    q_j = q_{j+1} - softplus(r_j)           for j < m: positive gaps cumulated downwards

so q_0 <= q_1 <= ... <= q_{Q-1} whatever the weights: ordered by construction, no crossing
quantiles (strictly increasing unless a gap underflows to 0 for very negative r_j). softplus(x) is
log(1 + e^x), and x itself above :data:`SOFTPLUS_THRESHOLD` (torch's ``F.softplus`` threshold: above
it log(1 + e^x) rounds to x in float32, and e^x overflows float32 past 88.7).

Forms, all of this one formula:

- :func:`ordered_quantiles` (torch), the reference: what every forecaster trains and forecasts with;
- :class:`QuantileHead`: the linear layer and :func:`ordered_quantiles`, (..., in_features) ->
  (..., horizon, Q) or (..., Q); used by :class:`foxhunt.models.mamba2.Mamba2Forecaster`,
  :class:`foxhunt.models.tft.TemporalFusionTransformer` and every later forecaster;
- :func:`softplus` and :func:`ordered_quantiles_row` (numba), the scalar form the numba quantile
  head (:func:`foxhunt.ensemble.kernels.quantile_head`, a layer kernel of the numba Mamba-2 step)
  calls once per forecast step, and the state step's softplus, in float32 as torch's
  float32 (it adds the gaps one at a time where torch subtracts their cumulated sums below the
  median: the same sums rounded in another order); callable from Python on numpy arrays too, as
  the parity tests do. There is no numpy form besides: no runtime needs one (the Mamba-2 member
  runs numba or torch, the TFT's ONNX graph holds the head).

The numba form lives here, beside the torch one, rather than in :mod:`foxhunt.ensemble.kernels`:
numba is a dependency of the package (not of the ensemble alone), importing it costs a fraction
of a second against the seconds torch and Lightning take, and nothing is compiled until the kernel first calls
it, so the models still import and train without the ensemble; and numba cannot call a plain
Python function from compiled code, so a numba-free row form here would need softplus written a
second time. :mod:`foxhunt.ensemble.runtimes` reads the head's weights at ``head.linear``.

Weights. The parameters are ``linear.weight`` and ``linear.bias``, the layout the TFT's head has
always had. Mamba-2 models written before this module had the linear layer as the head itself
(``head.weight``, ``head.bias``); :meth:`QuantileHead._load_from_state_dict` reads that layout too,
so their checkpoints and registered versions load and forecast as before, and
:func:`upgrade_state_dict` gives the renamed state dict for code that compares keys itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numba
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: softplus(x) is x itself above this (torch's ``F.softplus`` default threshold).
SOFTPLUS_THRESHOLD = 20.0
#: The attribute of the head's linear layer (and its state-dict keys' component).
LINEAR = "linear"


def ordered_quantiles(raw: Tensor, median_index: int) -> Tensor:
    """Ordered quantiles (..., Q) from unconstrained values raw (..., Q) (the module doc's formula)."""
    median = raw[..., median_index : median_index + 1]
    above = median + F.softplus(raw[..., median_index + 1 :], threshold=SOFTPLUS_THRESHOLD).cumsum(dim=-1)
    below = F.softplus(raw[..., :median_index], threshold=SOFTPLUS_THRESHOLD).flip(-1).cumsum(dim=-1).flip(-1)
    return torch.cat([median - below, median, above], dim=-1)


@numba.njit(cache=True, fastmath=True)
def softplus(v):  # pragma: no cover (compiled)
    """softplus of one float32 value, as torch's in float32."""
    return v if v > SOFTPLUS_THRESHOLD else np.float32(math.log1p(math.exp(v)))


@numba.njit(cache=True, fastmath=True)
def ordered_quantiles_row(raw, median_index, out):  # pragma: no cover (compiled)
    """One forecast step's ordered quantiles: raw (Q,) float32 -> out (Q,) (the module doc's formula)."""
    median = raw[median_index]
    out[median_index] = median
    level = median
    for q in range(median_index + 1, raw.shape[0]):
        level += softplus(raw[q])
        out[q] = level
    level = median
    for q in range(median_index - 1, -1, -1):
        level -= softplus(raw[q])
        out[q] = level
    return out


def _rename_legacy_keys(state_dict: dict, prefix: str) -> None:
    """Rename, in place, a head's state written when the linear layer was the head itself
    (``<prefix>weight``, ``<prefix>bias``, and an int8 weight's scale) to ``<prefix>linear.*``.
    A QuantileHead has no parameter or buffer of its own, so every key directly under its prefix
    is the old layer's; a state that already holds ``<prefix>linear.*`` keys is left as it is."""
    own = [key for key in state_dict if key.startswith(prefix)]
    if any(key.startswith(f"{prefix}{LINEAR}.") for key in own):
        return
    for key in own:
        state_dict[f"{prefix}{LINEAR}.{key[len(prefix) :]}"] = state_dict.pop(key)


class QuantileHead(nn.Module):
    """The output head: ``linear`` (in_features -> (horizon or 1) * Q) and :func:`ordered_quantiles`.

    (..., in_features) -> (..., horizon, Q) when ``horizon`` is an int, (..., Q) when it is None.
    """

    def __init__(self, in_features: int, n_quantiles: int, median_index: int, horizon: int | None = None) -> None:
        super().__init__()
        if not 0 <= median_index < n_quantiles:
            raise ValueError(f"QuantileHead: median_index must be in [0, {n_quantiles}), got {median_index}")
        if horizon is not None and horizon < 1:
            raise ValueError(f"QuantileHead: horizon must be >= 1 or None, got {horizon}")
        self.n_quantiles = int(n_quantiles)
        self.median_index = int(median_index)
        self.horizon = None if horizon is None else int(horizon)
        self.linear = nn.Linear(in_features, (self.horizon or 1) * self.n_quantiles)

    def forward(self, x: Tensor) -> Tensor:
        raw = self.linear(x)
        if self.horizon is not None:
            raw = raw.reshape(*x.shape[:-1], self.horizon, self.n_quantiles)
        return ordered_quantiles(raw, self.median_index)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        _rename_legacy_keys(state_dict, prefix)  # the legacy layout, accepted explicitly (module doc)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)


def upgrade_state_dict(model: nn.Module, state_dict: Mapping[str, object]) -> dict[str, object]:
    """A copy of ``state_dict`` with the keys of every :class:`QuantileHead` of ``model`` in the
    current layout: the keys ``model.load_state_dict`` reads, for code that compares them itself."""
    upgraded = dict(state_dict)
    for name, module in model.named_modules():
        if isinstance(module, QuantileHead):
            _rename_legacy_keys(upgraded, f"{name}." if name else "")
    return upgraded
