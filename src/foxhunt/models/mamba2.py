"""Mamba-2 quantile forecaster: a readable single-file reference implementation in plain PyTorch.

Mamba-2 (Dao & Gu 2024, "Transformers are SSMs: Generalized Models and Efficient Algorithms
Through Structured State Space Duality") replaces attention by a selective state space model
whose transition is a scalar times the identity per head. This module writes the whole model
by hand instead of importing ``mamba-ssm`` because that package's fused CUDA/Triton kernels
(``mamba_chunk_scan_combined``, ``causal_conv1d``) do not run on CPU, and foxhunt must train
and test every model on CPU with the same math as on CUDA. Everything here is plain tensor
algebra, so it runs on any device and in any floating dtype (tests compare it in float64).

Pieces, bottom-up:

- `segsum`, `ssd_chunked`: the chunked SSD scan ("state space dual" form). The sequence is
  cut into chunks of ``chunk_size`` bars (padded with ``dt = 0`` bars to a multiple, then
  sliced back, so any length works). Within a chunk the output is a masked
  attention-like product whose mask is ``exp(segsum(A * dt))`` (the diagonal blocks); each
  chunk's end state is summed from its inputs; a short recurrence over chunks carries the
  states across chunk boundaries; each chunk then reads its incoming state through C (the
  off-diagonal, state-to-output term).
- `ssd_naive`: the plain sequential recurrence ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t``,
  ``y_t = C_t h_t``; the ground truth the tests compare `ssd_chunked` with.
- `GatedRMSNorm`: ``rmsnorm(y * silu(z))`` per group of channels (Mamba-2's output norm).
- `Mamba2Mixer`: one input projection packing (z, x, B, C, dt); depthwise causal conv1d with
  SiLU over (x, B, C); the SSD scan; the D skip; the gated norm; the output projection.
  Reference initialisation: ``dt_bias`` = inverse softplus of dt drawn log-uniformly in
  [dt_min, dt_max] (floored at dt_init_floor), ``A_log = log(U[A_init_range])``, ``D = 1``.
- `Mamba2Block` (pre-norm RMSNorm, mixer, dropout, residual) and `Mamba2Stack` (blocks and a
  final RMSNorm).
- `Mamba2Forecaster(ForecasterModule)`: per bar the 16 features (static broadcast over time,
  the past part of the known calendar, observed) -> linear to d_model -> stack -> head on the
  last bar -> (horizon, n_quantiles) forecasts whose quantiles are ordered by construction
  (`foxhunt.models.quantiles.QuantileHead`: the median plus cumulative softplus offsets on both sides).

Streaming inference: every level has ``step(x_t, state) -> (y_t, state)`` that consumes one
new bar with O(1) work and memory, carrying per layer the last ``d_conv`` conv inputs and the
SSM state (``Mamba2LayerState``); ``allocate_inference_state(batch_size)`` builds the zero
state, and every ``forward`` takes a state to continue from and, with ``return_state=True``,
hands over the state after its last bar, so a stream can switch between the chunked scan and
``step`` anywhere.

Training reads windows of ``seq_len`` bars from a zero state. Trading (``trading_positions``,
the shared backtest, and the live stream) reads the split as one stream: the recurrent state
carries from the split's first bar, so a forecast uses all the bars before it, as a recurrent
model streamed bar by bar does, and the batch path's decisions are exactly the stream's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, NamedTuple, cast

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor, nn

from foxhunt.config.model_schemas import MAX_LAYERS, MAX_LENGTH, MAX_WIDTH, Related, defined_by
from foxhunt.models.forecaster import ForecasterHyperparameters, ForecasterModule, bar_features
from foxhunt.models.quantiles import QuantileHead
from foxhunt.precision.optim import make_optimizer

#: Attribute set on parameters that must not be weight-decayed (the SSM's dt_bias, A_log, D),
#: the convention of the reference implementation.
NO_WEIGHT_DECAY_ATTR = "_no_weight_decay"
#: Chunks per segment when a whole split is streamed through `forward` (memory bound only:
#: the state carries across segments, so the result does not depend on it).
STREAM_SEGMENT_CHUNKS = 64


# ------------------------------------------------------------------------------ SSD scan
def segsum(x: Tensor) -> Tensor:
    """Stable segment sum: out[..., i, j] = sum_{k=j+1..i} x[..., k] for j <= i, -inf above.

    x: (..., T). exp(segsum(a)) is the lower-triangular decay matrix of a scalar recurrence with
    per-step log-decay a: entry (i, j) is the total decay from step j to step i. Computed by
    masked cumulative sums rather than differences of one cumsum, which would lose precision.
    """
    length = x.size(-1)
    expanded = x.unsqueeze(-1).expand(*x.shape, length)  # [..., i, j] = x_i
    strictly_lower = torch.tril(torch.ones(length, length, dtype=torch.bool, device=x.device), diagonal=-1)
    expanded = expanded.masked_fill(~strictly_lower, 0.0)
    sums = torch.cumsum(expanded, dim=-2)
    lower = torch.tril(torch.ones(length, length, dtype=torch.bool, device=x.device), diagonal=0)
    return sums.masked_fill(~lower, -math.inf)


def _heads_from_groups(m: Tensor, nheads: int) -> Tensor:
    """Expand (..., ngroups, n) to (..., nheads, n): head h reads group h // (nheads / ngroups)."""
    return m.repeat_interleave(nheads // m.shape[-2], dim=-2)


def _check_ssd_shapes(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor) -> None:
    if x.dim() != 4:
        raise ValueError(f"ssd: x must be (batch, length, nheads, headdim), got {tuple(x.shape)}")
    batch, length, nheads, _ = x.shape
    if tuple(dt.shape) != (batch, length, nheads):
        raise ValueError(f"ssd: dt must be {(batch, length, nheads)}, got {tuple(dt.shape)}")
    if tuple(A.shape) != (nheads,):
        raise ValueError(f"ssd: A must be ({nheads},), got {tuple(A.shape)}")
    if B.dim() != 4 or B.shape[:2] != (batch, length) or B.shape != C.shape:
        raise ValueError(
            f"ssd: B and C must both be (batch, length, ngroups, d_state), got {tuple(B.shape)} and {tuple(C.shape)}"
        )
    if nheads % B.shape[-2] != 0:
        raise ValueError(f"ssd: nheads={nheads} is not a multiple of ngroups={B.shape[-2]}")


def ssd_naive(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, initial_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Sequential reference of the selective scan, one step at a time.

    x: (b, L, h, p) inputs; dt: (b, L, h) positive step sizes; A: (h,) negative rates;
    B, C: (b, L, g, n) with h a multiple of g; initial_state: (b, h, p, n) or None (zeros).
    h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t (outer product over p x n), y_t = C_t h_t.
    Returns (y (b, L, h, p), final state (b, h, p, n)). No D skip (the mixer adds it).
    """
    _check_ssd_shapes(x, dt, A, B, C)
    batch, length, nheads, headdim = x.shape
    Bh = _heads_from_groups(B, nheads)
    Ch = _heads_from_groups(C, nheads)
    state = x.new_zeros(batch, nheads, headdim, B.shape[-1]) if initial_state is None else initial_state
    outputs = []
    for t in range(length):
        decay = torch.exp(dt[:, t] * A)  # (b, h)
        update = torch.einsum("bh,bhn,bhp->bhpn", dt[:, t], Bh[:, t], x[:, t])
        state = state * decay[..., None, None] + update
        outputs.append(torch.einsum("bhpn,bhn->bhp", state, Ch[:, t]))
    y = torch.stack(outputs, dim=1) if outputs else x.new_zeros(x.shape)
    return y, state


def ssd_chunked(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Chunked SSD scan, equal to `ssd_naive` (same arguments and returns) up to rounding.

    The sequence is padded at the end with dt = 0 bars (no decay, no input, so the final
    state is unchanged) to a multiple of `chunk_size`, and the output sliced back to L.
    Notation below: c chunks of l bars, h heads, p head channels, n state size.
    """
    _check_ssd_shapes(x, dt, A, B, C)
    if chunk_size < 1:
        raise ValueError(f"ssd_chunked: chunk_size must be >= 1, got {chunk_size}")
    batch, length, nheads, headdim = x.shape
    pad = (-length) % chunk_size
    if pad:
        x = F.pad(x, (0, 0, 0, 0, 0, pad))
        dt = F.pad(dt, (0, 0, 0, pad))
        B = F.pad(B, (0, 0, 0, 0, 0, pad))
        C = F.pad(C, (0, 0, 0, 0, 0, pad))
    n_chunks = (length + pad) // chunk_size
    ngroups = B.shape[-2]
    per_group = nheads // ngroups  # heads sharing one (B, C) group; head h reads group h // per_group

    def chunked(t: Tensor) -> Tensor:  # (b, c*l, ...) -> (b, c, l, ...)
        return t.reshape(batch, n_chunks, chunk_size, *t.shape[2:])

    xs = chunked(x * dt.unsqueeze(-1))  # discretised input dt_t x_t: (b, c, l, h, p)
    Bc, Cc = chunked(B), chunked(C)  # (b, c, l, g, n), kept per group (not copied per head)
    log_decay = chunked(dt * A).permute(0, 3, 1, 2)  # A dt: (b, h, c, l)
    cum = torch.cumsum(log_decay, dim=-1)  # (b, h, c, l)

    # 1. Diagonal blocks: output from inputs of the same chunk, a masked "attention" whose
    #    scores are C_l . B_s times the decay from bar s to bar l.
    decay_within = torch.exp(segsum(log_decay))  # (b, h, c, l, s)
    cb = torch.einsum("bclgn,bcsgn->bgcls", Cc, Bc).unsqueeze(2)  # (b, g, 1, c, l, s)
    scores = (decay_within.reshape(batch, ngroups, per_group, *decay_within.shape[2:]) * cb).flatten(1, 2)
    y_diag = torch.einsum("bhcls,bcshp->bclhp", scores, xs)

    # 2. State at the end of each chunk from that chunk's inputs alone.
    decay_to_end = torch.exp(cum[..., -1:] - cum)  # (b, h, c, l)
    weighted = (xs * decay_to_end.permute(0, 2, 3, 1).unsqueeze(-1)).unflatten(3, (ngroups, per_group))
    chunk_states = torch.einsum("bclgn,bclgjp->bcgjpn", Bc, weighted).flatten(2, 3)  # (b, c, h, p, n)

    # 3. Inter-chunk recurrence: state entering each chunk (and the final state).
    if initial_state is None:
        initial_state = x.new_zeros(batch, nheads, headdim, B.shape[-1])
    states = torch.cat([initial_state.unsqueeze(1), chunk_states], dim=1)  # (b, c+1, h, p, n)
    decay_chunks = torch.exp(segsum(F.pad(cum[..., -1], (1, 0))))  # (b, h, c+1, c+1)
    states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunks, states)
    entering, final_state = states[:, :-1], states[:, -1]

    # 4. Off-diagonal blocks: each chunk reads the state that entered it, decayed to bar l.
    decay_from_start = torch.exp(cum).permute(0, 2, 3, 1).unsqueeze(-1)  # (b, c, l, h, 1)
    entering = entering.unflatten(2, (ngroups, per_group))  # (b, c, g, j, p, n)
    y_off = torch.einsum("bclgn,bcgjpn->bclgjp", Cc, entering).flatten(3, 4) * decay_from_start

    y = (y_diag + y_off).reshape(batch, n_chunks * chunk_size, nheads, headdim)
    return y[:, :length], final_state


# ------------------------------------------------------------------------------ layers
class Mamba2LayerState(NamedTuple):
    """Streaming state of one mixer: the last d_conv conv inputs and the SSM state."""

    conv: Tensor  # (batch, conv_dim, d_conv), oldest input first
    ssm: Tensor  # (batch, nheads, headdim, d_state)


class GatedRMSNorm(nn.Module):
    """rmsnorm(y * silu(z)) over groups of `group_size` channels, with a learned scale.

    Mamba-2 gates before normalising ("norm_before_gate=False" in the reference) and
    normalises each of its ngroups channel groups separately.
    """

    def __init__(self, dim: int, group_size: int, eps: float) -> None:
        super().__init__()
        if dim % group_size != 0:
            raise ValueError(f"GatedRMSNorm: dim={dim} is not a multiple of group_size={group_size}")
        self.group_size = group_size
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, y: Tensor, z: Tensor) -> Tensor:
        gated = y * F.silu(z)
        grouped = gated.reshape(*gated.shape[:-1], -1, self.group_size)
        # F.rms_norm without a weight is x * rsqrt(mean(x^2) + eps), in one kernel
        normed = F.rms_norm(grouped, (self.group_size,), eps=self.eps)
        return normed.reshape(gated.shape) * self.weight


class Mamba2Mixer(nn.Module):
    """The Mamba-2 sequence mixer: (batch, L, d_model) -> (batch, L, d_model), causal.

    d_inner = expand * d_model channels split into nheads = d_inner / headdim heads; B and C
    (d_state each) are shared by the heads of each of ngroups groups. Its arguments are the
    forecaster's validated hyperparameters (:class:`Mamba2Hyperparameters`: headdim divides
    d_inner, ngroups divides nheads, dt_min <= dt_max, 0 < A's low <= high).
    """

    def __init__(
        self,
        *,
        d_model: int,
        d_state: int,
        d_conv: int,
        expand: int,
        headdim: int,
        ngroups: int,
        chunk_size: int,
        dt_min: float,
        dt_max: float,
        dt_init_floor: float,
        A_init_range: Sequence[float],
        norm_eps: float,
    ) -> None:
        super().__init__()
        d_inner = expand * d_model
        nheads = d_inner // headdim
        a_low, a_high = (float(v) for v in A_init_range)
        self.d_model, self.d_state, self.d_conv = d_model, d_state, d_conv
        self.d_inner, self.headdim, self.nheads, self.ngroups = d_inner, headdim, nheads, ngroups
        self.chunk_size = chunk_size
        self.conv_dim = d_inner + 2 * ngroups * d_state

        # One projection packs the gate z, the conv inputs (x, B, C) and the per-head dt.
        self.in_proj = nn.Linear(d_model, 2 * d_inner + 2 * ngroups * d_state + nheads)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, kernel_size=d_conv, groups=self.conv_dim, padding=d_conv - 1)

        # Reference initialisation of the SSM parameters (mamba_ssm Mamba2.__init__).
        dt = torch.exp(torch.rand(nheads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        self.A_log = nn.Parameter(torch.log(torch.empty(nheads).uniform_(a_low, a_high)))
        self.D = nn.Parameter(torch.ones(nheads))
        for param in (self.dt_bias, self.A_log, self.D):
            setattr(param, NO_WEIGHT_DECAY_ATTR, True)

        self.norm = GatedRMSNorm(d_inner, group_size=d_inner // ngroups, eps=norm_eps)
        self.out_proj = nn.Linear(d_inner, d_model)

    def _split_projection(self, zxbcdt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        z, xbc, dt = torch.split(zxbcdt, [self.d_inner, self.conv_dim, self.nheads], dim=-1)
        return z, xbc, dt

    def _split_conv_output(self, xbc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        gn = self.ngroups * self.d_state
        x, B, C = torch.split(xbc, [self.d_inner, gn, gn], dim=-1)
        return x, B, C

    def _output(self, y: Tensor, x: Tensor, z: Tensor) -> Tensor:
        """D skip, gated norm and output projection; y, x: (..., nheads, headdim)."""
        y = y + x * self.D[:, None]
        y = y.reshape(*y.shape[:-2], self.d_inner)
        return self.out_proj(self.norm(y, z))

    def forward(
        self, u: Tensor, state: Mamba2LayerState | None = None, return_state: bool = False
    ) -> Tensor | tuple[Tensor, Mamba2LayerState]:
        """u: (batch, L, d_model) -> (batch, L, d_model), continuing from ``state`` (the state
        after earlier bars; ``None``: the zero state, a fresh sequence); with return_state also
        the state after the last bar, from which `step` or another `forward` continues."""
        batch, length, _ = u.shape
        z, xbc_in, dt = self._split_projection(self.in_proj(u))
        dt = F.softplus(dt + self.dt_bias)  # (b, L, h)
        conv_in = xbc_in.transpose(1, 2)  # (b, conv_dim, L)
        before = self.d_conv - 1  # earlier inputs the first bars' conv windows reach back to
        if state is not None and before:
            conv_in = torch.cat([state.conv[..., 1:], conv_in], dim=-1)
            conv_out = self.conv1d(conv_in)[..., before : before + length]
        else:
            conv_out = self.conv1d(conv_in)[..., :length]
        xbc = F.silu(conv_out.transpose(1, 2))
        x, B, C = self._split_conv_output(xbc)
        x = x.reshape(batch, length, self.nheads, self.headdim)
        B = B.reshape(batch, length, self.ngroups, self.d_state)
        C = C.reshape(batch, length, self.ngroups, self.d_state)
        A = -torch.exp(self.A_log)
        y, final_ssm = ssd_chunked(x, dt, A, B, C, self.chunk_size, None if state is None else state.ssm)
        out = self._output(y, x, z)
        if not return_state:
            return out
        window = conv_in[..., -self.d_conv :]
        conv_state = F.pad(window, (self.d_conv - window.shape[-1], 0))
        return out, Mamba2LayerState(conv=conv_state, ssm=final_ssm)

    def allocate_inference_state(
        self, batch_size: int, dtype: torch.dtype | None = None, device: torch.device | None = None
    ) -> Mamba2LayerState:
        """Zero state (the state before the first bar); size independent of sequence length."""
        reference = self.conv1d.weight  # a plain tensor even when the projections are quantized copies
        dtype = dtype or reference.dtype
        device = device or reference.device
        return Mamba2LayerState(
            conv=torch.zeros(batch_size, self.conv_dim, self.d_conv, dtype=dtype, device=device),
            ssm=torch.zeros(batch_size, self.nheads, self.headdim, self.d_state, dtype=dtype, device=device),
        )

    def step(self, u_t: Tensor, state: Mamba2LayerState) -> tuple[Tensor, Mamba2LayerState]:
        """One new bar u_t: (batch, d_model) -> (output (batch, d_model), new state); O(1).

        Written for few tensor operations (a streaming step is dispatch-bound: each costs
        microseconds whatever its size): the conv is one multiply-and-sum over the window, and
        B, C reach the heads of their group by broadcasting over a (group, head) split of
        the head axis instead of copies per head.
        """
        batch = u_t.shape[0]
        groups, per_group = self.ngroups, self.nheads // self.ngroups
        z, xbc_in, dt = self._split_projection(self.in_proj(u_t))
        conv_state = torch.cat([state.conv[..., 1:], xbc_in.unsqueeze(-1)], dim=-1)
        xbc = (conv_state * self.conv1d.weight.squeeze(1)).sum(dim=-1)
        if self.conv1d.bias is not None:
            xbc = xbc + self.conv1d.bias
        x, B, C = self._split_conv_output(F.silu(xbc))
        x = x.reshape(batch, groups, per_group, self.headdim)
        dt = F.softplus(dt + self.dt_bias)  # (b, h)
        decay = torch.exp(dt * -torch.exp(self.A_log)).view(batch, groups, per_group, 1, 1)
        # h_t = exp(dt A) h_{t-1} + dt B_t x_t (outer product x (p) by B (n)), per group of heads
        update = (dt.view(batch, groups, per_group, 1) * x).unsqueeze(-1) * B.view(batch, groups, 1, 1, self.d_state)
        ssm_state = state.ssm.view(batch, groups, per_group, self.headdim, self.d_state) * decay + update
        y = (ssm_state @ C.view(batch, groups, 1, self.d_state, 1)).view(batch, self.nheads, self.headdim)
        ssm_state = ssm_state.view(batch, self.nheads, self.headdim, self.d_state)
        out = self._output(y, x.view(batch, self.nheads, self.headdim), z)
        return out, Mamba2LayerState(conv=conv_state, ssm=ssm_state)


class Mamba2Block(nn.Module):
    """Pre-norm residual block: u + dropout(mixer(rmsnorm(u)))."""

    def __init__(self, *, d_model: int, dropout: float, norm_eps: float, **mixer_kwargs) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(d_model, eps=norm_eps)
        self.mixer = Mamba2Mixer(d_model=d_model, norm_eps=norm_eps, **mixer_kwargs)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, u: Tensor, state: Mamba2LayerState | None = None, return_state: bool = False
    ) -> Tensor | tuple[Tensor, Mamba2LayerState]:
        if not return_state:
            return u + self.dropout(self.mixer(self.norm(u), state))
        out, state = self.mixer(self.norm(u), state, return_state=True)
        return u + self.dropout(out), state

    def allocate_inference_state(self, batch_size: int, **kwargs) -> Mamba2LayerState:
        return self.mixer.allocate_inference_state(batch_size, **kwargs)

    def step(self, u_t: Tensor, state: Mamba2LayerState) -> tuple[Tensor, Mamba2LayerState]:
        out, state = self.mixer.step(self.norm(u_t), state)
        return u_t + self.dropout(out), state


class Mamba2Stack(nn.Module):
    """n_layers residual blocks followed by a final RMSNorm; (batch, L, d_model) -> same."""

    def __init__(self, *, n_layers: int, d_model: int, norm_eps: float, **block_kwargs) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Mamba2Block(d_model=d_model, norm_eps=norm_eps, **block_kwargs) for _ in range(n_layers))
        self.norm_f = nn.RMSNorm(d_model, eps=norm_eps)

    @property
    def blocks(self) -> list[Mamba2Block]:
        """The layers as the blocks they are (``nn.ModuleList`` types its items as any Module)."""
        return [cast(Mamba2Block, layer) for layer in self.layers]

    def forward(
        self, u: Tensor, state: Sequence[Mamba2LayerState] | None = None, return_state: bool = False
    ) -> Tensor | tuple[Tensor, list[Mamba2LayerState]]:
        """(batch, L, d_model) -> same, continuing from ``state`` (one per layer; ``None``:
        zero); with return_state also the state after the last bar."""
        states = [None] * len(self.layers) if state is None else list(state)
        if len(states) != len(self.layers):
            raise ValueError(f"Mamba2Stack: state has {len(states)} layers, the stack {len(self.layers)}")
        if not return_state:
            for layer, layer_state in zip(self.layers, states):
                u = layer(u, layer_state)
            return self.norm_f(u)
        new_state = []
        for layer, layer_state in zip(self.layers, states):
            u, layer_state = layer(u, layer_state, return_state=True)
            new_state.append(layer_state)
        return self.norm_f(u), new_state

    def allocate_inference_state(self, batch_size: int, **kwargs) -> list[Mamba2LayerState]:
        return [layer.allocate_inference_state(batch_size, **kwargs) for layer in self.blocks]

    def step(self, u_t: Tensor, state: Sequence[Mamba2LayerState]) -> tuple[Tensor, list[Mamba2LayerState]]:
        if len(state) != len(self.layers):
            raise ValueError(f"Mamba2Stack.step: state has {len(state)} layers, the stack {len(self.layers)}")
        new_state = []
        for layer, layer_state in zip(self.blocks, state):
            u_t, layer_state = layer.step(u_t, layer_state)
            new_state.append(layer_state)
        return self.norm_f(u_t), new_state


# ------------------------------------------------------------------------- hyperparameters
class Mamba2Hyperparameters(ForecasterHyperparameters):
    """Mamba-2's ``model.module`` (conf/model/mamba2.yaml): the forecasters' shared keys and these."""

    d_model: Annotated[int, Field(ge=1, le=MAX_WIDTH, description="residual stream width")]
    n_layers: Annotated[int, Field(ge=1, le=MAX_LAYERS, description="Mamba-2 residual blocks")]
    d_state: Annotated[int, Field(ge=1, le=MAX_WIDTH, description="SSM state size N per head")]
    d_conv: Annotated[int, Field(ge=1, le=MAX_LAYERS, description="width of the depthwise causal convolution over (x, B, C)")]
    expand: Annotated[int, Field(ge=1, le=MAX_LAYERS, description="d_inner = expand x d_model")]
    headdim: Annotated[int, Field(ge=1, le=MAX_WIDTH, description="channels per SSM head P (nheads = d_inner / headdim)")]
    ngroups: Annotated[int, Field(ge=1, le=MAX_LAYERS, description="groups of heads sharing B and C")]
    chunk_size: Annotated[int, Field(ge=1, le=MAX_LENGTH, description="SSD chunk length (a sequence is padded to a multiple)")]
    dt_min: Annotated[float, Field(gt=0, le=10, description="dt is initialised log-uniform in [dt_min, dt_max]")]
    dt_max: Annotated[float, Field(gt=0, le=10, description="the upper end of dt's initial range")]
    dt_init_floor: Annotated[float, Field(gt=0, le=10, description="the initial dt's floor (dt_bias = softplus^-1(dt))")]
    A_init_range: Annotated[list[Annotated[float, Field(gt=0, le=1e4)]],
                            Field(min_length=2, max_length=2, strict=False, description="[low, high]: A = -exp(A_log), A_log = log(U[low, high])")]  # fmt: skip
    norm_eps: Annotated[float, Field(gt=0, le=1, description="epsilon of every RMSNorm (pre-norm, gated, final)")]

    @model_validator(mode="after")
    def _heads_fit(self) -> Mamba2Hyperparameters:
        d_inner = self.d_model * self.expand
        if d_inner % self.headdim:
            raise Related("headdim", f"must divide d_model x expand ({d_inner})")
        if (d_inner // self.headdim) % self.ngroups:
            raise Related("ngroups", f"must divide the number of SSM heads ({d_inner // self.headdim})")
        return self

    @model_validator(mode="after")
    def _ranges_ordered(self) -> Mamba2Hyperparameters:
        if self.dt_max < self.dt_min:
            raise Related("dt_max", f"must be >= model.module.dt_min ({self.dt_min})")
        low, high = self.A_init_range
        if high < low:
            raise Related("A_init_range", "must be [low, high] with low <= high")
        return self


# ------------------------------------------------------------------------------ forecaster
@defined_by(Mamba2Hyperparameters)
class Mamba2Forecaster(ForecasterModule):
    """Mamba-2 quantile forecaster of the next `horizon` scaled 1-bar log returns.

    Per bar the input is the 16 features in dataset column order (static broadcast over time,
    the past seq_len bars of the known calendar, observed); a linear layer lifts them to
    d_model, the Mamba-2 stack mixes them causally, and a `QuantileHead` on the last bar's hidden
    state gives (horizon, n_quantiles) ordered quantiles. `step` runs the same model one bar
    at a time (streaming); its output after bar t equals `forward` on a window ending at t.
    Its arguments are ``model.module`` of conf/model/mamba2.yaml, defined (type, range, doc) by
    :class:`Mamba2Hyperparameters`.
    """

    def __init__(
        self,
        *,
        input_dim: int,
        seq_len: int,
        horizon: int,
        d_model: int,
        n_layers: int,
        d_state: int,
        d_conv: int,
        expand: int,
        headdim: int,
        ngroups: int,
        chunk_size: int,
        dt_min: float,
        dt_max: float,
        dt_init_floor: float,
        A_init_range: Sequence[float],
        norm_eps: float,
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
        self.input_proj = nn.Linear(self.input_dim, d_model)
        self.backbone = Mamba2Stack(
            n_layers=n_layers,
            d_model=d_model,
            norm_eps=norm_eps,
            dropout=dropout,
            d_state=d_state,
            d_conv=d_conv,
            expand=expand,
            headdim=headdim,
            ngroups=ngroups,
            chunk_size=chunk_size,
            dt_min=dt_min,
            dt_max=dt_max,
            dt_init_floor=dt_init_floor,
            A_init_range=A_init_range,
        )
        self.head_dropout = nn.Dropout(dropout)
        self.head = QuantileHead(d_model, self.n_quantiles, self.median_index, self.horizon)

    # ---------------------------------------------------------------- full-window path
    def bar_features(self, batch: Mapping[str, Tensor]) -> Tensor:
        """(B, seq_len, input_dim): the window's bars (:func:`foxhunt.models.forecaster.bar_features`)."""
        return bar_features(batch, self.seq_len, self.input_dim)

    def _forecast(self, hidden: Tensor) -> Tensor:
        """Hidden states (..., d_model) -> ordered quantile forecasts (..., horizon, Q)."""
        return self.head(self.head_dropout(hidden))

    def forecast_sequence(self, features: Tensor) -> Tensor:
        """Forecasts after every bar of features (B, L, input_dim) -> (B, L, horizon, Q)."""
        return self._forecast(self.backbone(self.input_proj(features)))

    def forward(self, batch: Mapping[str, Tensor]) -> Tensor:
        hidden = self.backbone(self.input_proj(self.bar_features(batch)))
        return self._forecast(hidden[:, -1])

    # ---------------------------------------------------------------- streaming path
    def allocate_inference_state(self, batch_size: int, **kwargs) -> list[Mamba2LayerState]:
        """Zero streaming state: one `Mamba2LayerState` per layer, constant in size."""
        return self.backbone.allocate_inference_state(batch_size, **kwargs)

    def init_state(self, batch_size: int) -> list[Mamba2LayerState]:
        """Same as `allocate_inference_state` with the module's dtype and device."""
        return self.allocate_inference_state(batch_size)

    def step(self, x_t: Tensor, state: Sequence[Mamba2LayerState]) -> tuple[Tensor, list[Mamba2LayerState]]:
        """One bar's features x_t: (B, input_dim) -> (forecast (B, horizon, Q), new state)."""
        hidden, state = self.backbone.step(self.input_proj(x_t), state)
        return self._forecast(hidden), state

    def forecast_stream(
        self, features: Tensor, state: Sequence[Mamba2LayerState] | None = None
    ) -> tuple[Tensor, list[Mamba2LayerState]]:
        """Forecasts after every bar of features (B, L, input_dim), continuing from ``state``
        (``None``: a fresh stream) -> ((B, L, horizon, Q), the state after the last bar).
        The chunked scan of `forward` over a whole sequence; equal to `step` bar by bar."""
        hidden, new_state = self.backbone(self.input_proj(features), state, return_state=True)
        return self._forecast(hidden), new_state

    @torch.no_grad()
    def trading_positions(self, datamodule, split: str) -> np.ndarray:
        """Positions (T,) over ``split`` as the model streams live: one recurrent state carried
        from the split's first bar (segments of ``STREAM_SEGMENT_CHUNKS`` chunks, for bounded
        memory), so the forecast at bar t has read every bar of the split up to t, exactly what
        `step` gives bar by bar. The first seq_len - 1 bars hold 0, as for every forecaster."""
        dataset = datamodule.dataset
        features = torch.from_numpy(dataset.splits[split].features).float()
        groups = dataset.groups
        features = torch.cat([features[:, groups[g]] for g in ("static", "known", "observed")], dim=1)
        segment = int(self.hparams["chunk_size"]) * STREAM_SEGMENT_CHUNKS
        was_training = self.training
        self.eval()
        try:
            state, forecasts = None, []
            for start in range(0, len(features), segment):
                chunk = features[start : start + segment].unsqueeze(0).to(self.device)
                forecast, state = self.forecast_stream(chunk, state)
                forecasts.append(forecast[0].float().cpu())
        finally:
            self.train(was_training)
        positions = self.positions_from_forecasts(torch.cat(forecasts)) if forecasts else np.zeros(0, np.int8)
        positions[: self.seq_len - 1] = 0
        return positions

    # ---------------------------------------------------------------- optimisation
    def configure_optimizers(self) -> torch.optim.Optimizer:
        """AdamW with weight decay on matrices only: biases, norm scales and the SSM's
        dt_bias / A_log / D (marked like the reference) are not decayed."""
        decay, no_decay = [], []
        for param in self.parameters():
            if not param.requires_grad:
                continue
            if getattr(param, NO_WEIGHT_DECAY_ATTR, False) or param.dim() < 2:
                no_decay.append(param)
            else:
                decay.append(param)
        return make_optimizer(
            [
                {"params": decay, "weight_decay": self.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            "adamw",
            lr=self.learning_rate,
        )
