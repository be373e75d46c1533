"""Chronological train / val / test split of a bar series, with a gap between splits.

Market data is a time series: a random split would let the model see the future of its
validation bars. The splits are consecutive blocks in time order, and ``gap_bars`` bars are
dropped between train and val and between val and test so that trailing feature windows and
forecast horizons of one split do not overlap the next.

Sizes: ``usable = n_bars - 2 * gap_bars``; train gets ``floor(usable * train)`` bars,
val ``floor(usable * val)`` and test the rest, so the blocks cover every usable bar.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from foxhunt.config.sections import dataclass_values

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


def split_slices(n_bars: int, cfg: Any) -> dict[str, slice]:
    """Row slices ``{"train", "val", "test"}`` of a series of ``n_bars`` bars, in time order.

    ``cfg`` is a :class:`SplitConfig` or anything :meth:`SplitConfig.from_config` takes.
    Raises ValueError when a split would be empty.
    """
    cfg = SplitConfig.from_config(cfg)
    usable = n_bars - 2 * cfg.gap_bars
    n_train = math.floor(usable * cfg.train)
    n_val = math.floor(usable * cfg.val)
    sizes = {"train": n_train, "val": n_val, "test": usable - n_train - n_val}
    for name, size in sizes.items():
        if size < 1:
            raise ValueError(
                f"split.{name}={cfg.fraction(name):g}: gives {max(size, 0)} bars "
                f"({n_bars} bars after warm-up, split.gap_bars={cfg.gap_bars}); need more bars"
            )
    slices = {}
    start = 0
    for name in SPLIT_NAMES:
        slices[name] = slice(start, start + sizes[name])
        start += sizes[name] + cfg.gap_bars
    return slices
