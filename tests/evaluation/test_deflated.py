"""foxhunt.evaluation.deflated: the probabilistic and deflated Sharpe ratios against their closed
forms and the papers' numbers, the expected best of N trials against the exact expectation of the
maximum of N normals, monotonic in the number of trials, and calibrated as a test at 5%."""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import integrate
from scipy.stats import kurtosis, norm, skew

from foxhunt.evaluation.deflated import EULER_GAMMA, deflated_sharpe_ratio, expected_max_sharpe, probabilistic_sharpe_ratio
from foxhunt.evaluation.stats import pnl_moments

# ------------------------------------------------------------------- moved from test_stats.py


def test_psr_is_one_half_at_the_benchmark():
    assert probabilistic_sharpe_ratio(0.1, 0.1, 1000, skew=-2.0, kurtosis=9.0) == 0.5
    assert probabilistic_sharpe_ratio(0.0, 0.0, 10, skew=0.0, kurtosis=3.0) == 0.5


def test_psr_of_normal_returns_by_hand():
    # skew 0, kurtosis 3: denominator sqrt(1 + sr^2 / 2); sr 0.1 vs 0 over 101 observations
    # z = 0.1 * sqrt(100) / sqrt(1.005) = 0.997509...; Phi(z) = 0.84073...
    z = 0.1 * 10.0 / math.sqrt(1.005)
    assert z == pytest.approx(0.9975093, abs=1e-7)
    psr = probabilistic_sharpe_ratio(0.1, 0.0, 101, skew=0.0, kurtosis=3.0)
    assert psr == pytest.approx(0.5 * (1.0 + math.erf(z / math.sqrt(2.0))), rel=1e-12)
    assert psr == pytest.approx(0.8407, abs=1e-4)
    # with no skew, a Sharpe as far below the benchmark mirrors it
    assert probabilistic_sharpe_ratio(-0.1, 0.0, 101, 0.0, 3.0) == pytest.approx(1.0 - psr)


def test_psr_penalizes_negative_skew_and_fat_tails():
    normal = probabilistic_sharpe_ratio(0.1, 0.0, 500, skew=0.0, kurtosis=3.0)
    assert probabilistic_sharpe_ratio(0.1, 0.0, 500, skew=-1.0, kurtosis=3.0) < normal
    assert probabilistic_sharpe_ratio(0.1, 0.0, 500, skew=0.0, kurtosis=8.0) < normal
    assert probabilistic_sharpe_ratio(0.1, 0.0, 500, skew=1.0, kurtosis=3.0) > normal


def test_expected_max_sharpe_grows_with_trials_and_is_zero_for_one():
    assert expected_max_sharpe(0.5, 1) == 0.0
    values = [expected_max_sharpe(1.0, n) for n in (2, 5, 10, 100, 1000, 10_000)]
    assert all(a < b for a, b in itertools.pairwise(values))
    # scales with the trials' standard deviation
    assert expected_max_sharpe(4.0, 100) == pytest.approx(2.0 * expected_max_sharpe(1.0, 100))
    assert expected_max_sharpe(0.0, 100) == 0.0


def test_deflated_sharpe_ratio_paper_example():
    """Bailey & López de Prado, "The Deflated Sharpe Ratio" (2014), the numerical example.

    N = 100 trials whose annualized Sharpe ratios have variance 1/2; the best has annualized
    SR 2.5 over T = 1250 daily observations (five years of 250) with skew -3 and kurtosis
    10. Per observation, as the paper converts: V = 0.5 / 250, SR = 2.5 / sqrt(250) =
    0.1581, giving E[max SR] = 0.1132 (1.7894 annualized) and DSR = 0.9004.
    """
    periods = 250
    variance = 0.5 / periods
    sr = 2.5 / math.sqrt(periods)
    benchmark = expected_max_sharpe(variance, 100)
    assert benchmark == pytest.approx(0.1132, abs=5e-5)
    assert benchmark * math.sqrt(periods) == pytest.approx(1.7894, abs=5e-4)
    # 100 trial Sharpe ratios whose sample variance is exactly V
    raw = np.random.default_rng(0).normal(size=100)
    trials = (raw - raw.mean()) / raw.std(ddof=1) * math.sqrt(variance)
    dsr = deflated_sharpe_ratio(sr, trials, n_obs=1250, skew=-3.0, kurtosis=10.0)
    assert dsr == pytest.approx(0.9004, abs=5e-5)
    assert dsr == pytest.approx(probabilistic_sharpe_ratio(sr, benchmark, 1250, skew=-3.0, kurtosis=10.0), rel=1e-12)


def test_dsr_of_a_single_trial_is_the_psr_against_zero():
    dsr = deflated_sharpe_ratio(0.05, [0.05], n_obs=400, skew=0.0, kurtosis=3.0)
    assert dsr == probabilistic_sharpe_ratio(0.05, 0.0, 400, skew=0.0, kurtosis=3.0)


def test_more_trials_deflate_more():
    rng = np.random.default_rng(3)
    few = deflated_sharpe_ratio(0.1, rng.normal(0, 0.03, 5), 1000, 0.0, 3.0)
    many = deflated_sharpe_ratio(0.1, rng.normal(0, 0.03, 500), 1000, 0.0, 3.0)
    assert many < few


# ------------------------------------------------------------------------------ closed forms


@settings(max_examples=300, deadline=None)
@given(sr=st.floats(-0.5, 0.5), benchmark=st.floats(-0.5, 0.5), n_obs=st.integers(2, 100_000),
       skew=st.floats(-3.0, 3.0), kurtosis=st.floats(1.0, 30.0))  # fmt: skip
def test_psr_is_the_normal_cdf_of_its_closed_form(sr, benchmark, n_obs, skew, kurtosis):
    variance = 1.0 - skew * sr + (kurtosis - 1.0) / 4.0 * sr * sr
    assume(variance > 1e-6)
    z = (sr - benchmark) * math.sqrt(n_obs - 1) / math.sqrt(variance)
    psr = probabilistic_sharpe_ratio(sr, benchmark, n_obs, skew, kurtosis)
    assert psr == pytest.approx(float(norm.cdf(z)), rel=1e-9, abs=1e-12)
    assert 0.0 <= psr <= 1.0


@settings(max_examples=200, deadline=None)
@given(sr=st.floats(-0.3, 0.3), low=st.floats(-0.3, 0.3), step=st.floats(1e-3, 0.3), n_obs=st.integers(10, 5_000),
       more=st.integers(1, 5_000), skew=st.floats(-1.0, 1.0), kurtosis=st.floats(2.0, 10.0))  # fmt: skip
def test_psr_falls_as_the_benchmark_rises_and_more_observations_make_it_surer(sr, low, step, n_obs, more, skew, kurtosis):
    psr = probabilistic_sharpe_ratio(sr, low, n_obs, skew, kurtosis)
    assert probabilistic_sharpe_ratio(sr, low + step, n_obs, skew, kurtosis) <= psr
    longer = probabilistic_sharpe_ratio(sr, low, n_obs + more, skew, kurtosis)
    assert (longer >= psr) if sr > low else (longer <= psr)  # further from 1/2 on the side of sr - sr*


def exact_expected_max(n: int) -> float:
    """E[max of n independent standard normals] = integral of x n phi(x) Phi(x)^(n-1)."""
    value, _ = integrate.quad(lambda x: x * n * norm.pdf(x) * norm.cdf(x) ** (n - 1), -12, 12, limit=200)
    return value


def test_expected_max_sharpe_approximates_the_exact_expected_maximum_of_n_normals():
    """Bailey & López de Prado's approximation of E[max] (their appendix): within 2.5% of the exact
    expectation from 10 trials on (1.5388 for 10: Tippett's table), closer as N grows."""
    assert exact_expected_max(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-9)  # the integral itself, by hand
    assert exact_expected_max(10) == pytest.approx(1.5388, abs=1e-4)
    errors = []
    for n in (10, 100, 1_000, 10_000):
        approx = expected_max_sharpe(1.0, n)
        by_hand = (1 - EULER_GAMMA) * norm.ppf(1 - 1 / n) + EULER_GAMMA * norm.ppf(1 - 1 / (n * math.e))
        assert approx == pytest.approx(by_hand, rel=1e-12)
        errors.append(abs(approx / exact_expected_max(n) - 1.0))
    assert max(errors) < 0.025 and all(a > b for a, b in itertools.pairwise(errors))


@settings(max_examples=200, deadline=None)
@given(variance=st.floats(1e-6, 1.0), fewer=st.integers(1, 5_000), more=st.integers(1, 5_000),
       sr=st.floats(-0.2, 0.5))  # fmt: skip
def test_more_trials_of_the_same_spread_never_deflate_less(variance, fewer, more, sr):
    """The DSR of a Sharpe ratio picked from N trials whose Sharpe ratios have variance V is
    monotonic in N: a larger search expects a better best by luck, so the same result means less."""
    n, m = fewer, fewer + more
    assert expected_max_sharpe(variance, m) > expected_max_sharpe(variance, n) >= 0.0

    def trials(count: int) -> list[float]:  # count Sharpe ratios with sample variance exactly V
        if count == 1:
            return [sr]
        raw = np.linspace(-1.0, 1.0, count)
        return list(raw / raw.std(ddof=1) * math.sqrt(variance))

    few, many = (deflated_sharpe_ratio(sr, trials(k), 1_000, 0.0, 3.0) for k in (n, m))
    assert many <= few
    if n > 1:
        assert few == pytest.approx(probabilistic_sharpe_ratio(sr, expected_max_sharpe(variance, n), 1_000, 0.0, 3.0), rel=1e-9)


def test_the_dsr_reads_the_trials_sample_variance_in_any_order():
    trials = [0.02, -0.01, 0.05, 0.00, 0.03]
    variance = float(np.var(trials, ddof=1))
    want = probabilistic_sharpe_ratio(0.05, expected_max_sharpe(variance, 5), 500, -0.5, 4.0)
    assert deflated_sharpe_ratio(0.05, trials, 500, -0.5, 4.0) == pytest.approx(want, rel=1e-12)
    assert deflated_sharpe_ratio(0.05, trials[::-1], 500, -0.5, 4.0) == pytest.approx(want, rel=1e-12)
    assert deflated_sharpe_ratio(0.05, np.array(trials), 500, -0.5, 4.0) == pytest.approx(want, rel=1e-12)
    assert variance == pytest.approx(statistics.variance(trials))


def test_the_psr_is_a_test_at_its_level_and_the_dsr_undoes_the_selection():
    """4,000 series of 250 i.i.d. normal steps with true Sharpe 0: the PSR against 0 passes 0.95 in
    about 5% of them (measured 4.8%; standard error 0.34%). Picking the best of 20 such series, its
    PSR passes in most of 200 searches (measured 64%): the selection bias; its DSR against the best
    of 20 by chance passes in at most the nominal 5% (measured 0: the DSR is conservative)."""
    rng = np.random.default_rng(11)
    steps = rng.normal(size=(4_000, 250))
    srs = steps.mean(axis=1) / steps.std(axis=1, ddof=1)
    skews, kurtoses = skew(steps, axis=1), kurtosis(steps, axis=1, fisher=False)  # pnl_moments, for every row at once
    assert (skews[7], kurtoses[7]) == pytest.approx(pnl_moments(steps[7]), rel=1e-9)
    psr = np.array([probabilistic_sharpe_ratio(float(s), 0.0, 250, float(a), float(b)) for s, a, b in zip(srs, skews, kurtoses)])
    assert np.mean(psr > 0.95) == pytest.approx(0.05, abs=0.012)
    passed_psr = passed_dsr = 0
    for k, search in enumerate(srs.reshape(200, 20)):
        best = k * 20 + int(np.argmax(search))
        moments = float(skews[best]), float(kurtoses[best])
        passed_psr += probabilistic_sharpe_ratio(float(srs[best]), 0.0, 250, *moments) > 0.95
        passed_dsr += deflated_sharpe_ratio(float(srs[best]), search, 250, *moments) > 0.95
    assert passed_psr / 200 > 0.4 and passed_dsr / 200 <= 0.05


# --------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: probabilistic_sharpe_ratio(np.nan, 0.0, 100, 0.0, 3.0), r"\bsr=nan"),
        (lambda: probabilistic_sharpe_ratio(0.1, np.inf, 100, 0.0, 3.0), r"sr_benchmark=inf"),
        (lambda: probabilistic_sharpe_ratio(0.1, 0.0, 1, 0.0, 3.0), r"n_obs=1"),
        (lambda: probabilistic_sharpe_ratio(0.1, 0.0, 10.5, 0.0, 3.0), r"n_obs=10.5"),
        (lambda: probabilistic_sharpe_ratio(0.1, 0.0, 100, np.nan, 3.0), r"skew=nan"),
        (lambda: probabilistic_sharpe_ratio(0.1, 0.0, 100, 0.0, 0.5), r"kurtosis=0.5"),
        (lambda: probabilistic_sharpe_ratio(4.0, 0.0, 100, 1.0, 1.0), r"skew=1.0, kurtosis=1.0"),
        (lambda: expected_max_sharpe(-0.1, 10), r"sr_variance=-0.1"),
        (lambda: expected_max_sharpe(0.1, 0), r"n_trials=0"),
        (lambda: deflated_sharpe_ratio(0.1, [], 100, 0.0, 3.0), r"trial_srs: needs at least 1"),
        (lambda: deflated_sharpe_ratio(0.1, [0.1, np.nan], 100, 0.0, 3.0), r"trial_srs\[1\]"),
    ],
)
def test_bad_arguments_raise_naming_them(call, message):
    with pytest.raises(ValueError, match=message):
        call()
