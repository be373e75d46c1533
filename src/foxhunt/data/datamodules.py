"""Lightning datamodules over a :class:`~foxhunt.data.dataset.MarketDataset`.

* :class:`ForecastDataModule` serves sliding windows to the forecasters (Mamba-2, TFT). A
  window ending at bar ``i`` (inclusive) of a split holds

  - ``static``   (4,): static features of bar ``i``;
  - ``known``    (seq_len + horizon, 8): known (calendar) features of bars
    ``i - seq_len + 1 .. i`` (the past), then of the ``horizon`` clock minutes after bar ``i``
    (the future calendar, :func:`foxhunt.data.features.future_known_features`: known in
    advance, unlike the times of the bars that will actually come);
  - ``observed`` (seq_len, 4): observed features of bars ``i - seq_len + 1 .. i``;
  - ``target``   (horizon,): ``log(close[i + k] / close[i + k - 1]) / target_scale`` for
    ``k = 1 .. horizon``.

  A split of ``T`` bars has ``T - seq_len - horizon + 1`` training windows, ending at bars
  ``seq_len - 1 .. T - horizon - 1``; its *input* windows (no target: what a model reads to
  decide at a bar) end at every bar ``seq_len - 1 .. T - 1``. Windows are index arithmetic
  over per-split tensors; no window is copied until a batch is stacked.
* :class:`EnvDataModule` serves RL agents (DQN, PPO): it builds
  :class:`foxhunt.trading.env.TradingEnv` objects over a split, and its loaders yield dummy step
  indices only (the agent steps its env inside ``training_step``): ``steps_per_epoch`` items
  for training, one for validation and test (one greedy pass over the split).
"""

from __future__ import annotations

import math

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from foxhunt.data.dataset import MarketDataset
from foxhunt.data.features import future_known_features
from foxhunt.data.splits import SplitError
from foxhunt.trading.env import TradingEnv
from foxhunt.trading.pnl import entry_prices

EPOCH_SEED_STRIDE = 1_000_003  # an epoch's order is seeded seed * stride + epoch: distinct for every (seed, epoch) in use


def loader_generator(seed: int) -> torch.Generator:
    """A loader's own generator: a DataLoader draws its workers' base seed when it starts an
    epoch, from the global generator unless it has one; with its own it takes nothing from the
    global streams a resumed fit puts back (:mod:`foxhunt.training.resume_point`)."""
    generator = torch.Generator()
    generator.manual_seed(int(seed))
    return generator


class EpochShuffle(Sampler[int]):
    """Every index of ``size`` once per epoch, in an order drawn from ``(seed, epoch)`` alone
    (Lightning calls :meth:`set_epoch` as each epoch starts), so a resumed fit reads an epoch's
    windows in the order the fit never stopped read them; :meth:`skip_batches` starts the next
    pass after that many batches (a fit resumed in the middle of an epoch)."""

    def __init__(self, size: int, seed: int, batch_size: int) -> None:
        self.size, self.seed, self.batch_size = int(size), int(seed), int(batch_size)
        self.epoch = 0
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def skip_batches(self, batches: int) -> None:
        self._skip = int(batches)

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        generator = torch.Generator()
        generator.manual_seed(self.seed * EPOCH_SEED_STRIDE + self.epoch)
        order = torch.randperm(self.size, generator=generator)
        skip, self._skip = self._skip, 0
        return iter(order[skip * self.batch_size :].tolist())


def _batches_done_in_epoch(trainer, batches: int) -> int:
    """The batches the epoch a resumed fit restarts in had done (Lightning's restored loop
    counters; 0 for a fresh fit, or when the checkpoint was taken at the epoch's end)."""
    fit_loop = getattr(trainer, "fit_loop", None)
    if fit_loop is None or not fit_loop.restarting:
        return 0
    limit = trainer.limit_train_batches  # Lightning's rule for an epoch's length
    per_epoch = min(batches, limit) if isinstance(limit, int) else int(batches * limit)
    done = int(fit_loop.epoch_loop.batch_progress.current.processed)
    return done if done < per_epoch else 0


class WindowDataset(Dataset):
    """All forecast windows of one split, computed on access from whole-split tensors."""

    def __init__(
        self,
        static: Tensor,
        known: Tensor,
        future_known: Tensor,
        observed: Tensor,
        returns: Tensor,
        seq_len: int,
        horizon: int,
    ) -> None:
        self.static = static  # (T, S)
        self.known = known  # (T, K)
        self.future_known = future_known  # (T, horizon, K): the calendar of the minutes after each bar
        self.observed = observed  # (T, O)
        self.returns = returns  # (T,), returns[j] = scaled log(close[j] / close[j - 1])
        self.seq_len = seq_len
        self.horizon = horizon
        self.num_windows = max(len(returns) - seq_len - horizon + 1, 0)

    def __len__(self) -> int:
        return self.num_windows

    def last_bar(self, n: int) -> int:
        """Index in the split of the last (present) bar of window ``n``."""
        return self.seq_len - 1 + n

    def __getitem__(self, n: int) -> dict[str, Tensor]:
        if not -self.num_windows <= n < self.num_windows:
            raise IndexError(f"window {n}: out of range (split has {self.num_windows} windows)")
        i = self.last_bar(n % self.num_windows)
        start = i - self.seq_len + 1
        return {
            "static": self.static[i],
            "known": torch.cat([self.known[start : i + 1], self.future_known[i]]),
            "observed": self.observed[start : i + 1],
            "target": self.returns[i + 1 : i + self.horizon + 1],
        }

    def inputs(self, first: int, count: int) -> dict[str, Tensor]:
        """The inputs of the ``count`` windows ending at bars ``first .. first + count - 1``
        (``first >= seq_len - 1``), stacked: ``static``, ``known``, ``observed``, ``bar_index``."""
        start = first - (self.seq_len - 1)
        past = _sliding(self.known, self.seq_len)[start : start + count]
        return {
            "static": self.static[first : first + count],
            "known": torch.cat([past, self.future_known[first : first + count]], dim=1),
            "observed": _sliding(self.observed, self.seq_len)[start : start + count],
            "bar_index": torch.arange(first, first + count, dtype=torch.long),
        }

    def all_windows(self) -> dict[str, Tensor]:
        """Every training window stacked in order (with ``target``), plus ``bar_index``
        (LongTensor): the last bar of each window in the split."""
        n = self.num_windows
        last = self.seq_len - 1
        return {**self.inputs(last, n), "target": _sliding(self.returns[1:], self.horizon)[last : last + n]}

    def input_windows(self) -> dict[str, Tensor]:
        """The inputs of a window ending at every bar with ``seq_len`` bars of history."""
        last = self.seq_len - 1
        return self.inputs(last, max(len(self.returns) - last, 0))


def _sliding(x: Tensor, size: int) -> Tensor:
    """(T, ...) -> (T - size + 1, size, ...) windows along dim 0, as a view."""
    windows = x.unfold(0, size, 1)  # (T - size + 1, ..., size)
    return windows.movedim(-1, 1) if x.dim() > 1 else windows


class ForecastDataModule(LightningDataModule):
    """Sliding windows of a market dataset for the forecasters (see the module docstring).

    Args (the window's are ``model.window`` of the forecaster's config, which holds their defaults):
        dataset: the market dataset (features already normalized).
        seq_len: bars of history per window.
        horizon: future bars to forecast per window.
        batch_size: windows per training batch.
        eval_batch_size: windows per batch for validation, test and positions (no gradients,
            so larger batches run faster).
        seed: the training windows' order (:class:`EpochShuffle`) and the loaders' generators.
        num_workers: DataLoader worker processes (none: the windows are views of tensors in memory).
        pin_memory: DataLoader ``pin_memory`` (useful when training on CUDA).
    """

    def __init__(
        self,
        dataset: MarketDataset,
        seq_len: int,
        horizon: int,
        batch_size: int,
        eval_batch_size: int,
        *,
        seed: int,
        num_workers: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        self.seed = int(seed)
        for name, value, low in (
            ("seq_len", seq_len, 1),
            ("horizon", horizon, 1),
            ("batch_size", batch_size, 1),
            ("num_workers", num_workers, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"model.window.{name}={value!r}: must be an integer >= {low}")
        self.dataset = dataset
        self.seq_len = seq_len
        self.horizon = horizon
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        if isinstance(eval_batch_size, bool) or not isinstance(eval_batch_size, int) or eval_batch_size < 1:
            raise ValueError(f"model.window.eval_batch_size={eval_batch_size!r}: must be an integer >= 1")
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self._windows = {name: self._window_dataset(name) for name in dataset.splits}

    @property
    def group_dims(self) -> dict[str, int]:
        """Number of features per group: {"static": 4, "known": 8, "observed": 4}."""
        return {g: len(idx) for g, idx in self.dataset.groups.items()}

    def split_dataset(self, split: str) -> WindowDataset:
        if split not in self._windows:
            raise KeyError(f"split {split!r}: unknown (have {', '.join(self._windows)})")
        return self._windows[split]

    def windows(self, split: str) -> dict[str, Tensor]:
        """Every window of ``split`` in order (float32 tensors ``static`` (N, 4), ``known``
        (N, seq_len + horizon, 8), ``observed`` (N, seq_len, 4), ``target`` (N, horizon), as
        read-only strided views) plus ``bar_index`` (N,) LongTensor: the index in the split of
        each window's last bar, to align forecasts with ``dataset.splits[split].close``."""
        return self.split_dataset(split).all_windows()

    def input_windows(self, split: str) -> dict[str, Tensor]:
        """What a forecaster reads to decide at every bar of ``split`` with ``seq_len`` bars of
        history (``static``, ``known``, ``observed`` and ``bar_index``; no target, so the last
        ``horizon`` bars have theirs too)."""
        return self.split_dataset(split).input_windows()

    def train_dataloader(self) -> DataLoader:
        """The training windows in an order drawn from ``(seed, epoch)`` alone (:class:`EpochShuffle`);
        a fit resumed in the middle of an epoch starts after the batches that epoch had done."""
        dataset = self.split_dataset("train")
        order = EpochShuffle(len(dataset), self.seed, self.batch_size)
        order.skip_batches(_batches_done_in_epoch(getattr(self, "trainer", None), math.ceil(len(dataset) / self.batch_size)))
        return self._loader(dataset, self.batch_size, order)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.split_dataset("val"), self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.split_dataset("test"), self.eval_batch_size)

    def _loader(self, dataset: WindowDataset, batch_size: int, sampler: EpochShuffle | None = None) -> DataLoader:
        return DataLoader(
            dataset, batch_size=batch_size, sampler=sampler, num_workers=self.num_workers, pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0, generator=loader_generator(self.seed),
        )  # fmt: skip

    def _window_dataset(self, split: str) -> WindowDataset:
        arrays = self.dataset.split(split)
        bars = len(arrays)
        need = self.seq_len + self.horizon
        if bars < need:
            raise SplitError(
                f"model.window.seq_len + model.window.horizon = {self.seq_len} + {self.horizon} = {need} bars: "
                f"the {split} split has {bars}, not one window; shorten the window or use more bars"
            )
        features = torch.from_numpy(arrays.features).float()
        groups = self.dataset.groups
        if self.dataset.feature_config is None:
            raise ValueError("ForecastDataModule: the dataset has no feature_config (needed for the future calendar)")
        future_known = future_known_features(arrays.timestamps, self.horizon, self.dataset.asset, self.dataset.feature_config)
        # Targets: each bar's log return in the contract held over it (a roll bar's from its
        # entry price), what a position earns; never the jump between two contracts.
        close = torch.from_numpy(arrays.close).double()
        entry = torch.from_numpy(entry_prices(arrays.close, arrays.roll_price)).double()
        returns = torch.zeros(bars, dtype=torch.float64)
        returns[1:] = torch.log(close[1:] / entry) / self.dataset.target_scale
        return WindowDataset(
            static=features[:, groups["static"]],
            known=features[:, groups["known"]],
            future_known=torch.from_numpy(future_known),
            observed=features[:, groups["observed"]],
            returns=returns.float(),
            seq_len=self.seq_len,
            horizon=self.horizon,
        )


class StepIndexDataset(Dataset):
    """``length`` dummy items (the step number as a 0-d LongTensor) for agent loops."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, n: int) -> Tensor:
        if not 0 <= n < self.length:
            raise IndexError(f"step {n}: out of range ({self.length} steps)")
        return torch.tensor(n, dtype=torch.long)


class EnvDataModule(LightningDataModule):
    """Trading environments over a market dataset for the RL agents.

    Args:
        dataset: the market dataset.
        num_envs: parallel episodes of a training env (default of :meth:`make_env`).
        episode_len: steps per training episode.
        steps_per_epoch: items of the train loader (``training_step`` calls per epoch).
        commission_usd: commission per contract traded, USD (``execution.commission_usd``).
        slippage_ticks: slippage per contract traded, ticks (``execution.slippage_ticks``).
    """

    def __init__(
        self,
        dataset: MarketDataset,
        num_envs: int,
        episode_len: int,
        steps_per_epoch: int,
        commission_usd: float,
        slippage_ticks: float,
    ) -> None:
        super().__init__()
        for name, value in (
            ("num_envs", num_envs),
            ("episode_len", episode_len),
            ("steps_per_epoch", steps_per_epoch),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model.env.{name}={value!r}: must be an integer >= 1")
        for name, cost in (("commission_usd", commission_usd), ("slippage_ticks", slippage_ticks)):
            if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not cost >= 0:
                raise ValueError(f"execution.{name}={cost!r}: must be a number >= 0")
        train_bars = len(dataset.split("train"))
        if episode_len > train_bars - 1:
            raise SplitError(
                f"model.env.episode_len={episode_len}: exceeds the train split "
                f"({train_bars} bars, at most {train_bars - 1} steps)"
            )
        self.dataset = dataset
        self.num_envs = num_envs
        self.episode_len = episode_len
        self.steps_per_epoch = steps_per_epoch
        self.commission_usd = float(commission_usd)
        self.slippage_ticks = float(slippage_ticks)

    @property
    def observation_dim(self) -> int:
        """Features per bar plus the position column of the env observation."""
        return len(self.dataset.feature_names) + 1

    def split_tensors(self, split: str, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
        """(features (T, 16) float32, close (T,) float64) tensors of ``split``."""
        arrays = self.dataset.split(split)
        features = torch.from_numpy(arrays.features).to(device=device, dtype=torch.float32)
        close = torch.from_numpy(arrays.close).to(device=device, dtype=torch.float64)
        return features, close

    def make_env(
        self,
        split: str,
        num_envs: int | None = None,
        seed: int = 0,
        device: torch.device | str | None = None,
    ) -> TradingEnv:
        """A :class:`~foxhunt.trading.env.TradingEnv` of random episodes over ``split``
        (``num_envs`` defaults to the module's; ``device`` to CPU)."""
        features, close = self.split_tensors(split, device)
        return TradingEnv(
            features,
            close,
            self.dataset.asset,
            num_envs=self.num_envs if num_envs is None else num_envs,
            episode_len=self.episode_len,
            commission_usd=self.commission_usd,
            slippage_ticks=self.slippage_ticks,
            seed=seed,
            device=device,
            roll_price=self.dataset.split(split).roll_price,
        )

    def make_eval_env(self, split: str, device: torch.device | str | None = None) -> TradingEnv:
        """One env that walks ``split`` once from its first to its last bar (greedy passes)."""
        features, close = self.split_tensors(split, device)
        return TradingEnv.sequential(
            features,
            close,
            self.dataset.asset,
            commission_usd=self.commission_usd,
            slippage_ticks=self.slippage_ticks,
            device=device,
            roll_price=self.dataset.split(split).roll_price,
        )

    # The step-index loaders draw nothing (no shuffle, no workers); their own generator keeps even
    # the base seed a loader draws at each epoch off the global stream (loader_generator).
    def train_dataloader(self) -> DataLoader:
        return DataLoader(StepIndexDataset(self.steps_per_epoch), batch_size=None, generator=loader_generator(0))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(StepIndexDataset(1), batch_size=None, generator=loader_generator(0))

    def test_dataloader(self) -> DataLoader:
        return DataLoader(StepIndexDataset(1), batch_size=None, generator=loader_generator(0))
