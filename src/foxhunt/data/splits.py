"""Chronological train / val / test split of a bar series, with a gap between splits, and the
lockbox at its end.

Market data is a time series: a random split would let the model see the future of its
validation bars. The splits are consecutive blocks in time order, and ``gap_bars`` bars are
dropped between train and val and between val and test.

Sizes: ``usable = n_bars - 2 * gap_bars``; train gets ``floor(usable * train)`` bars,
val ``floor(usable * val)`` and test the rest, so the blocks cover every usable bar.

**Walk-forward** (:class:`WalkForwardConfig`, one fold of it: :class:`FoldSplit`): the end of
the series is tiled by ``folds`` segments, one per fold, each ``[purge][val][purge][test]``:
``floor(n_bars * val)`` validation bars and ``floor(n_bars * test)`` test bars, purged on both
sides. Fold k trains on the bars before its segment: from the first bar (``window:
expanding``, at least ``floor(n_bars * train)`` bars) or the last ``floor(n_bars * train)``
(``rolling``)::

    fold 0: [train ..........][p][val 0][p][test 0]
    fold 1: [train ...............................][p][val 1][p][test 1]
    fold 2: [train ..................................................][p][val 2][p][test 2]

so a fold selects (its checkpoint, and the cell's ``val/`` figures that sweeps, searches and
``foxhunt ensemble register`` select on) only on its own validation block, which comes after
its training window and before its test block and is disjoint from every test block of the cell.
A later fold trains on the earlier folds' test blocks: fitting on them is no selection, and every
bar a fold reports as test is one its selection never saw.

**Purge: the labels' reach.** Labels are computed inside their split (a forecaster's windows
and an agent's episodes end within it), and ``purge_bars`` (``gap_bars`` for a single split)
keeps the last labels of a training window that many bars from the first bar a validation or
test block scores. Each family's labels reach ahead: a forecaster ``model.window.horizon`` bars,
PPO ``model.module.rollout_steps`` (its advantages sum a rollout's rewards), DQN one bar (a
one-step target); the config schema refuses a purge shorter than the family's reach. There is
no embargo: consecutive test blocks are a validation block and two purges apart, more than the
features' trailing windows, so no two folds score a bar whose inputs overlap.

**The lockbox** (``evaluation.holdout``, :class:`Holdout`): the last ``floor(n_bars * holdout)``
bars, after a gap of the split's ``gap_bars`` (``purge_bars``), are cut off before anything
else: the splits and folds above are laid out over the bars before it, and no training,
selection, sweep or search ever reads it. Only an opened split (``open_holdout``: ``foxhunt
ensemble register --holdout``, once, recorded) holds it, as the split ``holdout``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from foxhunt.config.sections import dataclass_values
from foxhunt.errors import UserError

SPLIT_NAMES = ("train", "val", "test")
HOLDOUT = "holdout"  # the lockbox's split, present only in an opened split
FRACTION_SUM_TOLERANCE = 1e-6  # float slack when checking that the fractions sum to 1


def _check_holdout(holdout: Any) -> None:
    ok = isinstance(holdout, (int, float)) and not isinstance(holdout, bool) and math.isfinite(holdout)
    if not (ok and 0 <= holdout < 1):
        raise ValueError(f"evaluation.holdout={holdout!r}: must be a fraction of the bars in [0, 1) (or null: none)")


@dataclass(frozen=True)
class SplitConfig:
    """Tunables of the split (Hydra node ``data.split``): fractions of the usable bars and
    the number of bars dropped between consecutive splits."""

    train: float  # fraction of the usable bars (after warm-up, the lockbox and gaps)
    val: float
    test: float
    gap_bars: int
    holdout: float = 0.0  # the lockbox: the last fraction of the bars (module doc)
    open_holdout: bool = False  # hold the lockbox as split "holdout" (only a recorded report opens it)

    def __post_init__(self) -> None:
        _check_holdout(self.holdout)
        for name in SPLIT_NAMES:
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (ok and math.isfinite(value) and 0 < value < 1):
                raise ValueError(f"split.{name}={value!r}: must be a number in (0, 1)")
        total = self.train + self.val + self.test
        if abs(total - 1.0) > FRACTION_SUM_TOLERANCE:
            raise ValueError(f"split.train + split.val + split.test = {total:g}: must sum to 1")
        gap = self.gap_bars
        if isinstance(gap, bool) or not isinstance(gap, int) or gap < 0:
            raise ValueError(f"split.gap_bars={gap!r}: must be an integer >= 0")

    def fraction(self, split: str) -> float:
        return getattr(self, split)

    @classmethod
    def from_config(cls, cfg: Any) -> SplitConfig:
        """Build from a SplitConfig, a dataclass, a mapping or an OmegaConf DictConfig."""
        return cfg if isinstance(cfg, cls) else cls(**dataclass_values(cls, cfg, "split"))


WINDOWS = ("expanding", "rolling")


class SplitError(UserError, ValueError):
    """Split or fold settings the bars cannot hold, found when the bars are read (one line
    naming the keys and the bars there are)."""

    kind = "data"


@dataclass(frozen=True)
class WalkForwardConfig:
    """Tunables of a walk-forward (Hydra node ``evaluation.walk_forward``; module doc)."""

    folds: int
    window: str  # expanding | rolling
    train: float  # fraction of the bars: rolling window / first expanding window
    val: float
    test: float
    purge_bars: int

    def __post_init__(self) -> None:
        key = "evaluation.walk_forward"
        if isinstance(self.folds, bool) or not isinstance(self.folds, int) or self.folds < 1:
            raise ValueError(f"{key}.folds={self.folds!r}: must be an integer >= 1")
        if self.window not in WINDOWS:
            raise ValueError(f"{key}.window={self.window!r}: must be one of {', '.join(WINDOWS)}")
        for name in ("train", "val", "test"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
                raise ValueError(f"{key}.{name}={value!r}: must be a fraction of the bars in (0, 1)")
        value = self.purge_bars
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{key}.purge_bars={value!r}: must be an integer >= 0")
        total = self.train + self.folds * (self.val + self.test)
        if total > 1:
            raise ValueError(
                f"{key}: train + folds x (val + test) = {self.train:g} + {self.folds} x ({self.val:g} + {self.test:g})"
                f" = {total:g} of the bars: must be <= 1"
            )

    @classmethod
    def from_config(cls, cfg: Any) -> WalkForwardConfig:
        return cfg if isinstance(cfg, cls) else cls(**dataclass_values(cls, cfg, "evaluation.walk_forward"))

    def fold_slices(self, n_bars: int) -> list[dict[str, slice]]:
        """Row slices ``{"train", "val", "test"}`` of every fold of ``n_bars`` bars, in order
        (module doc). Raises :class:`SplitError` naming the keys when the bars do not hold every fold."""
        n_train, n_val, n_test = (math.floor(n_bars * f) for f in (self.train, self.val, self.test))
        purge = self.purge_bars
        segment = 2 * purge + n_val + n_test  # one fold's [purge][val][purge][test]
        needed = n_train + self.folds * segment
        if min(n_train, n_val, n_test) < 1 or needed > n_bars:
            raise SplitError(
                f"evaluation.walk_forward: {self.folds} folds need {needed} bars (train {n_train} + {self.folds} x "
                f"(val {n_val} + test {n_test} + 2 x purge_bars {purge})), the data has {n_bars} after warm-up"
                " (and the lockbox); use fewer folds, smaller fractions or more bars"
            )
        folds = []
        for k in range(self.folds):
            train_stop = n_bars - (self.folds - k) * segment
            val_start = train_stop + purge
            test_start = val_start + n_val + purge
            train_start = 0 if self.window == "expanding" else train_stop - n_train
            folds.append(
                {
                    "train": slice(train_start, train_stop),
                    "val": slice(val_start, val_start + n_val),
                    "test": slice(test_start, test_start + n_test),
                }
            )
        return folds


@dataclass(frozen=True)
class FoldSplit:
    """Fold ``fold`` of a walk-forward: what the dataset builder takes in place of a
    :class:`SplitConfig` (and what its cache key holds)."""

    walk_forward: WalkForwardConfig
    fold: int
    holdout: float = 0.0  # the lockbox (module doc)
    open_holdout: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.fold < self.walk_forward.folds:
            raise ValueError(f"evaluation.fold={self.fold!r}: must be in 0..{self.walk_forward.folds - 1}")
        _check_holdout(self.holdout)

    @property
    def gap_bars(self) -> int:
        """The bars dropped before the lockbox: the purge."""
        return self.walk_forward.purge_bars

    def slices(self, n_bars: int) -> dict[str, slice]:
        return self.walk_forward.fold_slices(n_bars)[self.fold]


def as_split(cfg: Any) -> FoldSplit | SplitConfig:
    """A :class:`FoldSplit` as it is, anything else as a :class:`SplitConfig`."""
    return cfg if isinstance(cfg, FoldSplit) else SplitConfig.from_config(cfg)


def split_slices(n_bars: int, cfg: Any) -> dict[str, slice]:
    """Row slices ``{"train", "val", "test"}`` of a series of ``n_bars`` bars, in time order,
    laid out over the bars before the lockbox; an opened split adds ``holdout``.

    ``cfg`` is a :class:`FoldSplit`, a :class:`SplitConfig` or anything
    :meth:`SplitConfig.from_config` takes. Raises :class:`SplitError` when a split would be empty.
    """
    cfg = as_split(cfg)
    n_holdout = math.floor(n_bars * cfg.holdout)
    if cfg.holdout and n_holdout < 1:
        raise SplitError(f"evaluation.holdout={cfg.holdout:g}: gives 0 bars of {n_bars}; need more bars or a larger fraction")
    kept = n_bars - n_holdout - (cfg.gap_bars if n_holdout else 0)  # the bars before the lockbox and its gap
    slices = cfg.slices(kept) if isinstance(cfg, FoldSplit) else _single_slices(kept, cfg)
    if cfg.open_holdout:
        if not n_holdout:
            raise SplitError("evaluation.holdout=null: the run keeps no lockbox to open")
        slices[HOLDOUT] = slice(n_bars - n_holdout, n_bars)
    return slices


def _single_slices(n_bars: int, cfg: SplitConfig) -> dict[str, slice]:
    usable = n_bars - 2 * cfg.gap_bars
    n_train = math.floor(usable * cfg.train)
    n_val = math.floor(usable * cfg.val)
    sizes = {"train": n_train, "val": n_val, "test": usable - n_train - n_val}
    for name, size in sizes.items():
        if size < 1:
            raise SplitError(
                f"split.{name}={cfg.fraction(name):g}: gives {max(size, 0)} bars "
                f"({n_bars} bars after warm-up{' and the lockbox' if cfg.holdout else ''}, split.gap_bars={cfg.gap_bars}); need more bars"
            )
    slices = {}
    start = 0
    for name in SPLIT_NAMES:
        slices[name] = slice(start, start + sizes[name])
        start += sizes[name] + cfg.gap_bars
    return slices
