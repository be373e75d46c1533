"""One fleet member: a trained model that decides on one new bar at a time.

A member keeps what its model needs between bars and turns each bar into a :class:`Decision`
(the position it holds from this bar to the next; forecasters also their quantile forecast),
the same decisions the model's batch path (``trading_positions``) makes over a split:

- :class:`AgentMember` (DQN, PPO): the greedy action of the acting network on the bar's
  features and the position held, as the greedy walk;
- :class:`Mamba2Member`: advances the recurrent state by one ``step`` per bar (the model
  trades as it streams, :mod:`foxhunt.models.mamba2`);
- :class:`TFTMember`: keeps the per-bar encoder selections of the last ``seq_len`` bars and
  the decoder selections of the future minutes it has already seen (both position-wise, so
  equal in every window that holds them): a new bar computes one encoder selection and one
  new future minute, then the LSTM encoder-decoder, attention and heads of the window.

Forecasters decide once ``seq_len`` bars have arrived since the last :meth:`Member.reset`
(flat before), as the batch path, whose first ``seq_len - 1`` bars of a split are flat.

Agents run in numpy or torch, Mamba-2 in numpy, numba or torch (:mod:`foxhunt.ensemble.runtimes`);
with ``runtime=auto`` the member times each on its own inputs when it is built and keeps the
fastest, saying so in :attr:`Member.runtime_note`. The TFT runs in torch.
"""

from __future__ import annotations

import copy
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from foxhunt.ensemble.runtimes import (
    NumbaMamba2,
    NumpyMamba2,
    NumpyMLP,
    UnsupportedModule,
)

RUNTIMES = ("auto", "numpy", "numba", "torch")
NS_PER_MINUTE = 60_000_000_000


@dataclass(frozen=True)
class Decision:
    """A member's answer to one bar: ``position`` in {-1, 0, 1} held from this bar to the next;
    for forecasters ``forecast`` (horizon, Q) in target-scale units and ``signal``, the median
    forecast summed over the horizon (what the position is the thresholded sign of)."""

    position: int
    forecast: np.ndarray | None = None
    signal: float | None = None


@dataclass(frozen=True)
class BarInputs:
    """What the engine hands every member for one bar: the model's input row (float32, the
    16 features normalized with the member's statistics), the bar's start (UTC ns) and the
    calendar of future minutes (``future(horizon) -> (horizon, 8)`` float32)."""

    row: np.ndarray
    ts_ns: int
    future: Callable[[int], np.ndarray]


def _median_p50_us(call: Callable[[], Any], calls: int) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - started)
    return float(np.median(times)) / 1e3


class Member(ABC):
    """A trained model in the fleet (see the module doc).

    ``name``: its registered name; ``family``: dqn | ppo | mamba2 | tft; ``module``: the model
    in eval mode; ``weights``: fp32 or int8 (an int8 inference copy); ``metric``: its value of
    the selection metric (the weighted rule reads it).
    """

    family: str = ""

    def __init__(self, name: str, module: torch.nn.Module, weights: str, metric: float | None) -> None:
        self.name = name
        self.module = module.eval()
        self.weights = weights
        self.metric = metric
        self.runtime = "torch"
        self.runtime_note = "torch (the only runtime of this member)"

    @abstractmethod
    def reset(self) -> None:
        """Forget every bar: the next bar starts a new stream (flat, empty history, zero state)."""

    def state_bytes(self) -> int:
        """Bytes of what the member keeps between bars (its streaming state), now."""
        return 0

    def runtime_bytes(self) -> int:
        """Bytes of the weights its numpy / numba runtime holds beside the module (0 in torch)."""
        return 0

    def fork(self) -> "Member":
        """Another stream of the same member: the weights shared, a state of its own (fresh)."""
        twin = copy.copy(self)
        twin.reset()
        return twin

    @abstractmethod
    def step(self, bar: BarInputs) -> Decision:
        """The decision on one new bar."""

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
            self.runtime_note = f"torch (no {requested} runtime for this member)"
            return "torch"
        if len(usable) == 1:
            (only,) = usable
            self.runtime_note = f"{only} (the only runtime for these weights)"
            return only
        times = {name: _median_p50_us(call, probe_calls) for name, call in usable.items()}
        choice = min(times, key=times.get)
        measured = ", ".join(f"{name} {us:.1f} us" for name, us in times.items())
        self.runtime_note = f"{choice} (auto: median of {probe_calls} timed calls at load: {measured})"
        return choice


def _array_bytes(obj: Any, _seen: set[int] | None = None) -> int:
    """Bytes of the numpy arrays a runtime object holds (its attributes, lists, tuples, dicts), each once."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(_array_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_array_bytes(v, seen) for v in obj)
    if type(obj).__module__.startswith("foxhunt.ensemble.runtimes"):  # a runtime's own attributes
        return sum(_array_bytes(v, seen) for v in vars(obj).values())
    return 0


def forecaster_position(signal: float, threshold: float) -> int:
    """The forecasters' rule (``ForecasterModule.positions_from_forecasts``) for one forecast."""
    if abs(signal) > threshold:
        return 1 if signal > 0 else -1
    return 0


class AgentMember(Member):
    """A DQN or PPO agent acting greedily on the features and the position it holds."""

    def __init__(self, name: str, family: str, module, weights: str, metric: float | None, runtime: str,
                 probe_calls: int) -> None:  # fmt: skip
        super().__init__(name, module, weights, metric)
        self.family = family
        self.position = 0
        network = module.acting_network
        obs = np.zeros(module.obs_dim, np.float32)
        try:
            numpy_net = NumpyMLP(network)
        except UnsupportedModule:
            numpy_net = None
        tensor = torch.zeros(1, module.obs_dim)

        def torch_scores(x: np.ndarray) -> np.ndarray:
            tensor[0] = torch.from_numpy(x)
            with torch.inference_mode():
                return network(tensor.to(module.device))[0].float().cpu().numpy()

        self._torch = torch_scores
        numpy_call = (lambda: numpy_net(obs)) if numpy_net is not None else None
        self.runtime = self._choose_runtime(runtime, {"numpy": numpy_call, "torch": lambda: torch_scores(obs)}, probe_calls)
        self._scores = numpy_net if self.runtime == "numpy" else torch_scores
        self.reset()

    def reset(self) -> None:
        self.position = 0
        self._obs = np.zeros(self.module.obs_dim, np.float32)

    def state_bytes(self) -> int:
        return int(self._obs.nbytes)

    def runtime_bytes(self) -> int:
        return _array_bytes(self._scores) if self.runtime == "numpy" else 0

    def step(self, bar: BarInputs) -> Decision:
        self._obs[:-1] = bar.row
        self._obs[-1] = self.position
        self.position = int(np.argmax(self._scores(self._obs))) - 1
        return Decision(self.position)


class Mamba2Member(Member):
    """The Mamba-2 forecaster streaming its recurrent state."""

    family = "mamba2"

    def __init__(self, name: str, module, weights: str, metric: float | None, runtime: str, probe_calls: int) -> None:
        super().__init__(name, module, weights, metric)
        self.seq_len = int(module.seq_len)
        self.threshold = float(module.position_threshold)
        self.bars = 0
        runtimes = {"numpy": NumpyMamba2, "numba": NumbaMamba2}
        self._steppers: dict[str, Any] = {}
        candidates: dict[str, Callable[[], Any] | None] = {}
        x = np.zeros(module.input_dim, np.float32)
        for name, kind in runtimes.items():
            try:
                stepper, probe = kind(module), kind(module)
            except (UnsupportedModule, ImportError):
                candidates[name] = None
                continue
            self._steppers[name] = stepper
            candidates[name] = lambda probe=probe: probe.step(x)
        self._state = module.allocate_inference_state(1)
        candidates["torch"] = lambda: self._torch_step(x, keep=False)
        self.runtime = self._choose_runtime(runtime, candidates, probe_calls)
        self._steppers = {name: s for name, s in self._steppers.items() if name == self.runtime}
        self.reset()

    def _torch_step(self, row: np.ndarray, keep: bool = True) -> np.ndarray:
        with torch.inference_mode():
            forecast, state = self.module.step(torch.from_numpy(row)[None].to(self.module.device), self._state)
        if keep:
            self._state = state
        return forecast[0].float().cpu().numpy()

    def state_bytes(self) -> int:
        if self._stepper is not None:
            return _array_bytes(self._stepper.state)
        from foxhunt.memory.accounting import tensor_bytes

        return tensor_bytes(list(self._state))

    def runtime_bytes(self) -> int:
        if self._stepper is None:
            return 0
        return _array_bytes(self._stepper) - _array_bytes(self._stepper.state)

    def fork(self) -> "Mamba2Member":
        twin = copy.copy(self)
        twin._steppers = {name: copy.copy(stepper) for name, stepper in self._steppers.items()}
        twin.reset()
        return twin

    def reset(self) -> None:
        self.bars = 0
        self._state = self.module.allocate_inference_state(1)
        for stepper in self._steppers.values():
            stepper.reset()
        self._stepper = self._steppers.get(self.runtime)

    def step(self, bar: BarInputs) -> Decision:
        forecast = self._stepper.step(bar.row) if self._stepper is not None else self._torch_step(bar.row)
        self.bars += 1
        if self.bars < self.seq_len:  # the batch path's first seq_len - 1 bars are flat
            return Decision(0, forecast, None)
        signal = float(forecast[:, self.module.median_index].sum())
        return Decision(forecaster_position(signal, self.threshold), forecast, signal)


class TFTMember(Member):
    """The Temporal Fusion Transformer, reusing the per-bar selections of the past bars and of
    the future minutes already seen."""

    family = "tft"

    def __init__(self, name: str, module, weights: str, metric: float | None, groups: dict[str, list[int]]) -> None:
        super().__init__(name, module, weights, metric)
        self.seq_len, self.horizon = int(module.seq_len), int(module.horizon)
        self.threshold = float(module.position_threshold)
        self.groups = groups
        self.device = next(module.parameters()).device
        self.reset()

    def reset(self) -> None:
        self._contexts = None
        self._past: deque[torch.Tensor] = deque(maxlen=self.seq_len)
        self._future: dict[int, torch.Tensor] = {}  # minute start (UTC ns) -> its decoder selection

    def state_bytes(self) -> int:
        from foxhunt.memory.accounting import tensor_bytes

        kept = [*self._past, *self._future.values()]
        if self._contexts is not None:
            kept += [self._contexts.selection, self._contexts.enrichment, *self._contexts.state]
        return tensor_bytes(kept)

    @torch.inference_mode()
    def step(self, bar: BarInputs) -> Decision:
        model = self.module
        row = torch.from_numpy(bar.row).to(self.device)
        if self._contexts is None:  # static features: one per asset, the same on every bar
            self._contexts = model.static_contexts(row[self.groups["static"]][None])
        known = row[self.groups["known"]][None, None]
        observed = row[self.groups["observed"]][None, None]
        self._past.append(model.select_past(known, observed, self._contexts)[0])
        minutes = [bar.ts_ns + k * NS_PER_MINUTE for k in range(1, self.horizon + 1)]
        for stale in [m for m in self._future if m <= bar.ts_ns]:
            del self._future[stale]
        missing = [m for m in minutes if m not in self._future]
        if missing:
            calendar = torch.from_numpy(bar.future(self.horizon)).to(self.device)  # rows of `minutes`
            rows = calendar[[minutes.index(m) for m in missing]][None]
            selected = model.select_future(rows, self._contexts)[0]
            for k, minute in enumerate(missing):
                self._future[minute] = selected[:, k : k + 1]
        if len(self._past) < self.seq_len:
            return Decision(0)
        past = torch.cat(list(self._past), dim=1)
        future = torch.cat([self._future[m] for m in minutes], dim=1)
        forecast = model.fuse(self._contexts, past, future)[0][0].float().cpu().numpy()
        signal = float(forecast[:, model.median_index].sum())
        return Decision(forecaster_position(signal, self.threshold), forecast, signal)


AGENTS = ("dqn", "ppo")


def make_member(family: str, name: str, module, weights: str, metric_value: float | None, runtime: str,
                probe_calls: int, groups: dict[str, list[int]]) -> Member | None:  # fmt: skip
    """The streaming member of a model family around ``module`` (``None`` for a family that has
    none): agents and Mamba-2 with their batch-1 runtime (``runtime``, probed ``probe_calls``
    times when ``auto``), the TFT with its feature ``groups``."""
    if family in AGENTS:
        return AgentMember(name, family, module, weights, metric_value, runtime, probe_calls)
    if family == "mamba2":
        return Mamba2Member(name, module, weights, metric_value, runtime, probe_calls)
    if family == "tft":
        return TFTMember(name, module, weights, metric_value, groups)
    return None
