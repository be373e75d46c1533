"""How far to trust a backtest figure: bootstrap intervals, probabilistic and deflated Sharpe.

Sharpe ratio (the same figure :func:`foxhunt.evaluation.backtest.backtest` reports)::

    SR = mean(pnl) / std(pnl, ddof=1) * sqrt(periods_per_year)

0 when there are fewer than 2 values or the deviation is 0.

Circular block bootstrap (Politis & Romano, 1992). The per-step PnL of an intraday strategy
is serially dependent (positions persist, features look back over windows of bars), so
resampling single steps would understate the spread of the mean. Each replicate instead
glues ``ceil(n / b)`` blocks of ``b = block_bars`` consecutive steps, each starting at a
uniformly drawn step and wrapping round the end of the series, and cuts the result to ``n``
steps. Wrapping gives every step the same chance to be drawn (a moving block bootstrap
under-draws the ends), and with ``b = n`` every replicate is a rotation of the series, whose
mean is the sample mean. The interval is the percentile one: the ``(1 - c) / 2`` and
``(1 + c) / 2`` quantiles of the replicates' statistic, for the annualized Sharpe and for
the mean PnL per step.

Block length. Dependence shorter than a block is kept, longer is cut at the block edges.
The caller passes 60 one-minute bars (one hour), longer than the feature windows, so the
serial dependence that a model's positions inherit from the windows stays inside the
blocks; and with a few thousand bars or more there are still many blocks to resample.
``block_bars=1`` is the ordinary i.i.d. bootstrap.

Probabilistic Sharpe ratio (Bailey & López de Prado, "The Sharpe Ratio Efficient
Frontier", 2012): the probability that the true Sharpe exceeds a benchmark ``SR*``, given
the per-observation (not annualized) estimate ``SR`` over ``T`` observations with skewness
``g3`` and (non-excess, normal = 3) kurtosis ``g4``::

    PSR(SR*) = Phi((SR - SR*) * sqrt(T - 1) / sqrt(1 - g3 * SR + (g4 - 1) / 4 * SR^2))

Deflated Sharpe ratio (Bailey & López de Prado, "The Deflated Sharpe Ratio", 2014): the
PSR against the Sharpe that the best of ``N`` unskilled trials would reach by chance, with
``V`` the variance of the trials' (per-observation) Sharpe ratios and ``gamma`` the
Euler-Mascheroni constant::

    SR* = sqrt(V) * ((1 - gamma) * Z^-1(1 - 1/N) + gamma * Z^-1(1 - 1/(N e)))

(0 for a single trial).

Written here by hand with numpy because the libraries do not fit: ``scipy.stats.bootstrap``
resamples single observations only (no block bootstrap), and the block bootstraps of
``arch`` (not installed here) call the statistic once per replicate in Python, which is slow
for the 1000 replicates over 10k+ bars a grid run needs; here the replicates are one
``(samples, n)`` index matrix, reduced along its rows. The PSR and DSR are a few lines of
the papers' formulas (:mod:`foxhunt.evaluation.deflated`, on the standard library's normal
distribution).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

BOOTSTRAP_METHOD = "circular_block_percentile"
MAX_CHUNK_ENTRIES = 20_000_000  # replicate rows x steps resampled at once (~160 MB float64)


@dataclass(frozen=True)
class BootstrapIntervals:
    """What :func:`block_bootstrap` computes, and the settings it used.

    Attributes:
        sharpe: (low, high) percentile interval of the annualized Sharpe ratio.
        mean_pnl: (low, high) percentile interval of the mean PnL per step (units of pnl).
        block_bars: steps per resampled block.
        samples: number of bootstrap replicates.
        confidence: the interval's nominal coverage, in (0, 1).
        seed: seed of the numpy Generator that drew the blocks.
        method: how the intervals were made (``"circular_block_percentile"``).
    """

    sharpe: tuple[float, float]
    mean_pnl: tuple[float, float]
    block_bars: int
    samples: int
    confidence: float
    seed: int
    method: str = BOOTSTRAP_METHOD


def sharpe_ratio(pnl, periods_per_year: float = 1.0) -> float:
    """Annualized Sharpe ratio of per-step PnL: mean / std(ddof=1) * sqrt(periods_per_year).

    Args:
        pnl: (n,) finite per-step PnL (any unit; the ratio has none).
        periods_per_year: steps per year (> 0); 1 gives the per-step Sharpe.

    Returns:
        The ratio; 0.0 when there are fewer than 2 values or the deviation is 0.

    Raises:
        ValueError: naming the argument, for a non-1-D or non-finite ``pnl`` or a
            ``periods_per_year`` that is not a finite number > 0.
    """
    values = _check_pnl(pnl, "sharpe_ratio", min_values=0)
    _check_positive("sharpe_ratio", "periods_per_year", periods_per_year)
    if len(values) < 2:
        return 0.0
    std = float(np.std(values, ddof=1))
    if std == 0.0:
        return 0.0
    return float(np.mean(values) / std * math.sqrt(periods_per_year))


def sortino_ratio(pnl, periods_per_year: float = 1.0) -> float:
    """Annualized Sortino ratio of per-step PnL: mean / downside deviation * sqrt(periods_per_year),
    the downside deviation being the root mean square of the losses (min(pnl, 0), over every
    step, the target 0).

    Returns 0.0 when there are fewer than 2 values or no step lost; raises as :func:`sharpe_ratio`."""
    values = _check_pnl(pnl, "sortino_ratio", min_values=0)
    _check_positive("sortino_ratio", "periods_per_year", periods_per_year)
    if len(values) < 2:
        return 0.0
    downside = float(np.sqrt(np.mean(np.minimum(values, 0.0) ** 2)))
    if downside == 0.0:
        return 0.0
    return float(np.mean(values) / downside * math.sqrt(periods_per_year))


def calmar_ratio(pnl, max_drawdown: float, periods_per_year: float = 1.0) -> float:
    """Annualized PnL (mean per step * periods_per_year) over the largest drawdown, both in the
    PnL's unit. 0.0 when there is no drawdown (no loss to scale by)."""
    values = _check_pnl(pnl, "calmar_ratio", min_values=0)
    _check_positive("calmar_ratio", "periods_per_year", periods_per_year)
    if not len(values) or not max_drawdown > 0:
        return 0.0
    return float(np.mean(values) * periods_per_year / max_drawdown)


def block_bootstrap(
    pnl,
    *,
    block_bars: int,
    samples: int,
    confidence: float,
    seed: int,
    periods_per_year: float,
) -> BootstrapIntervals:
    """Circular block bootstrap percentile intervals of the Sharpe ratio and the mean PnL.

    Args:
        pnl: (n,) finite per-step PnL, n >= 2.
        block_bars: consecutive steps per block, 1 <= block_bars <= n.
        samples: number of replicates (>= 1).
        confidence: nominal coverage of the intervals, 0 < confidence < 1.
        seed: seed of the numpy Generator; the same arguments give the same intervals
            (the replicates are drawn in order, so the chunking does not change them).
        periods_per_year: steps per year (> 0) for the annualized Sharpe, as in
            :func:`sharpe_ratio`.

    Returns:
        The intervals and the settings used. A replicate with zero deviation has Sharpe 0,
        the convention of :func:`sharpe_ratio`.

    Raises:
        ValueError: naming the argument, for any value outside the ranges above.
    """
    values = _check_pnl(pnl, "block_bootstrap", min_values=2)
    n = len(values)
    block_bars = _check_int("block_bootstrap", "block_bars", block_bars, low=1)
    if block_bars > n:
        raise ValueError(f"block_bootstrap block_bars={block_bars}: must be <= len(pnl) = {n}")
    samples = _check_int("block_bootstrap", "samples", samples, low=1)
    if not (_is_real(confidence) and 0.0 < confidence < 1.0):
        raise ValueError(f"block_bootstrap confidence={confidence!r}: must be a number in (0, 1)")
    seed = _check_int("block_bootstrap", "seed", seed, low=0)
    _check_positive("block_bootstrap", "periods_per_year", periods_per_year)

    rng = np.random.default_rng(seed)
    num_blocks = -(-n // block_bars)  # ceil(n / block_bars)
    offsets = np.arange(block_bars)
    rows_per_chunk = max(1, MAX_CHUNK_ENTRIES // (num_blocks * block_bars))
    means = np.empty(samples)
    stds = np.empty(samples)
    for start in range(0, samples, rows_per_chunk):
        rows = min(rows_per_chunk, samples - start)
        block_starts = rng.integers(0, n, size=(rows, num_blocks))
        index = (block_starts[:, :, None] + offsets).reshape(rows, -1)[:, :n]
        index %= n  # wrap round the end: the circular block bootstrap
        resampled = values[index]
        means[start : start + rows] = resampled.mean(axis=1)
        stds[start : start + rows] = resampled.std(axis=1, ddof=1)

    safe = np.where(stds == 0.0, 1.0, stds)
    sharpes = np.where(stds == 0.0, 0.0, means / safe) * math.sqrt(periods_per_year)
    tails = [(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0]
    sharpe_low, sharpe_high = np.quantile(sharpes, tails)
    mean_low, mean_high = np.quantile(means, tails)
    return BootstrapIntervals(
        sharpe=(float(sharpe_low), float(sharpe_high)),
        mean_pnl=(float(mean_low), float(mean_high)),
        block_bars=block_bars,
        samples=samples,
        confidence=float(confidence),
        seed=seed,
    )


def pnl_moments(pnl) -> tuple[float, float]:
    """Sample skewness and non-excess kurtosis (normal = 3) of ``pnl``, for the PSR and DSR.

    The moment estimators (``scipy.stats.skew`` and ``kurtosis(fisher=False)``, biased), as
    in the papers. For constant ``pnl`` (zero deviation) the moments are undefined; the
    normal values (0.0, 3.0) are returned, which leave the PSR of the conventional Sharpe 0
    unchanged (its denominator is 1 whatever the moments when SR = 0).

    Raises:
        ValueError: for a non-1-D or non-finite ``pnl`` or fewer than 2 values.
    """
    values = _check_pnl(pnl, "pnl_moments", min_values=2)
    if np.ptp(values) == 0.0:
        return 0.0, 3.0
    skew = float(sps.skew(values, bias=True))
    kurtosis = float(sps.kurtosis(values, fisher=False, bias=True))
    return skew, kurtosis


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_pnl(pnl, caller: str, min_values: int, name: str = "pnl") -> np.ndarray:
    try:
        values = np.asarray(pnl, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{caller} {name}: must be numbers") from None
    if values.ndim != 1:
        raise ValueError(f"{caller} {name}: expected a 1-D array, got shape {values.shape}")
    if len(values) < min_values:
        raise ValueError(f"{caller} {name}: needs at least {min_values} values, got {len(values)}")
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{caller} {name}[{row}]={values[row]}: must be finite")
    return values


def _check_positive(caller: str, name: str, value) -> None:
    if not (_is_real(value) and math.isfinite(value) and value > 0):
        raise ValueError(f"{caller} {name}={value!r}: must be a finite number > 0")


def _check_int(caller: str, name: str, value, low: int) -> int:
    is_int = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not (is_int and value >= low):
        raise ValueError(f"{caller} {name}={value!r}: must be an integer >= {low}")
    return int(value)
