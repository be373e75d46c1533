"""Temporal Fusion Transformer (Lim, Arik, Loeff & Pfister 2021), a single-file reference build.

Written by hand rather than taken from pytorch-forecasting: that implementation is tied to its
own TimeSeriesDataSet, embeddings and encoders, while foxhunt feeds plain tensors (the window
batch of `ForecastDataModule`), and one readable file that follows the paper's equations is what
the memory accounting and precision policies are meant to be run on.

Inputs (dict of float32 tensors, as produced by ForecastDataModule):
    static   (B, static_dim)                    asset attributes, constant over time
    known    (B, seq_len + horizon, known_dim)  calendar features, past and future
    observed (B, seq_len, observed_dim)         market features, past only (the future of an
                                                observed input does not exist in the batch, so
                                                the model cannot read it by construction)
Output: (B, horizon, n_quantiles) quantile forecasts of the next `horizon` one-bar returns.

Architecture, section numbers of the paper in brackets:
    per-variable linear embeddings of every continuous input             [4.1]
    gated linear unit (GLU) + add & norm; gated residual network (GRN)   [4.1, eq. 2-5]
    variable selection networks: static; encoder over known + observed;
        decoder over known; softmax weights summing to 1                 [4.2, eq. 6-8]
    static covariate encoders: four contexts c_s (selection), c_e
        (enrichment), c_h and c_c (LSTM initial state)                   [4.3]
    LSTM encoder/decoder (`lstm_layers` layers) + gated skip             [4.5.1, eq. 17]
    static enrichment GRN with context c_e                               [4.5.2, eq. 18]
    interpretable multi-head attention: per-head query/key projections,
        one value projection shared by all heads, head outputs averaged,
        causal mask (position t attends to positions <= t only)          [4.4, eq. 13-16; 4.5.3]
    position-wise GRN + gated skip over the whole temporal block          [4.5.4, eq. 20-22]
    quantile output layer on the decoder positions                       [4.6, eq. 23]

Quantile ordering is guaranteed by construction (a departure from the paper, which leaves the
outputs free): the head (`foxhunt.models.quantiles.QuantileHead`, per decoder position) predicts the
median and, for the levels on either side of it, positive gaps (softplus) that are cumulated
outwards, so q_1 <= ... <= q_0.5 <= ... <= q_Q always holds.

Causality: every layer is position-wise except the LSTMs (left to right) and the attention
(causal mask), so the forecast for decoder step t depends on inputs at times <= t only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, NamedTuple, cast

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from foxhunt.config.model_schemas import MAX_LAYERS, MAX_WIDTH, Related, defined_by
from foxhunt.evaluation.interpret import Interpretation, InterpretationSums, SelectionNames, spaced_indices
from foxhunt.models.forecaster import INPUT_KEYS, ForecasterHyperparameters, ForecasterModule
from foxhunt.models.quantiles import QuantileHead

# Lazy imports: (c) precision.quantize (torchao, about 0.25 s), for an int8 weight only: fp32 runs start without it


def _dropout(module: nn.Dropout, x: Tensor) -> Tensor:
    """``module(x)``, keeping its mask as booleans for the backward pass: on a CPU, torch's dropout
    keeps a float mask (4 bytes an element), its ``native_dropout`` the same draws as one byte (the
    same output for the same generator state)."""
    if not module.training or module.p == 0:
        return x
    return torch.native_dropout(x, module.p, True)[0]


class GatedLinearUnit(nn.Module):
    """GLU(x) = sigmoid(W4 x + b4) * (W5 x + b5), with dropout on the input [eq. 5]."""

    def __init__(self, input_size: int, output_size: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.linear = nn.Linear(input_size, 2 * output_size)

    def forward(self, x: Tensor) -> Tensor:
        # F.glu: the first half times the sigmoid of the second, in one op that keeps only its
        # input for the backward pass (chunk, sigmoid and product kept the sigmoid's output too)
        return F.glu(self.linear(_dropout(self.dropout, x)), dim=-1)


class GateAddNorm(nn.Module):
    """LayerNorm(skip + GLU(x)): the gated skip connection used throughout the TFT."""

    def __init__(self, input_size: int, output_size: int, dropout: float) -> None:
        super().__init__()
        self.glu = GatedLinearUnit(input_size, output_size, dropout)
        self.norm = nn.LayerNorm(output_size)

    def forward(self, x: Tensor, skip: Tensor) -> Tensor:
        return self.norm(skip + self.glu(x))


class GatedResidualNetwork(nn.Module):
    """GRN(a, c) = LayerNorm(skip(a) + GLU(W1 ELU(W2 a + W3 c + b2) + b1)) [eq. 2-4].

    `skip` is the identity when input and output sizes match, else a linear projection. The
    optional context `c` (B, context_size) is broadcast over any time axis of `a`.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        output_size: int,
        dropout: float,
        context_size: int | None = None,
    ) -> None:
        super().__init__()
        self.skip = nn.Identity() if input_size == output_size else nn.Linear(input_size, output_size)
        self.fc_input = nn.Linear(input_size, hidden_size)  # W2, b2
        self.fc_context = nn.Linear(context_size, hidden_size, bias=False) if context_size else None  # W3
        self.fc_hidden = nn.Linear(hidden_size, hidden_size)  # W1, b1
        self.gate_norm = GateAddNorm(hidden_size, output_size, dropout)

    def forward(self, a: Tensor, context: Tensor | None = None) -> Tensor:
        return self.finish(self.fc_input(a), self.skip(a), context)

    def finish(self, hidden: Tensor, skip: Tensor, context: Tensor | None = None) -> Tensor:
        """The GRN after its input layer: ``hidden = W2 a + b2`` and ``skip = skip(a)`` given
        (a caller that knows ``a`` is affine in fewer numbers computes them more cheaply).
        ``hidden`` is consumed: a tensor made for this call, which the ELU overwrites unless it is a view."""
        if self.fc_context is not None:
            if context is None:
                raise ValueError("GatedResidualNetwork built with a context was called without one")
            projected = self.fc_context(context)
            while projected.dim() < hidden.dim():
                projected = projected.unsqueeze(-2)
            hidden = hidden + projected
        # in place: the ELU's backward reads its output, which the next layer keeps anyway, so one
        # tensor is kept instead of two (``hidden`` is the caller's fresh W2 a + b2, consumed here);
        # not on a view (a layer's output reshaped), which autograd may refuse to have overwritten
        # (an int8 layer's custom function)
        hidden = self.fc_hidden(F.elu(hidden, inplace=not hidden._is_view()))
        return self.gate_norm(hidden, skip)


def _embedding_weights(embeddings: Sequence[VariableEmbedding]) -> tuple[Tensor, Tensor]:
    """The weight and bias of embeddings side by side (their variables in order)."""
    if len(embeddings) == 1:
        return embeddings[0].weight, embeddings[0].bias
    return torch.cat([e.weight for e in embeddings]), torch.cat([e.bias for e in embeddings])


def _matrix(weight: Tensor) -> Tensor:
    """A layer's weight as a plain float matrix to fold: itself, or an int8 training weight
    (:mod:`foxhunt.precision.quantize`) dequantized, its gradient passed straight through."""
    if type(weight) in (torch.Tensor, nn.Parameter):
        return weight
    from foxhunt.precision.quantize import dequantized  # torchao: see the Lazy imports line

    return dequantized(weight)


def _foldable(layer: nn.Module) -> bool:
    """Whether ``layer``'s weight folds: a plain float one, or an int8 training weight (its
    ``int_data`` codes and row ``scale``); another tensor subclass (a quantized inference copy's
    weight) does not, and its selection runs unfolded."""
    weight = getattr(layer, "weight", None)
    if weight is None or type(weight) in (torch.Tensor, nn.Parameter):
        return True
    return hasattr(weight, "int_data") and hasattr(weight, "scale")


def _storage_key(p: Tensor) -> tuple:
    """What changes when a parameter's values are replaced: the storage and version counter of a
    plain tensor, or of the inner tensors of a tensor subclass (an int8 weight's codes and row
    scales: its wrapper's own never change)."""
    if type(p) in (torch.Tensor, nn.Parameter):
        return (p.data_ptr(), p._version, p.dtype)
    names, _ = p.__tensor_flatten__()  # type: ignore[attr-defined]  # torch's protocol of wrapper subclasses
    return tuple((t.data_ptr(), t._version, t.dtype) for t in (getattr(p, name) for name in names))


class VariableEmbedding(nn.Module):
    """One linear map R -> R^hidden per continuous variable: (..., n_vars) -> (..., n_vars, hidden)."""

    def __init__(self, n_vars: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_vars, hidden_size))
        self.bias = nn.Parameter(torch.zeros(n_vars, hidden_size))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        return x.unsqueeze(-1) * self.weight + self.bias


class VariableSelectionNetwork(nn.Module):
    """Soft selection over `n_vars` embedded variables [eq. 6-8].

    weights = softmax(GRN_v(flatten(xi), c_s)) (sum to 1 over the variables);
    output  = sum_i weights_i * GRN_i(xi_i).
    """

    def __init__(
        self,
        n_vars: int,
        hidden_size: int,
        dropout: float,
        context_size: int | None,
        activation_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        self.activation_checkpointing = activation_checkpointing
        self.weight_grn = GatedResidualNetwork(n_vars * hidden_size, hidden_size, n_vars, dropout, context_size)
        self.variable_grns = nn.ModuleList(
            GatedResidualNetwork(hidden_size, hidden_size, hidden_size, dropout) for _ in range(n_vars)
        )

    @property
    def grns(self) -> list[GatedResidualNetwork]:
        """The variable GRNs as the GRNs they are (``nn.ModuleList`` types its items as any Module)."""
        return [cast(GatedResidualNetwork, grn) for grn in self.variable_grns]

    def forward(self, embedded: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """embedded: (..., n_vars, hidden) -> (selected (..., hidden), weights (..., n_vars))."""
        weights = torch.softmax(self.weight_grn(embedded.flatten(-2), context), dim=-1)
        return self._run_variable_grns(self._select_embedded, embedded, weights), weights

    def _run_variable_grns(self, segment: Callable[..., Tensor], *inputs: Tensor) -> Tensor:
        """``segment(*inputs)``, under activation checkpointing when it is on and gradients are
        recorded. Reentrant checkpoint: the recomputation in backward runs under the default
        saved-tensor hooks, so foxhunt's activation meter counts its peak (the non-reentrant
        variant stores recomputed tensors behind hooks of its own)."""
        if self.activation_checkpointing and torch.is_grad_enabled():
            return checkpoint(segment, *inputs, use_reentrant=True)
        return segment(*inputs)

    def _select_embedded(self, embedded: Tensor, weights: Tensor) -> Tensor:
        """sum_i weights_i * GRN_i(xi_i) for embedded variables (..., n_vars, hidden)."""
        processed = torch.stack([grn(xi) for grn, xi in zip(self.variable_grns, embedded.unbind(-2))], dim=-2)
        return (weights.unsqueeze(-1) * processed).sum(dim=-2)

    def select(self, x: Tensor, embeddings: Sequence[VariableEmbedding], context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``forward(embedded, context)`` for raw inputs x (..., n_vars) whose embedding is
        ``embeddings`` side by side (their variables, in order, make up the n_vars), at a
        fraction of the cost.

        Every linear layer that reads the embedding reads ``x_j w_j + b_j``, affine in the
        scalar ``x_j``, so the layer folds into the embedding: ``W (x_j w_j + b_j) + b =
        x_j (W w_j) + (W b_j + b)``. The weight GRN's input and skip layers (``n_vars x
        hidden`` inputs each) become linear maps of the ``n_vars`` raw values, and each variable
        GRN's input layer (hidden x hidden) an outer product. Same function, same parameters;
        only the order of the sums changes (float rounding); int8 training weights fold as the
        dequantized matrices the unfolded layers would multiply by. The embedding is still formed once,
        as the variable GRNs' residual. Without gradients (evaluation, inference) the folded
        weights are kept until a parameter changes (see :meth:`_folds`).
        """
        weight = torch.cat([e.weight for e in embeddings]) if len(embeddings) > 1 else embeddings[0].weight
        bias = torch.cat([e.bias for e in embeddings]) if len(embeddings) > 1 else embeddings[0].bias
        grn = self.weight_grn
        if not all(_foldable(layer) for layer in (grn.fc_input, grn.skip, *(g.fc_input for g in self.grns))):
            return self(x.unsqueeze(-1) * weight + bias, context)
        hidden_w, hidden_b, skip_w, skip_b, scale, offset = self._folds(weight, bias, embeddings)
        weight_hidden = F.linear(x, hidden_w, hidden_b)
        if skip_w is None:
            weight_skip = (x.unsqueeze(-1) * weight + bias).flatten(-2)
        else:
            weight_skip = F.linear(x, skip_w, skip_b)
        weights = torch.softmax(grn.finish(weight_hidden, weight_skip, context), dim=-1)
        selected = self._run_variable_grns(self._select_variables, x, weights, weight, bias, scale, offset)
        return selected, weights

    def variable_outputs(self, x_part: Tensor, embeddings: Sequence[VariableEmbedding], first: int) -> Tensor:
        """``GRN_i(xi_i)`` of the variables ``first .. first + n - 1`` from their raw values
        ``x_part`` (..., n): each depends on its own value only (the variable GRNs take no
        context), so a caller can compute them once for values that recur (the calendar's
        minutes) and hand them to :meth:`select_given`."""
        weight, bias = _embedding_weights(embeddings)
        *_, scale, offset = self._folds(weight, bias, embeddings)
        part = slice(first, first + x_part.shape[-1])
        return self._variable_grn_outputs(x_part, self.grns[part], weight[part], bias[part], scale[part], offset[part])

    @staticmethod
    def _variable_grn_outputs(x: Tensor, grns: Sequence[GatedResidualNetwork], weight: Tensor, bias: Tensor,
                              scale: Tensor, offset: Tensor) -> Tensor:  # fmt: skip
        """GRN_i(xi_i) (..., n_vars, hidden) of raw inputs x (..., n_vars): the embedding ``x_i w_i
        + b_i`` is each GRN's residual, ``x_i scale_i + offset_i`` its folded input layer, made
        afresh per variable (the GRN applies its ELU in place)."""
        embedded = x.unsqueeze(-1) * weight + bias  # (..., n_vars, hidden)
        # unbind, not slices: a slice's backward zero-fills a full-size gradient per variable
        parts = zip(grns, x.unbind(-1), embedded.unbind(-2), scale.unbind(0), offset.unbind(0))
        return torch.stack([g.finish(torch.addcmul(o, v.unsqueeze(-1), s), g.skip(e)) for g, v, e, s, o in parts], dim=-2)

    def select_given(self, x: Tensor, embeddings: Sequence[VariableEmbedding], context: Tensor | None,
                     given: Tensor) -> tuple[Tensor, Tensor]:  # fmt: skip
        """:meth:`select` with the outputs of the first ``given.shape[-2]`` variables given
        (:meth:`variable_outputs`): the same sums in the same order, so the same result."""
        weight, bias = _embedding_weights(embeddings)
        hidden_w, hidden_b, skip_w, skip_b, _, _ = self._folds(weight, bias, embeddings)
        weight_skip = (x.unsqueeze(-1) * weight + bias).flatten(-2) if skip_w is None else F.linear(x, skip_w, skip_b)
        weights = torch.softmax(self.weight_grn.finish(F.linear(x, hidden_w, hidden_b), weight_skip, context), dim=-1)
        known = given.shape[-2]
        rest = self.variable_outputs(x[..., known:], embeddings, known)
        processed = torch.cat([given, rest], dim=-2)
        return (weights.unsqueeze(-1) * processed).sum(dim=-2), weights

    def _select_variables(
        self, x: Tensor, weights: Tensor, weight: Tensor, bias: Tensor, scale: Tensor, offset: Tensor
    ) -> Tensor:
        """sum_i weights_i * GRN_i(xi_i) from the raw inputs x (..., n_vars): the embedding
        ``x_i w_i + b_i`` is each GRN's residual, ``x_i scale_i + offset_i`` its folded input
        layer. The per-variable GRNs hold most of the TFT's activations (n_vars x hidden values
        per position, several tensors each), so this is the segment that activation
        checkpointing drops after the forward pass and recomputes in the backward pass."""
        processed = self._variable_grn_outputs(x, self.grns, weight, bias, scale, offset)
        return (weights.unsqueeze(-1) * processed).sum(dim=-2)

    def _folds(
        self, weight: Tensor, bias: Tensor, embeddings: Sequence[VariableEmbedding]
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor, Tensor]:
        """The folded weights of :meth:`select`: the weight GRN's input layer (weight, bias)
        and skip layer (None when it is the identity), and the variable GRNs' input layers as
        (scale, offset), each (n_vars, out).

        Products and sums, not einsum: torch runs these matrix-vector contractions as batched
        matmuls, several times slower on CPU. Without gradients the result is cached, keyed by
        the storage and version counter of every parameter it reads (a ``load_state_dict`` or a
        move to another device or dtype changes the key); with gradients it is recomputed, so
        that autograd sees it, and the cache is dropped: torch's fused Adam updates parameters
        without bumping their version counter, so after a training step the key alone would
        serve the folds of the weights before it (validation during a fit read stale folds).
        """
        key = None
        if torch.is_grad_enabled():
            self._fold_cache = None
        else:
            sources = [*self.parameters(), *(p for e in embeddings for p in e.parameters())]
            key = tuple(_storage_key(p) for p in sources)
            cached = getattr(self, "_fold_cache", None)
            if cached is not None and cached[0] == key:
                return cached[1]
        n_vars, hidden = weight.shape
        grn = self.weight_grn
        fc_input = _matrix(grn.fc_input.weight)
        hidden_w = (fc_input.view(-1, n_vars, hidden) * weight).sum(-1)
        hidden_b = grn.fc_input.bias + fc_input @ bias.flatten()
        skip_w = skip_b = None
        if isinstance(grn.skip, nn.Linear):
            skip = _matrix(grn.skip.weight)
            skip_w = (skip.view(-1, n_vars, hidden) * weight).sum(-1)
            skip_b = grn.skip.bias + skip @ bias.flatten()
        grns = self.grns
        input_weights = torch.stack([_matrix(g.fc_input.weight) for g in grns])  # (n, out, hidden)
        input_bias = torch.stack([g.fc_input.bias for g in grns])
        scale = (input_weights * weight.unsqueeze(1)).sum(-1)
        offset = input_bias + (input_weights * bias.unsqueeze(1)).sum(-1)
        folds = (hidden_w, hidden_b, skip_w, skip_b, scale, offset)
        if key is not None:
            self._fold_cache = (key, folds)
        return folds


class InterpretableMultiHeadAttention(nn.Module):
    """Multi-head attention whose heads share the value projection and are averaged [eq. 13-16].

    Because V W_V is shared, the averaged head output equals (mean_h A_h) V W_V, so the averaged
    attention matrix fully explains the layer. A causal mask (value `finfo(dtype).min`) keeps
    every query from attending to later positions.
    """

    def __init__(self, hidden_size: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_size = hidden_size // num_heads
        self.query = nn.Linear(hidden_size, self.head_size * num_heads)  # W_Q^(h) for every head
        self.key = nn.Linear(hidden_size, self.head_size * num_heads)  # W_K^(h) for every head
        self.value = nn.Linear(hidden_size, self.head_size)  # W_V shared by the heads
        self.output = nn.Linear(self.head_size, hidden_size)  # W_H
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, query_start: int = 0) -> tuple[Tensor, Tensor]:
        """x: (B, L, hidden) -> (output (B, L - query_start, hidden), head-averaged attention
        (B, L - query_start, L)) for the queries at positions ``query_start .. L - 1`` (every
        position attends to itself and the earlier ones; keys and values are all of x)."""
        batch, length, _ = x.shape
        queries = length - query_start
        q = self.query(x[:, query_start:]).view(batch, queries, self.num_heads, self.head_size).transpose(1, 2)
        k = self.key(x).view(batch, length, self.num_heads, self.head_size).transpose(1, 2)
        v = self.value(x)  # (B, L, head_size)
        scores = q @ k.transpose(-2, -1) / self.head_size**0.5  # (B, heads, L - query_start, L)
        future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(diagonal=1)[query_start:]
        scores = scores.masked_fill(future, torch.finfo(scores.dtype).min)
        attention = self.dropout(torch.softmax(scores, dim=-1))
        heads = attention @ v.unsqueeze(1)  # (B, heads, L, head_size)
        return self.output(heads.mean(dim=1)), attention.mean(dim=1)


class StaticContexts(NamedTuple):
    """The static covariate encoders' outputs [4.3]: selection weights of the static variables,
    c_s (variable selection), c_e (enrichment) and (c_h, c_c) (the LSTMs' initial state). A
    streaming caller gives only what its call reads (``select_past`` / ``select_future``: c_s;
    ``fuse``: c_e); the others are None there."""

    weights: Tensor | None
    selection: Tensor | None
    enrichment: Tensor | None
    state: tuple[Tensor, Tensor] | None


class TFTHyperparameters(ForecasterHyperparameters):
    """The TFT's ``model.module`` (conf/model/tft.yaml): the forecasters' shared keys and these."""

    static_dim: Annotated[int, Field(ge=1, le=MAX_WIDTH, description="static features per window (the asset's)")]
    known_dim: Annotated[int, Field(ge=1, le=MAX_WIDTH, description="known features per bar (the calendar, past and future)")]
    observed_dim: Annotated[int, Field(ge=1, le=MAX_WIDTH, description="observed features per bar (the market's, past only)")]
    hidden_size: Annotated[int, Field(ge=1, le=MAX_WIDTH, description="d_model of every layer")]
    num_heads: Annotated[int, Field(ge=1, le=MAX_LAYERS, description="interpretable attention heads")]
    lstm_layers: Annotated[int, Field(ge=1, le=MAX_LAYERS, description="layers of the LSTM encoder and of the LSTM decoder")]
    activation_checkpointing: Annotated[bool | Literal["auto"], Field(description="recompute the encoder and decoder variable selections' GRNs in the backward pass instead of keeping their activations; auto: only where the run's predicted footprint exceeds its memory target (foxhunt.training.memory_plan)")]  # fmt: skip

    @model_validator(mode="after")
    def _heads_split_the_hidden_size(self) -> TFTHyperparameters:
        if self.hidden_size % self.num_heads:
            raise Related("num_heads", f"must divide model.module.hidden_size ({self.hidden_size})")
        return self

    @model_validator(mode="after")
    def _inputs_add_up(self) -> TFTHyperparameters:
        total = self.static_dim + self.known_dim + self.observed_dim
        if self.input_dim != total:
            raise Related("input_dim", f"must equal static_dim + known_dim + observed_dim ({total})")
        return self


@defined_by(TFTHyperparameters)
class TemporalFusionTransformer(ForecasterModule):
    """Temporal Fusion Transformer quantile forecaster over ForecastDataModule windows.

    Its arguments are ``model.module`` of conf/model/tft.yaml, defined (type, range, doc) by
    :class:`TFTHyperparameters`: seq_len is the encoder's steps, horizon the decoder's;
    activation_checkpointing recomputes the encoder and decoder variable selections'
    per-variable GRNs in the backward pass instead of keeping their activations (the same
    gradients for less memory and some extra compute); ``auto`` is decided by the run before it
    builds the model (:mod:`foxhunt.training.memory_plan`), and a model built with ``auto`` left
    undecided (for inference, a benchmark) keeps its activations.
    """

    def __init__(
        self,
        *,
        input_dim: int,
        static_dim: int,
        known_dim: int,
        observed_dim: int,
        hidden_size: int,
        num_heads: int,
        lstm_layers: int,
        dropout: float,
        seq_len: int,
        horizon: int,
        quantiles: Sequence[float],
        learning_rate: float,
        weight_decay: float,
        position_threshold: float,
        activation_checkpointing: bool | Literal["auto"],
    ) -> None:
        super().__init__(
            quantiles=quantiles,
            horizon=horizon,
            learning_rate=learning_rate,
            weight_decay=weight_decay,
            position_threshold=position_threshold,
        )
        self.save_hyperparameters()
        self.static_dim = static_dim
        self.known_dim = known_dim
        self.observed_dim = observed_dim
        self.seq_len = seq_len
        self.lstm_layers = lstm_layers
        d = hidden_size

        # Input embeddings: known variables share one embedding for past and future steps.
        self.static_embedding = VariableEmbedding(static_dim, d)
        self.known_embedding = VariableEmbedding(known_dim, d)
        self.observed_embedding = VariableEmbedding(observed_dim, d)

        # Variable selection.
        # Time-varying selections may recompute their variable GRNs in the backward pass
        # (activation_checkpointing); the static one has no time axis and stays as it is.
        recompute = activation_checkpointing is True  # "auto" left undecided: kept
        self.static_selection = VariableSelectionNetwork(static_dim, d, dropout, context_size=None)
        self.encoder_selection = VariableSelectionNetwork(
            known_dim + observed_dim, d, dropout, context_size=d, activation_checkpointing=recompute
        )
        self.decoder_selection = VariableSelectionNetwork(
            known_dim, d, dropout, context_size=d, activation_checkpointing=recompute
        )

        # Static covariate encoders: the four contexts.
        self.context_selection = GatedResidualNetwork(d, d, d, dropout)
        self.context_enrichment = GatedResidualNetwork(d, d, d, dropout)
        self.context_state_h = GatedResidualNetwork(d, d, d, dropout)
        self.context_state_c = GatedResidualNetwork(d, d, d, dropout)

        # Sequence-to-sequence layer.
        lstm_dropout = dropout if lstm_layers > 1 else 0.0
        self.encoder_lstm = nn.LSTM(d, d, num_layers=lstm_layers, batch_first=True, dropout=lstm_dropout)
        self.decoder_lstm = nn.LSTM(d, d, num_layers=lstm_layers, batch_first=True, dropout=lstm_dropout)
        self.post_lstm_gate = GateAddNorm(d, d, dropout)

        # Temporal fusion decoder.
        self.static_enrichment = GatedResidualNetwork(d, d, d, dropout, context_size=d)
        self.attention = InterpretableMultiHeadAttention(d, num_heads, dropout)
        self.post_attention_gate = GateAddNorm(d, d, dropout)
        self.positionwise_grn = GatedResidualNetwork(d, d, d, dropout)
        self.pre_output_gate = GateAddNorm(d, d, dropout)
        self.quantile_head = QuantileHead(d, self.n_quantiles, self.median_index)

    def _check_inputs(self, static: Tensor, known: Tensor, observed: Tensor) -> None:
        batch = static.shape[0]
        expected = {
            "static": ((batch, self.static_dim), static),
            "known": ((batch, self.seq_len + self.horizon, self.known_dim), known),
            "observed": ((batch, self.seq_len, self.observed_dim), observed),
        }
        for key, (shape, tensor) in expected.items():
            if tuple(tensor.shape) != shape:
                raise ValueError(
                    f"TemporalFusionTransformer: batch[{key!r}] has shape {tuple(tensor.shape)}, expected "
                    f"{shape} (seq_len {self.seq_len}, horizon {self.horizon})"
                )

    def forward(self, batch: Mapping[str, Tensor], return_weights: bool = False) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
        """Quantile forecasts (B, horizon, Q); with `return_weights`, also a dict of
        interpretation weights: `static` (B, static_dim), `encoder` (B, seq_len,
        known_dim + observed_dim; known variables first), `decoder` (B, horizon, known_dim) —
        variable selection weights, each summing to 1 — and `attention` (B, L, L), the
        head-averaged causal attention over all L = seq_len + horizon positions.

        The three stages below are also public, so that a stream can keep what does not change
        when one bar arrives: the static contexts (constant per asset) and the per-bar outputs
        of the variable selections (position-wise, so a bar's selection is the same in every
        window that holds it)."""
        static, known, observed = batch["static"], batch["known"], batch["observed"]
        self._check_inputs(static, known, observed)
        contexts = self.static_contexts(static)
        past_selected, encoder_weights = self.select_past(known[:, : self.seq_len], observed, contexts)
        future_selected, decoder_weights = self.select_future(known[:, self.seq_len :], contexts)
        forecast, attention = self.fuse(contexts, past_selected, future_selected, return_attention=return_weights)
        if not return_weights:
            return forecast
        # static_contexts gives the static weights (a stream's contexts may not), fuse the attention asked for
        assert contexts.weights is not None and attention is not None
        weights = {
            "static": contexts.weights,
            "encoder": encoder_weights,
            "decoder": decoder_weights,
            "attention": attention,
        }
        return forecast, weights

    # ------------------------------------------------------------------- interpretation
    def interpret_split(self, datamodule: Any, split: str, max_windows: int | None) -> Interpretation:
        """The mean selection weights and attention over the input windows of ``split``
        (``datamodule.input_windows``: what :meth:`trading_positions` decides from), at most
        ``max_windows`` of them, spread evenly over the split; names from the dataset's feature
        list. See :meth:`interpret_windows`."""
        windows = datamodule.input_windows(split)
        total = len(windows["bar_index"])
        picked = torch.from_numpy(spaced_indices(total, max_windows))
        chosen = {key: windows[key][picked] for key in INPUT_KEYS}
        dataset = datamodule.dataset
        batch = int(getattr(datamodule, "eval_batch_size", datamodule.batch_size))
        return self.interpret_windows(chosen, batch, SelectionNames.of(dataset.feature_names, dataset.groups),
                                      source=f"{split} split", total_windows=total)  # fmt: skip

    @torch.no_grad()
    def interpret_windows(self, windows: Mapping[str, Any], batch_size: int, names: SelectionNames, source: str,
                          total_windows: int | None = None, forecasts: list[Tensor] | None = None) -> Interpretation:  # fmt: skip
        """Mean variable-selection weights (static, encoder, decoder) and the decoder positions'
        head-averaged attention over ``windows`` (``static``, ``known``, ``observed`` stacked, as
        :meth:`predict_windows` reads them), ``batch_size`` windows per forward pass, in eval
        mode without gradients, in the weights' own precision like :meth:`predict_windows` (the
        forecasts the backtest trades: fp32, or the int8 weights of an int8 run); the model is
        left as it was (its mode, its weights, its forecasts). ``names``: a
        :class:`~foxhunt.evaluation.interpret.SelectionNames`; ``forecasts``: a list that gets
        each batch's forecasts (float32, CPU) from the same passes."""
        sums = InterpretationSums(names, self.seq_len, self.horizon)
        was_training = self.training
        self.eval()
        try:
            count = len(windows["static"])
            for start in range(0, count, batch_size):
                chunk = {key: torch.as_tensor(windows[key][start : start + batch_size]).to(self.device) for key in INPUT_KEYS}
                forecast, weights = self(chunk, return_weights=True)
                if forecasts is not None:
                    forecasts.append(forecast.float().cpu())
                summed = {key: value.double() for key, value in weights.items()}
                sums.add(
                    len(chunk["static"]),
                    static=summed["static"].sum(0).cpu().numpy(),
                    encoder=summed["encoder"].sum((0, 1)).cpu().numpy(),
                    decoder=summed["decoder"].sum((0, 1)).cpu().numpy(),
                    attention=summed["attention"][:, self.seq_len :].sum(0).cpu().numpy(),
                )
        finally:
            self.train(was_training)
        return sums.result(source, total_windows)

    def static_contexts(self, static: Tensor) -> StaticContexts:
        """Static covariate encoders [4.3]: the four contexts of the asset attributes (B, static_dim)."""
        vector, weights = self.static_selection.select(static, [self.static_embedding])
        state = (
            self.context_state_h(vector).unsqueeze(0).repeat(self.lstm_layers, 1, 1).contiguous(),
            self.context_state_c(vector).unsqueeze(0).repeat(self.lstm_layers, 1, 1).contiguous(),
        )
        return StaticContexts(
            weights=weights,
            selection=self.context_selection(vector),
            enrichment=self.context_enrichment(vector),
            state=state,
        )

    def select_past(self, past_known: Tensor, observed: Tensor, contexts: StaticContexts) -> tuple[Tensor, Tensor]:
        """Encoder variable selection over known + observed inputs of any number of bars
        (B, L, known_dim), (B, L, observed_dim) -> (selected (B, L, d), weights)."""
        return self.encoder_selection.select(
            torch.cat([past_known, observed], dim=-1), [self.known_embedding, self.observed_embedding],
            contexts.selection,
        )  # fmt: skip

    def encode_known(self, past_known: Tensor) -> Tensor:
        """The encoder selection's per-variable outputs of known inputs (..., known_dim) ->
        (..., known_dim, d): a function of the calendar alone (see
        :meth:`VariableSelectionNetwork.variable_outputs`)."""
        return self.encoder_selection.variable_outputs(past_known, [self.known_embedding, self.observed_embedding], 0)

    def select_past_given(self, past_known: Tensor, observed: Tensor, contexts: StaticContexts,
                          known_outputs: Tensor) -> tuple[Tensor, Tensor]:  # fmt: skip
        """:meth:`select_past` with the known variables' outputs given (:meth:`encode_known`)."""
        return self.encoder_selection.select_given(
            torch.cat([past_known, observed], dim=-1), [self.known_embedding, self.observed_embedding],
            contexts.selection, known_outputs,
        )  # fmt: skip

    def select_future(self, future_known: Tensor, contexts: StaticContexts) -> tuple[Tensor, Tensor]:
        """Decoder variable selection over the known inputs of future steps (B, H, known_dim)."""
        return self.decoder_selection.select(future_known, [self.known_embedding], contexts.selection)

    def fuse(
        self, contexts: StaticContexts, past_selected: Tensor, future_selected: Tensor, return_attention: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """LSTM encoder-decoder, static enrichment, causal attention and the position-wise
        layers over selected inputs (B, seq_len, d) and (B, horizon, d) -> (forecast, attention
        map or None)."""
        # LSTM encoder-decoder with gated skip over the selected inputs.
        encoded, state = self.encoder_lstm(past_selected, contexts.state)
        decoded, _ = self.decoder_lstm(future_selected, state)
        temporal = self.post_lstm_gate(
            torch.cat([encoded, decoded], dim=1), skip=torch.cat([past_selected, future_selected], dim=1)
        )

        # Temporal fusion decoder: enrichment, causal attention, position-wise GRN. Everything
        # after the attention is position-wise and only the decoder positions are forecast, so
        # only their queries are computed (all of them when the attention map is asked for).
        enriched = self.static_enrichment(temporal, contexts.enrichment)
        query_start = 0 if return_attention else self.seq_len
        attended, attention = self.attention(enriched, query_start=query_start)
        decoder = slice(self.seq_len, None)
        attended = self.post_attention_gate(attended[:, self.seq_len - query_start :], skip=enriched[:, decoder])
        fused = self.pre_output_gate(self.positionwise_grn(attended), skip=temporal[:, decoder])
        return self.quantile_head(fused), (attention if return_attention else None)
