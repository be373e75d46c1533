"""Chronological train / val / test split of a bar series, with a gap between splits.

Market data is a time series: a random split would let the model see the future of its
validation bars. The splits are consecutive blocks in time order, and ``gap_bars`` bars are
dropped between train and val and between val and test so that trailing feature windows and
forecast horizons of one split do not overlap the next.

Sizes: ``usable = n_bars - 2 * gap_bars``; train gets ``floor(usable * train)`` bars,
val ``floor(usable * val)`` and test the rest, so the blocks cover every usable bar.

**Walk-forward** (:class:`WalkForwardConfig`, one fold of it: :class:`FoldSplit`): ``folds``
test blocks of ``floor(n_bars * test)`` bars tile the end of the series, each ``embargo_bars``
after the previous one; before each test block come ``purge_bars`` dropped, a validation block
of ``floor(n_bars * val)`` bars, ``purge_bars`` dropped again, and the fold's training window
ending there: from the first bar (``window: expanding``, at least ``floor(n_bars * train)``
bars) or the last ``floor(n_bars * train)`` bars (``rolling``). Fold k + 1 trains on everything
fold k tested on (up to its own purge), never on a bar of its own validation or test block::

    fold 0: [train .............][p][val][p][test 0]
    fold 1: [train ......................][p][val][p][e][test 1]
    fold 2: [train ...............................][p][val][p][e][test 2]

The purge keeps a training window's forecast horizons and rewards (which read the next bars)
out of the blocks after it; the embargo keeps consecutive folds' test blocks apart by more than
the features' trailing windows, so no two folds score a bar whose inputs overlap, and the
folds' figures are closer to independent draws, as the across-fold spread assumes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from foxhunt.config.sections import dataclass_values
from foxhunt.errors import UserError

SPLIT_NAMES = ("train", "val", "test")
FRACTION_SUM_TOLERANCE = 1e-6  # float slack when checking that the fractions sum to 1


@dataclass(frozen=True)
class SplitConfig:
    """Tunables of the split (Hydra node ``data.split``): fractions of the usable bars and
    the number of bars dropped between consecutive splits."""

    train: float  # fraction of the usable bars (after warm-up and gaps)
    val: float
    test: float
    gap_bars: int

    def __post_init__(self) -> None:
        for name in SPLIT_NAMES:
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (ok and math.isfinite(value) and 0 < value < 1):
                raise ValueError(f"split.{name}={value!r}: must be a number in (0, 1)")
        total = self.train + self.val + self.test
        if abs(total - 1.0) > FRACTION_SUM_TOLERANCE:
            raise ValueError(
                f"split.train + split.val + split.test = {total:g}: "
                "must sum to 1"
            )
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
    embargo_bars: int

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
        for name in ("purge_bars", "embargo_bars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key}.{name}={value!r}: must be an integer >= 0")
        total = self.train + self.val + self.folds * self.test
        if total > 1:
            raise ValueError(
                f"{key}: train + val + folds x test = {self.train:g} + {self.val:g} + {self.folds} x {self.test:g}"
                f" = {total:g} of the bars: must be <= 1"
            )

    @classmethod
    def from_config(cls, cfg: Any) -> WalkForwardConfig:
        return cfg if isinstance(cfg, cls) else cls(**dataclass_values(cls, cfg, "evaluation.walk_forward"))

    def fold_slices(self, n_bars: int) -> list[dict[str, slice]]:
        """Row slices ``{"train", "val", "test"}`` of every fold of ``n_bars`` bars, in order.
        Raises ValueError naming the keys when the bars do not hold every fold."""
        n_train, n_val, n_test = (math.floor(n_bars * f) for f in (self.train, self.val, self.test))
        purge, embargo = self.purge_bars, self.embargo_bars
        needed = n_train + 2 * purge + n_val + self.folds * n_test + (self.folds - 1) * embargo
        if min(n_train, n_val, n_test) < 1 or needed > n_bars:
            raise SplitError(
                f"evaluation.walk_forward: {self.folds} folds need {needed} bars (train {n_train} + val {n_val}"
                f" + {self.folds} x test {n_test} + 2 x purge_bars {purge} + {self.folds - 1} x embargo_bars"
                f" {embargo}), the data has {n_bars} after warm-up; use fewer folds, smaller fractions or more bars"
            )
        folds = []
        for k in range(self.folds):
            test_start = n_bars - (self.folds - k) * n_test - (self.folds - 1 - k) * embargo
            val_start = test_start - purge - n_val
            train_stop = val_start - purge
            train_start = 0 if self.window == "expanding" else train_stop - n_train
            folds.append(
                {"train": slice(train_start, train_stop), "val": slice(val_start, val_start + n_val),
                 "test": slice(test_start, test_start + n_test)}
            )
        return folds


@dataclass(frozen=True)
class FoldSplit:
    """Fold ``fold`` of a walk-forward: what the dataset builder takes in place of a
    :class:`SplitConfig` (and what its cache key holds)."""

    walk_forward: WalkForwardConfig
    fold: int

    def __post_init__(self) -> None:
        if not 0 <= self.fold < self.walk_forward.folds:
            raise ValueError(f"evaluation.fold={self.fold!r}: must be in 0..{self.walk_forward.folds - 1}")

    def slices(self, n_bars: int) -> dict[str, slice]:
        return self.walk_forward.fold_slices(n_bars)[self.fold]


def as_split(cfg: Any) -> FoldSplit | SplitConfig:
    """A :class:`FoldSplit` as it is, anything else as a :class:`SplitConfig`."""
    return cfg if isinstance(cfg, FoldSplit) else SplitConfig.from_config(cfg)


def split_slices(n_bars: int, cfg: Any) -> dict[str, slice]:
    """Row slices ``{"train", "val", "test"}`` of a series of ``n_bars`` bars, in time order.

    ``cfg`` is a :class:`FoldSplit`, a :class:`SplitConfig` or anything
    :meth:`SplitConfig.from_config` takes. Raises ValueError when a split would be empty.
    """
    if isinstance(cfg, FoldSplit):
        return cfg.slices(n_bars)
    cfg = SplitConfig.from_config(cfg)
    usable = n_bars - 2 * cfg.gap_bars
    n_train = math.floor(usable * cfg.train)
    n_val = math.floor(usable * cfg.val)
    sizes = {"train": n_train, "val": n_val, "test": usable - n_train - n_val}
    for name, size in sizes.items():
        if size < 1:
            raise SplitError(
                f"split.{name}={cfg.fraction(name):g}: gives {max(size, 0)} bars "
                f"({n_bars} bars after warm-up, split.gap_bars={cfg.gap_bars}); need more bars"
            )
    slices = {}
    start = 0
    for name in SPLIT_NAMES:
        slices[name] = slice(start, start + sizes[name])
        start += sizes[name] + cfg.gap_bars
    return slices
