"""Small-sample statistics of paired differences over seeds (issue 35).

A benchmark compares two methods on the same few seeds (3 to 8 here), so each comparison is
n paired differences d_1..d_n (method minus baseline, one per seed). This module gives

* the **paired t-interval** of their mean, ``mean ± t_{(1+level)/2, n-1} · SD / √n``
  (:func:`paired_t_interval`, vectorised over many samples by :func:`t_intervals`);
* the **minimum detectable effect** (MDE) of the paired two-sided t-test at level α with
  the given power: the true mean difference δ at which the test on n seeds rejects with
  probability ``power`` when the differences' SD is the observed one
  (:func:`detectable_effect`). It is the exact value from the noncentral t distribution:
  the test statistic is then noncentral t with n − 1 degrees of freedom and noncentrality
  δ√n / SD, and δ solves ``P(|T| > t_{1-α/2, n-1}) = power``. The textbook approximation
  ``(t_{1-α/2, n-1} + t_{power, n-1}) · SD / √n`` is slightly smaller (8 seeds: 1.153 SD
  against the exact 1.156 SD; 3 seeds: 3.10 against 3.26, where it has 77 % power, not 80).

Why not the percentile bootstrap the tables printed before: for normal differences it
covers about 75 % at 3 values, 83 % at 5 and 89 % at 8 instead of 95 % (simulated; it is too
narrow by the factor √((n−1)/n) and uses normal rather than t quantiles). The t-interval's coverage at n = 8 is 95 % for normal differences, 93.5 % at
skewness 1 and about 90 % at skewness 2 (exponential): tests/bench/test_intervals.py
simulates it. Success-rate differences between two arms that share seeds are close to
symmetric (the 48 differences of docs/results §9, each standardised: skewness −0.35).

The quantiles come from scipy.stats (``t``, ``nct``) and the root from scipy.optimize.brentq.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize, stats

__all__ = [
    "ALPHA",
    "CONFIDENCE",
    "POWER",
    "detectable_effect",
    "detectable_effect_in_sd",
    "paired_t_interval",
    "t_intervals",
]

CONFIDENCE = 0.95  # level of the printed intervals
ALPHA = 0.05  # two-sided level of the test whose detectable effect is printed
POWER = 0.80  # power at which the detectable effect is printed


def _check_level(name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {value}")


def t_intervals(samples: ArrayLike, level: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """Paired t-intervals of the mean of each row of ``samples`` (the last axis is one sample).

    Returns ``(low, high)`` arrays of the leading shape. Every row needs at least 2 values;
    a row whose values are all equal gets the zero-width interval at its mean.
    """
    _check_level("level", level)
    arr = np.asarray(samples, dtype=np.float64)
    if arr.ndim == 0 or arr.shape[-1] < 2:
        raise ValueError("t_intervals needs at least 2 values per sample")
    if not np.all(np.isfinite(arr)):
        raise ValueError("t_intervals of a non-finite value")
    n = arr.shape[-1]
    mean = arr.mean(axis=-1)
    half = stats.t.ppf((1.0 + level) / 2.0, n - 1) * arr.std(axis=-1, ddof=1) / math.sqrt(n)
    return mean - half, mean + half


def paired_t_interval(
    diffs: Sequence[float], level: float = CONFIDENCE
) -> tuple[float, float] | None:
    """The ``level`` t-interval of the mean of ``diffs``; None for fewer than 2 values."""
    _check_level("level", level)
    values = list(diffs)
    if len(values) < 2:
        if values and not math.isfinite(values[0]):
            raise ValueError("paired_t_interval of a non-finite value")
        return None
    low, high = t_intervals(values, level)
    return float(low), float(high)


def _two_sided_power(effect_in_sd: float, n: int, alpha: float) -> float:
    """Power of the two-sided paired t-test at level ``alpha`` on n values whose true mean is
    ``effect_in_sd`` SDs away from 0 (both rejection tails, from the noncentral t)."""
    df = n - 1
    crit = stats.t.ppf(1.0 - alpha / 2.0, df)
    nc = effect_in_sd * math.sqrt(n)
    return float(stats.nct.sf(crit, df, nc) + stats.nct.sf(crit, df, -nc))


@lru_cache(maxsize=256)
def detectable_effect_in_sd(n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The minimum detectable effect of the paired two-sided t-test in units of the
    differences' SD: the δ/SD at which the test on ``n`` values has power ``power``."""
    if n < 2:
        raise ValueError(f"a detectable effect needs n >= 2 values, got {n}")
    _check_level("alpha", alpha)
    _check_level("power", power)
    if power <= alpha:
        raise ValueError(f"power must exceed alpha ({alpha}), got {power}")
    df = n - 1
    # the textbook approximation lies below the exact root; widen until the power passes
    guess = (stats.t.ppf(1.0 - alpha / 2.0, df) + stats.t.ppf(power, df)) / math.sqrt(n)
    high = guess
    while _two_sided_power(high, n, alpha) < power:
        high *= 2.0
    return float(
        optimize.brentq(lambda e: _two_sided_power(e, n, alpha) - power, 0.0, high, xtol=1e-10)
    )


def detectable_effect(
    diffs: Sequence[float], alpha: float = ALPHA, power: float = POWER
) -> float | None:
    """The minimum detectable effect (same units as ``diffs``) of the paired two-sided t-test
    on ``len(diffs)`` values with their observed sample SD; None for fewer than 2 values."""
    arr = np.asarray(list(diffs), dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError("detectable_effect of a non-finite value")
    if arr.size < 2:
        return None
    return detectable_effect_in_sd(int(arr.size), alpha, power) * float(arr.std(ddof=1))
