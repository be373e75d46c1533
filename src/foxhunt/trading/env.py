"""Vectorized trading environment over one split's features and close prices.

:class:`TradingEnv` runs ``num_envs`` episodes side by side as torch tensors on one device (no
Python loop over environments), so a DQN or PPO agent steps thousands of episodes per call on
CPU or CUDA. It is written by hand rather than with ``gymnasium.vector`` because the vector API
steps one Python ``Env`` object per episode and moves numpy arrays through the host on every
step; here the whole batch is one tensor operation on the agent's device.
:class:`TradingGymEnv` wraps a one-episode stream in the standard ``gymnasium.Env`` API (numpy
in and out) for libraries such as Stable-Baselines3, and :func:`make_gym_vector_env` builds a
``gymnasium.vector.SyncVectorEnv`` of such wrappers.

Definitions:

* Actions: integers in ``{0: short, 1: flat, 2: long}``; the position taken is ``action - 1``.
* Observation at bar ``t`` (float32, ``observation_dim = F + 1``): columns ``0 .. F-1`` are the
  ``F`` features of bar ``t``; column ``F`` is the position currently held (-1, 0 or 1; 0 at the
  start of an episode).
* Step at bar ``t``: the agent moves from ``pos_old`` to ``pos_new``, pays the trading cost on the
  change and holds ``pos_new`` from the close of bar ``t`` to the close of bar ``t + 1``. Its
  ``pnl_usd`` and reward (in ticks) are :func:`foxhunt.trading.pnl.step_pnl`'s net PnL and
  :func:`~foxhunt.trading.pnl.in_ticks` of it, the formula written once in
  :mod:`foxhunt.trading.pnl` (the backtest's too): the move of the contract held (a roll bar's
  from its roll price, two contracts' costs), the raw contract prices, never the back-adjusted
  series the features read. No cost is charged for the position still open when an episode
  ends (as in the backtest, where the last position is ignored).
* Episodes: ``episode_len`` steps from a start bar drawn uniformly from
  ``0 .. T - 1 - episode_len`` (so every step has a next bar), flat at the start. The episode
  is ``truncated`` after ``episode_len`` steps; it is never ``terminated`` (no state of the
  market ends trading). With ``auto_reset`` (the default) a finished environment restarts at
  once at a new random bar: ``step`` returns the first observation of the new episode and
  ``info["final_obs"]`` holds the observation the finished episode ended on.
"""

from __future__ import annotations

import numbers
from typing import Any

import gymnasium
import numpy as np
import torch
from torch import Tensor

from foxhunt.assets import AssetSpec
from foxhunt.trading.pnl import check_costs, contract_costs, held_moves, in_ticks, roll_flags, step_pnl

NUM_ACTIONS = 3  # short, flat, long
ACTION_TO_POSITION_OFFSET = 1  # position = action - 1


def _as_tensor(name: str, value: Any, dtype: torch.dtype, device: torch.device) -> Tensor:
    try:
        return torch.as_tensor(value, dtype=dtype, device=device)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"TradingEnv {name}: cannot be read as a tensor ({err})") from None


def _is_integer(value: object) -> bool:
    """An integral number that is not a bool (numpy's integers too). Takes ``object``: typeshed's
    ``int`` is no ``numbers.Integral``, so the check on an ``int`` argument would read as
    unreachable to the type checker, and the rest of the function would go unchecked."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _first_bad_row(mask: Tensor) -> int:
    return int(torch.nonzero(mask.reshape(mask.shape[0], -1).any(dim=1))[0, 0])


class TradingEnv:
    """``num_envs`` trading episodes stepped together (see the module docstring for the maths).

    Args:
        features: (T, F) per-bar features of one split (float32 after conversion).
        close: (T,) raw close prices of the same bars (float64 after conversion).
        asset: the contract (multiplier and tick value turn price moves into USD and ticks).
        num_envs: parallel episodes N.
        episode_len: steps per episode; at most T - 1.
        commission_usd: commission per contract traded, USD.
        slippage_ticks: slippage per contract traded, ticks.
        seed: seed of the torch.Generator that draws episode start bars.
        device: where all state lives; default the device of ``features`` (CPU for arrays).
        auto_reset: restart finished episodes inside ``step`` (default). When False, stepping a
            finished episode raises until ``reset`` is called (used by :meth:`sequential`).
        roll_price: (T,) the new contract's entry price on each roll bar, NaN elsewhere; None
            when the series never rolls.

    Tensors returned by ``reset`` / ``step`` live on ``device``:
        obs (N, F + 1) float32; reward (N,) float32 in ticks; terminated, truncated (N,) bool;
        info: ``final_obs`` (N, F + 1): the observation each episode reached with this step,
        before any auto-reset (equal to ``obs`` where the episode did not end; use it as the
        next state of the transition), ``pnl_usd`` (N,) float64 (reward in USD),
        ``position`` (N,) int64 (the position taken at this step, the one that earned the
        reward), ``bar`` (N,) int64 (the bar the step started at).
    """

    num_actions: int = NUM_ACTIONS

    def __init__(
        self,
        features: Tensor,
        close: Tensor,
        asset: AssetSpec,
        num_envs: int,
        episode_len: int,
        commission_usd: float,
        slippage_ticks: float,
        seed: int,
        device: torch.device | str | None = None,
        auto_reset: bool = True,
        roll_price: Any = None,
    ) -> None:
        if device is None:
            device = features.device if isinstance(features, Tensor) else torch.device("cpu")
        self.device = torch.device(device)
        self.features = _as_tensor("features", features, torch.float32, self.device)
        close_t = _as_tensor("close", close, torch.float64, self.device)
        if self.features.dim() != 2:
            raise ValueError(f"TradingEnv features: expected shape (T, F), got {tuple(self.features.shape)}")
        if close_t.dim() != 1 or close_t.shape[0] != self.features.shape[0]:
            raise ValueError(
                f"TradingEnv close: expected shape ({self.features.shape[0]},) to match "
                f"features {tuple(self.features.shape)}, got {tuple(close_t.shape)}"
            )
        num_bars = int(close_t.shape[0])
        if num_bars < 2:
            raise ValueError(f"TradingEnv close: needs at least 2 bars, got {num_bars}")
        if not bool(torch.isfinite(close_t).all()):
            row = _first_bad_row(~torch.isfinite(close_t))
            raise ValueError(f"TradingEnv close[{row}]={close_t[row].item()}: must be finite")
        if not bool(torch.isfinite(self.features).all()):
            row = _first_bad_row(~torch.isfinite(self.features))
            raise ValueError(f"TradingEnv features row {row}: contains NaN or inf")
        if not _is_integer(num_envs) or num_envs < 1:
            raise ValueError(f"TradingEnv num_envs={num_envs!r}: must be an integer >= 1")
        if not _is_integer(episode_len) or not 1 <= episode_len <= num_bars - 1:
            raise ValueError(
                f"TradingEnv episode_len={episode_len!r}: must be an integer in "
                f"[1, {num_bars - 1}] (the split has {num_bars} bars)"
            )
        check_costs("TradingEnv", commission_usd, slippage_ticks)

        self.asset = asset
        self.num_envs = int(num_envs)
        self.episode_len = int(episode_len)
        self.num_bars = num_bars
        self.max_start = num_bars - 1 - self.episode_len
        self.auto_reset = auto_reset
        self.commission_usd = float(commission_usd)
        self.slippage_ticks = float(slippage_ticks)
        self.cost_per_contract_usd = contract_costs(asset, self.commission_usd, self.slippage_ticks).per_contract_usd
        # The move of the contract held from bar t to bar t + 1, for t = 0 .. T - 2, and 1.0 where
        # bar t + 1 is a roll bar (None: the series never rolls), as trading.pnl defines them.
        rolls = None if roll_price is None else _as_tensor("roll_price", roll_price, torch.float64, self.device)
        if rolls is not None and rolls.shape != close_t.shape:
            raise ValueError(f"TradingEnv roll_price: expected shape {tuple(close_t.shape)}, got {tuple(rolls.shape)}")
        close_np, rolls_np = close_t.cpu().numpy(), None if rolls is None else rolls.cpu().numpy()
        self._move = torch.as_tensor(held_moves(close_np, rolls_np), dtype=torch.float64, device=self.device)
        self._rolled = (
            None if rolls is None else torch.as_tensor(roll_flags(rolls_np, num_bars), dtype=torch.float64, device=self.device)
        )
        self._generator = torch.Generator(device="cpu")
        self._generator.manual_seed(int(seed))
        self._bar: Tensor | None = None  # (N,) current bar of each episode
        self._position: Tensor | None = None  # (N,) position held, -1/0/1
        self._steps: Tensor | None = None  # (N,) steps taken in the current episode

    @classmethod
    def sequential(
        cls,
        features: Tensor,
        close: Tensor,
        asset: AssetSpec,
        commission_usd: float,
        slippage_ticks: float,
        device: torch.device | str | None = None,
        roll_price: Any = None,
    ) -> TradingEnv:
        """One environment that walks the whole split once: bars 0 .. T - 2, T - 1 steps.

        Used to evaluate an agent: ``reset()``, then ``episode_len`` steps; the last step
        returns ``truncated`` True and the observation of bar T - 1; a further step raises.
        Collect ``info["position"]`` per step and append 0 for the last bar to get the (T,)
        positions the backtest takes.
        """
        num_bars = int(len(close))
        return cls(
            features,
            close,
            asset,
            num_envs=1,
            episode_len=num_bars - 1,
            commission_usd=commission_usd,
            slippage_ticks=slippage_ticks,
            seed=0,  # the only possible start is bar 0: the seed draws nothing that matters
            device=device,
            auto_reset=False,
            roll_price=roll_price,
        )

    @property
    def observation_dim(self) -> int:
        return int(self.features.shape[1]) + 1

    @property
    def position(self) -> Tensor:
        """(N,) int64 position held now (after the last step, or 0 after a reset)."""
        return self._episodes()[1]

    @property
    def bar(self) -> Tensor:
        """(N,) int64 index of the bar each episode observes now."""
        return self._episodes()[0]

    def reset(self, seed: int | None = None, starts: Tensor | None = None) -> Tensor:
        """Start all N episodes flat; returns obs (N, F + 1).

        ``seed`` re-seeds the start generator first; ``starts`` (N,) fixes the start bars
        instead of drawing them (each in ``0 .. max_start``).
        """
        if seed is not None:
            self._generator.manual_seed(int(seed))
        if starts is None:
            start_bars = self._draw_starts()
        else:
            start_bars = torch.as_tensor(starts, dtype=torch.int64, device=self.device)
            if start_bars.shape != (self.num_envs,):
                raise ValueError(f"TradingEnv.reset starts: expected shape ({self.num_envs},), got {tuple(start_bars.shape)}")
            if bool(((start_bars < 0) | (start_bars > self.max_start)).any()):
                raise ValueError(
                    f"TradingEnv.reset starts={start_bars.tolist()}: each must be in "
                    f"[0, {self.max_start}] so that {self.episode_len} steps fit"
                )
        self._bar = start_bars.clone()
        self._position = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self._steps = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        return self._observe()

    def state_dict(self) -> dict[str, Any]:
        """Where every episode stands and the start generator's state: with :meth:`load_state_dict`
        a resumed fit steps on exactly as the env never stopped (plain tensors: a checkpoint
        loads with ``torch.load(weights_only=True)``)."""
        episodes = {} if self._bar is None else dict(zip(("bar", "position", "steps"), self._episodes()))
        return {"generator": self._generator.get_state(), **{k: v.detach().cpu().clone() for k, v in episodes.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`state_dict` saved, checked against this env's bars and envs."""
        self._generator.set_state(state["generator"])
        if "bar" not in state:
            self._bar = self._position = self._steps = None
            return
        bar, position, steps = (state[k].to(device=self.device, dtype=torch.int64) for k in ("bar", "position", "steps"))
        if bar.shape != (self.num_envs,) or int(bar.min()) < 0 or int(bar.max()) >= self.num_bars - 1:
            raise ValueError(
                f"TradingEnv state: bars {tuple(bar.shape)} do not fit {self.num_envs} envs over {self.num_bars} bars"
            )
        self._bar, self._position, self._steps = bar, position, steps

    def step(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Tensor]]:
        """Apply one action per episode; returns (obs, reward, terminated, truncated, info)."""
        bar, position, steps = self._episodes()
        actions = torch.as_tensor(actions, device=self.device)
        if actions.shape != (self.num_envs,) or actions.is_floating_point() or actions.is_complex():
            raise ValueError(
                f"TradingEnv.step actions: expected an integer tensor of shape "
                f"({self.num_envs},), got {actions.dtype} {tuple(actions.shape)}"
            )
        lowest, highest = torch.aminmax(actions)  # one op: the step is a few microseconds an op
        if int(lowest) < 0 or int(highest) >= NUM_ACTIONS:
            raise ValueError(
                f"TradingEnv.step actions: each must be 0 (short), 1 (flat) or 2 (long), got {actions.unique().tolist()}"
            )
        if not self.auto_reset and bool((steps >= self.episode_len).any()):
            raise RuntimeError("TradingEnv.step: the episode has ended (auto_reset is off); call reset()")

        new_position = actions.to(torch.int64) - ACTION_TO_POSITION_OFFSET
        rolled = None if self._rolled is None else self._rolled[bar]
        pnl_usd = step_pnl(new_position.to(torch.float64), position.to(torch.float64), self._move[bar], rolled,
                           self.asset.multiplier, self.cost_per_contract_usd).net  # fmt: skip
        reward = in_ticks(pnl_usd, self.asset.tick_value).to(torch.float32)

        self._position = new_position
        self._bar = bar + 1
        self._steps = steps + 1
        truncated = self._steps >= self.episode_len
        terminated = torch.zeros_like(truncated)
        final_obs = self._observe()
        if self.auto_reset and bool(truncated.any()):
            self._reset_where(truncated)
            obs = self._observe()
        else:
            obs = final_obs.clone()
        info = {"final_obs": final_obs, "pnl_usd": pnl_usd, "position": new_position, "bar": bar}
        return obs, reward, terminated, truncated, info

    def _episodes(self) -> tuple[Tensor, Tensor, Tensor]:
        """(bar, position, steps) of the N episodes; RuntimeError before the first reset."""
        if self._bar is None or self._position is None or self._steps is None:
            raise RuntimeError("TradingEnv: call reset() before step() or reading the state")
        return self._bar, self._position, self._steps

    def _draw_starts(self) -> Tensor:
        # Drawn on a CPU generator so that a seed gives the same episodes on every device.
        starts = torch.randint(0, self.max_start + 1, (self.num_envs,), generator=self._generator, dtype=torch.int64)
        return starts.to(self.device)

    def _reset_where(self, done: Tensor) -> None:
        bar, position, steps = self._episodes()
        self._bar = torch.where(done, self._draw_starts(), bar)
        self._position = torch.where(done, torch.zeros_like(position), position)
        self._steps = torch.where(done, torch.zeros_like(steps), steps)

    def _observe(self) -> Tensor:
        bar, position, _ = self._episodes()
        return torch.cat([self.features[bar], position.to(torch.float32).unsqueeze(1)], dim=1)


class TradingGymEnv(gymnasium.Env):
    """The standard ``gymnasium.Env`` API over a :class:`TradingEnv` with ``num_envs=1``.

    Observations are float32 numpy vectors of length ``F + 1`` (features, then position) in a
    ``Box`` bounded by the per-column minimum and maximum of the split's features and [-1, 1]
    for the position; actions are ``Discrete(3)``. ``step`` returns the observation the step
    reached (gymnasium users call ``reset`` after ``truncated``); ``reset(seed=...)`` re-seeds
    the start bars. ``info`` carries ``pnl_usd`` (float) and ``position`` (int).
    """

    metadata = {"render_modes": []}

    def __init__(self, env: TradingEnv) -> None:
        super().__init__()
        if env.num_envs != 1:
            raise ValueError(f"TradingGymEnv env.num_envs={env.num_envs}: must be 1")
        self.env = env
        low = env.features.min(dim=0).values.cpu().numpy()
        high = env.features.max(dim=0).values.cpu().numpy()
        # A constant column (static asset features) would give low == high, which gymnasium
        # flags; widen it by one float32 step so the space stays a proper box.
        high = np.where(high > low, high, np.nextafter(high, np.float32(np.inf)))
        low = np.append(low, np.float32(-1)).astype(np.float32)
        high = np.append(high, np.float32(1)).astype(np.float32)
        self.observation_space = gymnasium.spaces.Box(low=low, high=high, dtype=np.float32)
        self.action_space = gymnasium.spaces.Discrete(NUM_ACTIONS)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        obs = self.env.reset(seed=seed)
        return self._to_numpy(obs), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        actions = torch.as_tensor([int(action)], dtype=torch.int64, device=self.env.device)
        _, reward, terminated, truncated, info = self.env.step(actions)
        step_info = {
            "pnl_usd": float(info["pnl_usd"][0]),
            "position": int(info["position"][0]),
        }
        return (
            self._to_numpy(info["final_obs"]),
            float(reward[0]),
            bool(terminated[0]),
            bool(truncated[0]),
            step_info,
        )

    @staticmethod
    def _to_numpy(obs: Tensor) -> np.ndarray:
        return obs[0].detach().cpu().numpy().astype(np.float32, copy=True)


def make_gym_vector_env(
    features: Tensor,
    close: Tensor,
    asset: AssetSpec,
    num_envs: int,
    episode_len: int,
    commission_usd: float,
    slippage_ticks: float,
    seed: int,
) -> gymnasium.vector.SyncVectorEnv:
    """``num_envs`` :class:`TradingGymEnv` in a ``gymnasium.vector.SyncVectorEnv`` (CPU).

    Environment ``i`` draws its start bars with seed ``seed + i``; the features and prices are
    shared, not copied.
    """
    features_t = torch.as_tensor(features, dtype=torch.float32, device="cpu")
    close_t = torch.as_tensor(close, dtype=torch.float64, device="cpu")

    def factory(index: int):
        def build() -> TradingGymEnv:
            return TradingGymEnv(
                TradingEnv(
                    features_t,
                    close_t,
                    asset,
                    num_envs=1,
                    episode_len=episode_len,
                    commission_usd=commission_usd,
                    slippage_ticks=slippage_ticks,
                    seed=seed + index,
                )
            )

        return build

    return gymnasium.vector.SyncVectorEnv([factory(i) for i in range(num_envs)])
