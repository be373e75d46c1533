"""One ensemble member: a trained model that decides on one new bar at a time, for many streams.

A member holds its model's weights once and the streaming state of every stream (a symbol of a
feed, a replay) in a **state pool**: arrays with one slot per stream (:meth:`Member.new_slot`,
:meth:`Member.free_slot`). :meth:`Member.step` takes one bar of each of B streams (their input
rows, their slots) and answers each with a :class:`Decision` (the position held from this bar
to the next; forecasters also their quantile forecast), in one batched call: the weights are
read once per batch, the per-call overhead paid once. The decisions are those of the model's
batch path (``trading_positions``) over a split:

- :class:`AgentMember` (DQN, PPO): the greedy action of the acting network on the bar's
  features and the position held, as the greedy walk;
- :class:`Mamba2Member`: advances the recurrent state by one step per bar;
- :class:`TFTMember`: keeps the per-bar encoder selections of the last ``seq_len`` bars (a ring
  per slot) and the decoder selections of the future minutes already seen (shared: the known
  calendar is the asset's, the same for every stream); a new bar computes one encoder
  selection, the selections of the minutes not seen, then the LSTM encoder-decoder, attention
  and heads of the window;
- :class:`WindowMember`: any other forecaster (DLinear): keeps the last ``seq_len`` input rows
  of each stream (a ring per slot) and runs the model's own ``forward`` on the window, with the
  calendar of the next ``horizon`` minutes, exactly the batch path's input.

Which member streams a model is read from what its class offers (:func:`stream_of`), never
from its family's name: a new family streams as soon as its model is a window forecaster.

Forecasters decide once ``seq_len`` bars have arrived since the slot was reset (flat before),
as the batch path, whose first ``seq_len - 1`` bars of a split are flat.

**Runtimes** (:data:`RUNTIMES`): the agents and Mamba-2 run in numba (:mod:`foxhunt.ensemble.kernels`),
numpy or torch; the TFT in ONNX Runtime (:mod:`foxhunt.ensemble.onnx_runtime`) or torch. With
``runtime=auto`` the member times each candidate on its own inputs when it is built and keeps
the fastest, saying so in :attr:`Member.runtime_note`. **int8** (``weights="int8"``): the agents'
and Mamba-2's weight matrices as int8 with one scale per row in the numba kernels (weight-only:
activations stay float32), the TFT's graphs quantized by ONNX Runtime; the member whose model
arrived as a torchao int8 copy (:mod:`foxhunt.precision.inference`) runs it in torch. A member
whose runtime holds the weights itself drops its torch module (:attr:`Member.module` is None):
the bytes that stay resident are the runtime's.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from foxhunt.ensemble.kernels import linear, mamba2_step, quantize_rows
from foxhunt.ensemble.onnx_runtime import Graph, export_tft
from foxhunt.ensemble.runtimes import NUMPY_ACTIVATIONS, Mamba2Arrays, UnsupportedModule, mamba2_arrays, mlp_layers
from foxhunt.models.forecaster import forecast_signal, signal_position
from foxhunt.models.tft import StaticContexts
from foxhunt.precision.inference import default_int8_policy, int8_inference_model

RUNTIMES = ("auto", "numba", "numpy", "onnx", "torch")
NS_PER_MINUTE = 60_000_000_000
POOL_GROWTH = 2  # a full pool grows to this many times its slots
FUTURE_CACHE_MINUTES = 4096  # the TFT's shared decoder selections kept (minute -> selection)
FUTURE_BLOCK = 64  # future minutes whose decoder selections the TFT computes ahead, in one call


@dataclass(frozen=True)
class Decision:
    """A member's answer to one bar: ``position`` in {-1, 0, 1} held from this bar to the next;
    for forecasters ``forecast`` (horizon, Q) in target-scale units and ``signal``, the median
    forecast summed over the horizon (what the position is the thresholded sign of)."""

    position: int
    forecast: np.ndarray | None = None
    signal: float | None = None


#: future(i, horizon) -> (horizon, 8) float32: the known calendar of the ``horizon`` minutes after
#: the bar of stream i of the batch.
Future = Callable[[int, int], np.ndarray]


def int8_torch_copy(module):
    """The torchao int8 inference copy of a model (the torch runtime's int8 weights)."""
    return int8_inference_model(module, default_int8_policy())


def _median_us(call: Callable[[], Any], calls: int) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - started)
    return float(np.median(times)) / 1e3


class Member(ABC):
    """A trained model in the ensemble (see the module doc).

    ``name``: its registered name; ``family``: its model family (``conf/model/<family>.yaml``,
    set by :func:`make_member`); ``weights``: fp32 or int8; ``metric``: its value of the
    selection metric (the weighted rule reads it). ``forecasts``: its decisions carry a
    quantile forecast and a signal (the forecasters).
    """

    family: str = ""
    forecasts: bool = True

    def __init__(self, name: str, module: torch.nn.Module, weights: str, metric: float | None) -> None:
        self.name = name
        self.module: torch.nn.Module | None = module.eval()
        self.weights = weights
        self.metric = metric
        self.runtime = "torch"
        self.runtime_note = "torch (the only runtime of this member)"
        self._free: list[int] = []
        self._slots = 0  # slots allocated so far (the pool's used length)

    # -- slots ---------------------------------------------------------------------------
    def new_slot(self) -> int:
        """A fresh stream's slot (zero state)."""
        if self._free:
            slot = self._free.pop()
        else:
            slot = self._slots
            self._slots += 1
            if slot >= self._capacity():
                self._grow(max(1, POOL_GROWTH * self._capacity()))
        self.reset(slot)
        return slot

    def free_slot(self, slot: int) -> None:
        """Give a stream's slot back (its state is dropped; the slot is reused)."""
        self._free.append(slot)

    @abstractmethod
    def _capacity(self) -> int:
        """Slots the pool holds now."""

    @abstractmethod
    def _grow(self, slots: int) -> None:
        """Make the pool hold ``slots`` slots, keeping the used ones."""

    @abstractmethod
    def reset(self, slot: int) -> None:
        """Forget every bar of the stream in ``slot``: flat, empty history, zero state."""

    @abstractmethod
    def step(self, rows: np.ndarray, slots: np.ndarray, ts_ns: np.ndarray, future: Future) -> list[Decision]:
        """The decisions on one new bar of each stream: ``rows`` (B, F) float32 input rows,
        ``slots`` (B,) their slots (distinct), ``ts_ns`` (B,) the bars' starts (UTC ns),
        ``future`` their known calendars."""

    def state_bytes(self) -> int:
        """Bytes of one stream's state (what a slot of the pool holds)."""
        return 0

    def runtime_bytes(self) -> int:
        """Bytes of the weights its runtime holds besides the torch module (0 in torch)."""
        return 0

    # -- runtimes ------------------------------------------------------------------------
    def _choose_runtime(self, requested: str, candidates: dict[str, Callable[[], Any] | None], probe_calls: int) -> str:
        """Pick a runtime among ``candidates`` (name -> a call of it, ``None`` where it cannot
        run these weights): as asked, or with ``auto`` the fastest median of ``probe_calls``
        timed calls each (time.perf_counter_ns)."""
        if requested not in RUNTIMES:
            raise ValueError(f"ensemble.runtime={requested!r}: must be one of {', '.join(RUNTIMES)}")
        usable = {name: call for name, call in candidates.items() if call is not None}
        if requested != "auto":
            if requested in usable:
                self.runtime_note = f"{requested} (ensemble.runtime)"
                return requested
            fallback = "torch" if "torch" in usable else next(iter(usable))
            self.runtime_note = f"{fallback} (no {requested} runtime for this member)"
            return fallback
        if len(usable) == 1:
            (only,) = usable
            self.runtime_note = f"{only} (the only runtime for these weights)"
            return only
        for call in usable.values():  # compiled kernels and graphs warm up before they are timed
            call()
        times = {name: _median_us(call, probe_calls) for name, call in usable.items()}
        choice = min(times, key=times.__getitem__)
        measured = ", ".join(f"{name} {us:.1f} us" for name, us in times.items())
        self.runtime_note = f"{choice} (auto: median of {probe_calls} timed calls at load: {measured})"
        return choice


def _array_bytes(*arrays: Any) -> int:
    return int(sum(a.nbytes for a in arrays if isinstance(a, np.ndarray)))


def _grow_rows(array: np.ndarray, slots: int) -> np.ndarray:
    grown = np.zeros((slots, *array.shape[1:]), array.dtype)
    grown[: len(array)] = array
    return grown


# ---------------------------------------------------------------------------------- agents
class AgentMember(Member):
    """A DQN or PPO agent acting greedily on the features and the position it holds."""

    forecasts = False

    def __init__(self, name: str, family: str, module, weights: str, metric: float | None, runtime: str,
                 probe_calls: int) -> None:  # fmt: skip
        super().__init__(name, module, weights, metric)
        self.family = family
        self.obs_dim = int(module.obs_dim)
        self.positions = np.zeros(1, np.int8)
        try:
            layers = mlp_layers(module.acting_network)
        except UnsupportedModule:
            layers = None
        int8 = weights == "int8"
        # numba: fp32 rows (scales 1) or int8 rows with their scales; numpy: fp32 only
        self._numba = None if layers is None else [
            (*(quantize_rows(w) if int8 else (w, np.ones(len(w), np.float32))), b, act) for w, b, act in layers
        ]  # fmt: skip
        self._numpy = None if layers is None or int8 else layers
        self._network = (int8_torch_copy(module) if int8 else module).acting_network
        probe = np.zeros((1, self.obs_dim), np.float32)
        candidates = {
            "numba": (lambda: self._numba_scores(probe)) if self._numba is not None else None,
            "numpy": (lambda: self._numpy_scores(probe)) if self._numpy is not None else None,
            "torch": lambda: self._torch_scores(probe),
        }
        self.runtime = self._choose_runtime(runtime, candidates, probe_calls)
        self._scores = {"numba": self._numba_scores, "numpy": self._numpy_scores, "torch": self._torch_scores}[self.runtime]
        if self.runtime != "torch":
            self.module = self._network = None  # the runtime holds the weights
        self._obs = np.zeros((1, self.obs_dim), np.float32)

    def _numba_scores(self, obs: np.ndarray) -> np.ndarray:
        assert self._numba is not None  # chosen (or probed) only with its layers
        x = obs
        for w, scale, b, act in self._numba:
            x = linear(x, w, scale, b, act, np.empty((len(x), len(w)), np.float32))
        return x

    def _numpy_scores(self, obs: np.ndarray) -> np.ndarray:
        assert self._numpy is not None  # chosen (or probed) only with its layers
        x = obs
        for w, b, act in self._numpy:
            x = x @ w.T + b
            if act:
                x = NUMPY_ACTIVATIONS[act](x)
        return x

    def _torch_scores(self, obs: np.ndarray) -> np.ndarray:
        device = _device(self._network)
        with torch.inference_mode():
            return self._network(torch.from_numpy(obs).to(device)).float().cpu().numpy()

    def _capacity(self) -> int:
        return len(self.positions)

    def _grow(self, slots: int) -> None:
        self.positions = _grow_rows(self.positions, slots)

    def reset(self, slot: int) -> None:
        self.positions[slot] = 0

    def state_bytes(self) -> int:
        return int(self.positions.itemsize)

    def runtime_bytes(self) -> int:
        layers = {"numba": self._numba, "numpy": self._numpy}.get(self.runtime) or []
        return sum(_array_bytes(*layer) for layer in layers)

    def step(self, rows: np.ndarray, slots: np.ndarray, ts_ns: np.ndarray, future: Future) -> list[Decision]:
        batch = len(slots)
        if len(self._obs) < batch:
            self._obs = np.zeros((batch, self.obs_dim), np.float32)
        obs = self._obs[:batch]
        obs[:, :-1] = rows
        obs[:, -1] = self.positions[slots]
        chosen = np.argmax(self._scores(obs), axis=1) - 1
        self.positions[slots] = chosen
        return [Decision(p) for p in chosen.tolist()]


# --------------------------------------------------------------------------------- mamba-2
class Mamba2Member(Member):
    """The Mamba-2 forecaster streaming its recurrent state (one slot of the pool per stream)."""

    def __init__(self, name: str, module, weights: str, metric: float | None, runtime: str, probe_calls: int) -> None:
        super().__init__(name, module, weights, metric)
        self.seq_len, self.horizon = int(module.seq_len), int(module.horizon)
        self.n_quantiles, self.median = int(module.n_quantiles), int(module.median_index)
        self.threshold = float(module.position_threshold)
        self.bars = np.zeros(1, np.int64)
        self._arrays: Mamba2Arrays | None
        try:
            self._arrays = mamba2_arrays(module, int8=weights == "int8")
        except UnsupportedModule:
            self._arrays = None
        self._model = int8_torch_copy(module) if weights == "int8" else module
        probe = np.zeros((1, int(module.input_dim)), np.float32)
        candidates = {
            "numba": (lambda: self._numba_probe(probe)) if self._arrays is not None else None,
            "torch": lambda: self._torch_probe(probe),
        }
        self.runtime = self._choose_runtime(runtime, candidates, probe_calls)
        if self.runtime == "numba":
            self.module = self._model = None  # the kernel's arrays hold the weights
            self.conv, self.ssm = self._kernel().zero_state(1)
        else:
            self._arrays = None
            self._state = self._model.allocate_inference_state(1)

    def _kernel(self) -> Mamba2Arrays:
        """The numba kernel's arrays (the runtime is numba, or is being probed)."""
        assert self._arrays is not None, self.runtime
        return self._arrays

    def _numba_forecasts(self, rows: np.ndarray, slots: np.ndarray, conv: np.ndarray, ssm: np.ndarray) -> np.ndarray:
        out = np.empty((len(slots), self.horizon, self.n_quantiles), np.float32)
        arrays = self._kernel()
        return mamba2_step(np.ascontiguousarray(rows, np.float32), slots, *arrays.weights, conv, ssm,  # type: ignore[call-arg]  # the weights' tuple fills the kernel's weight parameters
                           *arrays.dims, self.horizon, self.n_quantiles, self.median, out)  # fmt: skip

    def _numba_probe(self, rows: np.ndarray) -> np.ndarray:
        conv, ssm = self._kernel().zero_state(1)
        return self._numba_forecasts(rows, np.zeros(1, np.int64), conv, ssm)

    def _torch_forecasts(self, rows: np.ndarray, state):
        model = self._model
        device = _device(model)
        with torch.inference_mode():
            forecast, new = model.step(torch.from_numpy(np.ascontiguousarray(rows)).to(device), state)
        return forecast.float().cpu().numpy(), new

    def _torch_probe(self, rows: np.ndarray) -> np.ndarray:
        return self._torch_forecasts(rows, self._model.allocate_inference_state(1))[0]

    def _capacity(self) -> int:
        return len(self.bars)

    def _grow(self, slots: int) -> None:
        self.bars = _grow_rows(self.bars, slots)
        if self.runtime == "numba":
            self.conv, self.ssm = _grow_rows(self.conv, slots), _grow_rows(self.ssm, slots)
        else:
            self._state = [type(s)(conv=_grow_tensor(s.conv, slots), ssm=_grow_tensor(s.ssm, slots)) for s in self._state]

    def reset(self, slot: int) -> None:
        self.bars[slot] = 0
        if self.runtime == "numba":
            self.conv[slot] = 0
            self.ssm[slot] = 0
        else:
            for layer in self._state:
                layer.conv[slot] = 0
                layer.ssm[slot] = 0

    def state_bytes(self) -> int:
        if self.runtime == "numba":
            return int(self.conv[0].nbytes + self.ssm[0].nbytes + self.bars.itemsize)
        return int(sum(s.conv[0].nbytes + s.ssm[0].nbytes for s in self._state) + self.bars.itemsize)

    def runtime_bytes(self) -> int:
        return _array_bytes(*self._kernel().weights) if self.runtime == "numba" else 0

    def step(self, rows: np.ndarray, slots: np.ndarray, ts_ns: np.ndarray, future: Future) -> list[Decision]:
        if self.runtime == "numba":
            forecasts = self._numba_forecasts(rows, slots, self.conv, self.ssm)
        else:
            index = torch.from_numpy(slots)
            state = [type(s)(conv=s.conv[index], ssm=s.ssm[index]) for s in self._state]
            forecasts, new = self._torch_forecasts(rows, state)
            for pool, layer in zip(self._state, new):
                pool.conv[index], pool.ssm[index] = layer.conv, layer.ssm
        self.bars[slots] += 1
        ready = (self.bars[slots] >= self.seq_len).tolist()  # the batch path's first seq_len - 1 bars are flat
        signals = forecast_signal(forecasts, self.median).tolist()
        return [
            Decision(signal_position(s, self.threshold), f, s) if ok else Decision(0, f, None)
            for f, s, ok in zip(forecasts, signals, ready)
        ]


def _grow_tensor(tensor: torch.Tensor, slots: int) -> torch.Tensor:
    grown = tensor.new_zeros((slots, *tensor.shape[1:]))
    grown[: len(tensor)] = tensor
    return grown


# ------------------------------------------------------------------------ window members
class _WindowedMember(Member):
    """A forecaster member that keeps, per slot, a vector per bar of the last ``seq_len`` bars (a
    ring written twice, so a window is one slice): the TFT's encoder selections, any other
    forecaster's input rows."""

    def _init_ring(self, module, width: int) -> None:
        self.seq_len, self.horizon = int(module.seq_len), int(module.horizon)
        self.median, self.threshold = int(module.median_index), float(module.position_threshold)
        self.past = np.zeros((1, 2 * self.seq_len, width), np.float32)
        self.head = np.zeros(1, np.int64)  # per slot: where its next bar goes
        self.count = np.zeros(1, np.int64)  # per slot: bars since the reset

    def _capacity(self) -> int:
        return len(self.head)

    def _grow(self, slots: int) -> None:
        self.past, self.head, self.count = (_grow_rows(a, slots) for a in (self.past, self.head, self.count))

    def reset(self, slot: int) -> None:
        self.past[slot] = 0
        self.head[slot] = 0
        self.count[slot] = 0

    def state_bytes(self) -> int:
        return int(self.past[0].nbytes + self.head.itemsize + self.count.itemsize)

    def _push(self, slots: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append one bar's ``values`` to each slot's ring: the streams with ``seq_len`` bars
        (their positions in the batch) and their windows (n, seq_len, width), oldest bar first."""
        head = self.head[slots]
        self.past[slots, head] = values
        self.past[slots, head + self.seq_len] = values
        self.head[slots] = (head + 1) % self.seq_len
        self.count[slots] += 1
        ready = np.flatnonzero(self.count[slots] >= self.seq_len)
        start = (head[ready] + 1)[:, None] + np.arange(self.seq_len)
        return ready, self.past[slots[ready][:, None], start]

    def _decided(self, batch: int, ready: np.ndarray, forecasts: np.ndarray) -> list[Decision]:
        """The decisions of a batch: flat where a stream has fewer than ``seq_len`` bars."""
        decisions = [Decision(0)] * batch
        signals = forecast_signal(forecasts, self.median).tolist()
        for i, forecast, signal in zip(ready.tolist(), forecasts, signals):
            decisions[i] = Decision(signal_position(signal, self.threshold), forecast, signal)
        return decisions


# ------------------------------------------------------------------------------------- TFT
class TFTMember(_WindowedMember):
    """The Temporal Fusion Transformer, reusing the per-bar selections of the past bars of each
    stream and the shared selections of the future minutes already seen."""

    def __init__(self, name: str, module, weights: str, metric: float | None, groups: dict[str, list[int]],
                 runtime: str = "auto", probe_calls: int = 20, workdir: Path | None = None,
                 threads: int = 1) -> None:  # fmt: skip
        super().__init__(name, module, weights, metric)
        self.groups = {k: np.asarray(v) for k, v in groups.items()}
        self.width = int(module.encoder_lstm.hidden_size)
        self._init_ring(module, self.width)
        self._future: OrderedDict[int, np.ndarray] = OrderedDict()  # minute (UTC ns) -> its decoder selection
        self._encoded: OrderedDict[int, np.ndarray] = OrderedDict()  # minute (UTC ns) -> its known variables' encoder outputs
        self._contexts: dict[str, np.ndarray] | None = None  # the static contexts (one per asset)
        self._source = module  # what the static contexts are computed from (once, at the first bar)
        self._graphs = self._onnx_graphs(module, weights, workdir, threads)
        self._model = int8_torch_copy(module) if weights == "int8" else module
        empty = (np.zeros((1, self.seq_len, self.width), np.float32), np.zeros((1, self.horizon, self.width), np.float32))
        probe = _static_contexts(module, np.zeros(len(self.groups["static"]), np.float32))
        candidates = {
            "onnx": (lambda: self._fuse_onnx(probe, *empty)) if self._graphs is not None else None,
            "torch": lambda: self._fuse_torch(probe, *empty),
        }
        self.runtime = self._choose_runtime(runtime, candidates, probe_calls)
        if self.runtime == "onnx":
            self.module = self._model = None  # the graphs hold the weights
        else:
            self._graphs = None

    def _onnx_graphs(self, module, weights: str, workdir: Path | None, threads: int):
        if workdir is None:
            return None

        try:
            paths = export_tft(module, Path(workdir) / f"{self.name}-onnx", int8=weights == "int8")
            return {key: Graph.load(path, threads) for key, path in paths.items()}
        except Exception as exc:  # noqa: BLE001 (an exporter or session that cannot take this model: torch runs it)
            self.runtime_note = f"torch (no ONNX Runtime graph: {type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
            return None

    # -- the three computations, in either runtime ---------------------------------------
    def _fuse_onnx(self, contexts: dict[str, np.ndarray], past: np.ndarray, future: np.ndarray) -> np.ndarray:
        batch = len(past)
        return self._graphs["fuse"](past=past, future=future, enrichment=np.repeat(contexts["enrichment"], batch, axis=0),
                                    state_h=np.repeat(contexts["state_h"], batch, axis=1),
                                    state_c=np.repeat(contexts["state_c"], batch, axis=1))  # fmt: skip

    def _fuse_torch(self, contexts: dict[str, np.ndarray], past: np.ndarray, future: np.ndarray) -> np.ndarray:
        batch, t = len(past), _tensors(self._model)
        expanded = StaticContexts(None, None, t(np.repeat(contexts["enrichment"], batch, axis=0)),
                                  (t(np.repeat(contexts["state_h"], batch, axis=1)), t(np.repeat(contexts["state_c"], batch, axis=1))))  # fmt: skip
        with torch.inference_mode():
            return self._model.fuse(expanded, t(past), t(future))[0].float().cpu().numpy()

    def _select_past(self, rows: np.ndarray, ts_ns: np.ndarray, future: Future) -> np.ndarray:
        known = np.ascontiguousarray(rows[:, self.groups["known"]][:, None])
        observed = np.ascontiguousarray(rows[:, self.groups["observed"]][:, None])
        selection = np.repeat(self._static()["selection"], len(rows), axis=0)
        if self.runtime == "onnx":
            outputs = np.stack([self._known_outputs(known[i, 0], future, i, int(ts)) for i, ts in enumerate(ts_ns.tolist())])
            return self._graphs["select_past"](known=known, observed=observed, known_outputs=outputs[:, None],
                                               selection=selection)[:, 0]  # fmt: skip

        t = _tensors(self._model)
        with torch.inference_mode():
            selected = self._model.select_past(t(known), t(observed), StaticContexts(None, t(selection), None, None))[0]
        return selected[:, 0].float().cpu().numpy()

    def _static(self) -> dict[str, np.ndarray]:
        """The static contexts, computed at the first bar (step)."""
        assert self._contexts is not None
        return self._contexts

    def _known_outputs(self, known: np.ndarray, future: Future, i: int, ts_ns: int) -> np.ndarray:
        """(K, d): the encoder's outputs of the known variables of stream i's bar at ``ts_ns``,
        shared (the calendar is the asset's) and computed for the next FUTURE_BLOCK minutes at once."""
        cached = self._encoded.get(ts_ns)
        if cached is not None:
            return cached
        ahead = np.concatenate([known[None], future(i, FUTURE_BLOCK)])  # this minute, then the next ones
        minutes = [ts_ns + k * NS_PER_MINUTE for k in range(len(ahead))]
        for minute, row in zip(
            minutes, self._graphs["encode_known"](known=np.ascontiguousarray(ahead[:, None], np.float32))[:, 0]
        ):
            self._encoded[minute] = row
        while len(self._encoded) > FUTURE_CACHE_MINUTES:
            self._encoded.popitem(last=False)
        return self._encoded[ts_ns]

    def _select_future(self, calendar: np.ndarray) -> np.ndarray:
        """(M, 8) known rows of M minutes -> their decoder selections (M, d)."""
        known = np.ascontiguousarray(calendar[:, None], np.float32)
        selection = np.repeat(self._static()["selection"], len(calendar), axis=0)
        if self.runtime == "onnx":
            return self._graphs["select_future"](known=known, selection=selection)[:, 0]

        t = _tensors(self._model)
        with torch.inference_mode():
            selected = self._model.select_future(t(known), StaticContexts(None, t(selection), None, None))[0]
        return selected[:, 0].float().cpu().numpy()

    def runtime_bytes(self) -> int:
        graphs = sum(g.weight_bytes for g in (self._graphs or {}).values())
        shared = sum(v.nbytes for cache in (self._future, self._encoded) for v in cache.values())  # what every stream shares
        return int(graphs + shared)

    def step(self, rows: np.ndarray, slots: np.ndarray, ts_ns: np.ndarray, future: Future) -> list[Decision]:
        if self._contexts is None:  # static features: the asset's, the same in every row
            self._contexts = _static_contexts(self._source, rows[0][self.groups["static"]])
            self._source = None
        ready, past = self._push(slots, self._select_past(rows, ts_ns, future))
        if not len(ready):
            return [Decision(0)] * len(slots)
        future_rows = np.stack([self._future_selections(future, i, int(ts_ns[i])) for i in ready.tolist()])
        forecasts = (self._fuse_onnx if self.runtime == "onnx" else self._fuse_torch)(self._contexts, past, future_rows)
        return self._decided(len(slots), ready, forecasts)

    def _future_selections(self, future: Future, i: int, ts_ns: int) -> np.ndarray:
        """(horizon, d): the decoder selections of the minutes after stream i's bar, each computed
        once and shared (the known calendar is the asset's)."""
        minutes = [ts_ns + k * NS_PER_MINUTE for k in range(1, self.horizon + 1)]
        if any(m not in self._future for m in minutes):
            # the calendar is known ahead: the next FUTURE_BLOCK minutes too, in one call (the
            # decoder selection reads megabytes of weights: once per block, not once per bar)
            ahead = [ts_ns + k * NS_PER_MINUTE for k in range(1, self.horizon + FUTURE_BLOCK + 1)]
            calendar = future(i, len(ahead))  # rows of `ahead`
            missing = [k for k, m in enumerate(ahead) if m not in self._future]
            for k, row in zip(missing, self._select_future(calendar[missing])):
                self._future[ahead[k]] = row
            while len(self._future) > FUTURE_CACHE_MINUTES:
                self._future.popitem(last=False)
        return np.stack([self._future[m] for m in minutes])


# ------------------------------------------------------------------------ any forecaster
class WindowMember(_WindowedMember):
    """A forecaster run on its window as the batch path runs it: the last ``seq_len`` input rows
    of each stream (a ring per slot, written twice so a window is one slice) and the known
    calendar of the next ``horizon`` minutes, through the model's own ``forward`` (torch)."""

    def __init__(self, name: str, module, weights: str, metric: float | None, groups: dict[str, list[int]]) -> None:
        super().__init__(name, module, weights, metric)
        self.groups = {k: np.asarray(v) for k, v in groups.items()}
        self._init_ring(module, sum(len(v) for v in self.groups.values()))
        self._model = int8_torch_copy(module) if weights == "int8" else module
        self.runtime_note = "torch (the model's own forward on the window: the only runtime of this member)"

    def step(self, rows: np.ndarray, slots: np.ndarray, ts_ns: np.ndarray, future: Future) -> list[Decision]:
        ready, window = self._push(slots, rows)  # window: (n, seq_len, F)
        if not len(ready):
            return [Decision(0)] * len(slots)
        calendar = np.stack([future(i, self.horizon) for i in ready.tolist()]).astype(np.float32)
        t = _tensors(self._model)
        batch = {"static": t(rows[ready][:, self.groups["static"]]),
                 "known": t(np.concatenate([window[:, :, self.groups["known"]], calendar], axis=1)),
                 "observed": t(window[:, :, self.groups["observed"]])}  # fmt: skip
        with torch.inference_mode():
            forecasts = self._model(batch).float().cpu().numpy()
        return self._decided(len(slots), ready, forecasts)


def _device(module) -> torch.device:
    """Where a module's weights are (a dynamically quantized copy has no parameters: the CPU)."""
    first = next(iter(module.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


def _tensors(model):
    device = _device(model)
    return lambda array: torch.from_numpy(np.ascontiguousarray(array)).to(device)


def _static_contexts(model, static: np.ndarray) -> dict[str, np.ndarray]:
    """The TFT's static contexts of one asset's static features, as arrays."""
    device = _device(model)
    with torch.inference_mode():
        c = model.static_contexts(torch.from_numpy(np.ascontiguousarray(static, np.float32))[None].to(device))
    return {"selection": c.selection.float().cpu().numpy(), "enrichment": c.enrichment.float().cpu().numpy(),
            "state_h": c.state[0].float().cpu().numpy(), "state_c": c.state[1].float().cpu().numpy()}  # fmt: skip


class NoStreamingMember(ValueError):
    """A model that offers none of the streaming members' interfaces (:func:`stream_of`)."""


#: How a model streams, by what its class offers (:func:`stream_of`).
STREAMS = ("greedy", "recurrent", "tft", "window")


def stream_of(module) -> str:
    """How ``module`` streams one bar at a time, read from what its class offers: ``greedy`` (an
    agent's ``acting_network`` on the features and the position held), ``recurrent`` (a
    forecaster with ``allocate_inference_state`` and ``step``: Mamba-2), ``tft`` (the TFT's
    split forward: ``static_contexts``, ``select_past``, ``select_future``, ``fuse``, whose
    per-bar selections a stream reuses), else ``window`` (any forecaster's ``forward`` on the
    window). A module that is none of these (no ``median_index``) has no streaming member."""
    if hasattr(module, "acting_network"):
        return "greedy"
    if not hasattr(module, "median_index"):
        raise NoStreamingMember(f"{type(module).__name__}: neither an agent (acting_network) nor a forecaster (median_index)")
    if hasattr(module, "allocate_inference_state") and hasattr(module, "step"):
        return "recurrent"
    if all(hasattr(module, part) for part in ("static_contexts", "select_past", "select_future", "fuse")):
        return "tft"
    return "window"


def make_member(family: str, name: str, module, weights: str, metric_value: float | None, runtime: str,
                probe_calls: int, groups: dict[str, list[int]], workdir: Path | None = None,
                threads: int = 1) -> Member:  # fmt: skip
    """The streaming member of ``module`` (its fp32 model, of model family ``family``), chosen by
    :func:`stream_of`: agents and Mamba-2 with their runtime (``runtime``, probed
    ``probe_calls`` times when ``auto``), the TFT and the window forecasters with their feature
    ``groups`` (the TFT's ONNX graphs exported under ``workdir``; ``threads``: ONNX Runtime's
    threads); ``weights``: fp32 or int8."""
    stream = stream_of(module)
    if stream == "greedy":
        member: Member = AgentMember(name, family, module, weights, metric_value, runtime, probe_calls)
    elif stream == "recurrent":
        member = Mamba2Member(name, module, weights, metric_value, runtime, probe_calls)
    elif stream == "tft":
        member = TFTMember(name, module, weights, metric_value, groups, runtime, probe_calls, workdir, threads)
    else:
        member = WindowMember(name, module, weights, metric_value, groups)
    member.family = family
    return member
