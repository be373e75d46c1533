"""Probabilistic and deflated Sharpe ratios (Bailey & López de Prado 2012, 2014), with the
standard library's normal distribution (``statistics.NormalDist``), so that what reads them
without computing a backtest (``foxhunt runs top``) imports neither numpy nor scipy. The
formulas are in :mod:`foxhunt.evaluation.stats`'s doc, which re-exports these functions.
"""

from __future__ import annotations

import math
import numbers
import statistics

EULER_GAMMA = 0.5772156649015329  # the Euler-Mascheroni constant
_NORMAL = statistics.NormalDist()


def probabilistic_sharpe_ratio(sr: float, sr_benchmark: float, n_obs: int, skew: float, kurtosis: float) -> float:
    """Probability that the true Sharpe exceeds ``sr_benchmark`` (Bailey & López de Prado 2012).

    Args:
        sr: observed per-observation (not annualized) Sharpe ratio.
        sr_benchmark: benchmark Sharpe ``SR*``, per observation.
        n_obs: number of observations behind ``sr`` (>= 2).
        skew: skewness of the observations.
        kurtosis: non-excess kurtosis of the observations (normal = 3, always >= 1).

    Returns:
        ``Phi((sr - sr*) * sqrt(n_obs - 1) / sqrt(1 - skew * sr + (kurtosis - 1) / 4 * sr^2))``
        in [0, 1]; 0.5 when ``sr == sr_benchmark``.

    Raises:
        ValueError: naming the argument, for non-finite numbers, ``n_obs < 2``,
            ``kurtosis < 1``, or moments that make the variance term not positive.
    """
    for name, value in (("sr", sr), ("sr_benchmark", sr_benchmark), ("skew", skew)):
        if not (_is_real(value) and math.isfinite(value)):
            raise ValueError(f"probabilistic_sharpe_ratio {name}={value!r}: must be a finite number")
    n_obs = _check_int("probabilistic_sharpe_ratio", "n_obs", n_obs, low=2)
    if not (_is_real(kurtosis) and math.isfinite(kurtosis) and kurtosis >= 1.0):
        raise ValueError(
            f"probabilistic_sharpe_ratio kurtosis={kurtosis!r}: must be a finite number >= 1 (non-excess kurtosis: normal = 3)"
        )
    variance_term = 1.0 - skew * sr + (kurtosis - 1.0) / 4.0 * sr * sr
    if not variance_term > 0.0:
        raise ValueError(
            f"probabilistic_sharpe_ratio skew={skew!r}, kurtosis={kurtosis!r}: "
            f"1 - skew*sr + (kurtosis-1)/4*sr^2 = {variance_term:g} at sr={sr!r} must be > 0 "
            "(are the moments those of the same series?)"
        )
    z = (sr - sr_benchmark) * math.sqrt(n_obs - 1) / math.sqrt(variance_term)
    return float(_NORMAL.cdf(z))


def expected_max_sharpe(sr_variance: float, n_trials: int) -> float:
    """Expected best Sharpe of ``n_trials`` unskilled trials (Bailey & López de Prado 2014).

    Args:
        sr_variance: variance ``V`` of the trials' Sharpe ratios (>= 0), in the units the
            result is wanted in (per observation for the DSR).
        n_trials: number of trials ``N`` (>= 1).

    Returns:
        ``sqrt(V) * ((1 - gamma) * Z^-1(1 - 1/N) + gamma * Z^-1(1 - 1/(N e)))``; 0.0 for
        ``N = 1`` (no selection).

    Raises:
        ValueError: naming the argument, for a negative or non-finite ``sr_variance`` or
            ``n_trials < 1``.
    """
    if not (_is_real(sr_variance) and math.isfinite(sr_variance) and sr_variance >= 0):
        raise ValueError(f"expected_max_sharpe sr_variance={sr_variance!r}: must be a finite number >= 0")
    n_trials = _check_int("expected_max_sharpe", "n_trials", n_trials, low=1)
    if n_trials == 1:
        return 0.0
    gamma = EULER_GAMMA
    quantiles = (1.0 - gamma) * _NORMAL.inv_cdf(1.0 - 1.0 / n_trials) + gamma * _NORMAL.inv_cdf(1.0 - 1.0 / (n_trials * math.e))
    return float(math.sqrt(sr_variance) * quantiles)


def deflated_sharpe_ratio(sr: float, trial_srs, n_obs: int, skew: float, kurtosis: float, n_trials: int | None = None) -> float:
    """PSR of ``sr`` against the expected best of the trials (Bailey & López de Prado 2014).

    Args:
        sr: per-observation Sharpe ratio of the selected trial.
        trial_srs: per-observation Sharpe ratios of the trials that have one, the selected one
            included; ``V = var(trial_srs, ddof=1)``. A single trial means no selection: the
            benchmark is 0 and the DSR is the PSR against 0.
        n_obs: observations behind ``sr`` (>= 2).
        skew: skewness of the selected trial's observations.
        kurtosis: non-excess kurtosis of the selected trial's observations (normal = 3).
        n_trials: ``N``, every trial tried (default ``len(trial_srs)``): a search's pruned and
            failed trials were tried too, though they have no Sharpe ratio to add to ``V``
            (the honest count of a search: :mod:`foxhunt.sweeps.study`); ``>= len(trial_srs)``.

    Returns:
        ``probabilistic_sharpe_ratio(sr, expected_max_sharpe(V, N), n_obs, skew, kurtosis)``.

    Raises:
        ValueError: naming the argument, for an empty, non-1-D or non-finite ``trial_srs``,
            ``n_trials`` below their number, or as :func:`probabilistic_sharpe_ratio`.
    """
    trials = _check_trials(trial_srs)
    count = len(trials) if n_trials is None else _check_int("deflated_sharpe_ratio", "n_trials", n_trials, low=len(trials))
    variance = statistics.variance(trials) if len(trials) > 1 else 0.0
    benchmark = expected_max_sharpe(variance, count)
    return probabilistic_sharpe_ratio(sr, benchmark, n_obs, skew, kurtosis)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_int(caller: str, name: str, value, low: int) -> int:
    is_int = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not (is_int and value >= low):
        raise ValueError(f"{caller} {name}={value!r}: must be an integer >= {low}")
    return int(value)


def _check_trials(trial_srs) -> list[float]:
    try:
        trials = [float(v) for v in trial_srs]
    except (TypeError, ValueError):
        raise ValueError("deflated_sharpe_ratio trial_srs: must be a 1-D sequence of numbers") from None
    if not trials:
        raise ValueError("deflated_sharpe_ratio trial_srs: needs at least 1 values, got 0")
    for row, value in enumerate(trials):
        if not math.isfinite(value):
            raise ValueError(f"deflated_sharpe_ratio trial_srs[{row}]={value}: must be finite")
    return trials
