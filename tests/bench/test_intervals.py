"""The paired t-interval and the minimum detectable effect (mcgpo.bench.intervals, issue 35):
golden values by hand, coverage at n = 8 by simulation, power at the MDE by simulation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mcgpo.bench.intervals import (
    detectable_effect,
    detectable_effect_in_sd,
    paired_t_interval,
    t_intervals,
)

# t quantiles in closed form (the oracle below uses no library quantile):
#   1 degree of freedom (Cauchy):  t_p = tan(pi (p - 1/2))
#   2 degrees of freedom:          t_p = (2p - 1) / sqrt(2 p (1 - p))
T975_DF1 = math.tan(math.pi * 0.475)  # 12.7062
T975_DF2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)  # 0.95 / sqrt(0.04875) = 4.30265
T80_DF2 = 0.6 / math.sqrt(2 * 0.8 * 0.2)  # 0.6 / sqrt(0.32) = 1.06066


def test_golden_t_interval_three_values():
    # d = 1, 2, 3: mean 2, sample SD sqrt((1 + 0 + 1) / 2) = 1, n = 3, 2 df.
    # half-width = t_{0.975, 2} * 1 / sqrt(3) = 4.30265 / 1.73205 = 2.48414
    low, high = paired_t_interval([1.0, 2.0, 3.0])
    assert pytest.approx(4.302653, abs=1e-6) == T975_DF2
    assert (low, high) == pytest.approx((2 - T975_DF2 / math.sqrt(3), 2 + T975_DF2 / math.sqrt(3)))
    assert (low, high) == pytest.approx((-0.48414, 4.48414), abs=1e-5)


def test_golden_t_interval_two_values():
    # d = 0, 1: mean 0.5, SD sqrt(0.5), n = 2, 1 df: half-width
    # t_{0.975, 1} * sqrt(0.5) / sqrt(2) = 12.7062 * 0.5 = 6.3531 -> [-5.8531, 6.8531].
    # Two seeds give an interval 13 times as wide as their gap: honest, and useless.
    assert paired_t_interval([0.0, 1.0]) == pytest.approx((0.5 - T975_DF1 / 2, 0.5 + T975_DF1 / 2))
    assert paired_t_interval([0.0, 1.0]) == pytest.approx((-5.8531, 6.8531), abs=1e-4)


def test_golden_detectable_effect():
    # d = 1, 2, 3 (SD 1, n = 3). The textbook approximation by hand:
    #   (t_{0.975, 2} + t_{0.8, 2}) * SD / sqrt(3) = (4.30265 + 1.06066) / 1.73205 = 3.09651.
    # The exact MDE (noncentral t) is larger: the approximation ignores the lower rejection
    # tail (negligible) and treats the noncentral t as a shifted central t, which at 2 df
    # overstates the power (77 % at 3.0965 SD, below). The exact value, 3.2640 SD, is checked
    # independently by simulating the test in test_power_at_the_detectable_effect.
    approx = (T975_DF2 + T80_DF2) / math.sqrt(3)
    assert approx == pytest.approx(3.09651, abs=1e-5)
    exact = detectable_effect([1.0, 2.0, 3.0])
    assert exact == pytest.approx(3.2640, abs=1e-3) and exact > approx
    # linear in the SD: the same spread at 10x scale
    assert detectable_effect([10.0, 20.0, 30.0]) == pytest.approx(10 * exact)
    # many seeds: the t quantiles become normal ones, MDE -> (z_0.975 + z_0.8) SD / sqrt(n)
    # = (1.95996 + 0.84162) / sqrt(n) = 2.80158 / sqrt(n)
    assert detectable_effect_in_sd(10_000) * 100 == pytest.approx(2.80158, rel=1e-3)
    # eight seeds: 1.156 SD (the approximation 1.153); household-mid's integrated SD of
    # 2.31 points gives 2.7 points, its final SD of 5.13 gives 5.9
    assert detectable_effect_in_sd(8) == pytest.approx(1.1560, abs=1e-3)


@pytest.mark.parametrize("n", [3, 8])
def test_power_at_the_detectable_effect(n):
    # Oracle: simulate the two-sided paired t-test on n normal differences whose true mean
    # is the MDE (SD 1) and count rejections; 200,000 tests give an SE of
    # sqrt(0.8 * 0.2 / 2e5) = 0.0009 on the rate, the tolerance is 4 SE.
    rng = np.random.default_rng(11)
    effect = detectable_effect_in_sd(n)
    x = rng.standard_normal((200_000, n)) + effect
    t = x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(n))
    crit = stats.t.ppf(0.975, n - 1)
    assert np.mean(np.abs(t) > crit) == pytest.approx(0.80, abs=0.0036)


def _coverage(diffs: np.ndarray, true_mean: float) -> float:
    low, high = t_intervals(diffs)
    return float(np.mean((low <= true_mean) & (true_mean <= high)))


# Coverage at n = 8 (the household-mid comparison's seeds). 100,000 simulated samples per
# case: the Monte-Carlo SE of a coverage near 0.94 is sqrt(0.94 * 0.06 / 1e5) = 0.075
# percentage points, so each assertion below has a margin of more than 5 SE around the
# coverage measured with this seed (the seed is fixed: the test is deterministic).
SIMS = 100_000


def test_coverage_at_n8_normal_differences():
    # Normal differences: the t-interval is exact, 95 %. Measured: 95.0 %.
    rng = np.random.default_rng(2035)
    cover = _coverage(0.03 + 0.05 * rng.standard_normal((SIMS, 8)), 0.03)
    assert 0.93 <= cover <= 0.97
    assert cover == pytest.approx(0.95, abs=0.005)


def test_coverage_at_n8_skewed_differences():
    # Skewed differences: Gamma(shape 4) centred on its mean 4, skewness 2 / sqrt(4) = 1.
    # Why skewness 1 and not the exponential's 2: a difference of two success rates on the
    # same seed (same warm start, tasks and evaluation) is bounded and close to symmetric;
    # docs/results section 9's 48 paired differences (6 comparisons x 8 seeds, each
    # standardised) have skewness -0.35, and the largest single comparison's sample
    # skewness is -1.25 (SE about 0.75 at n = 8). Skewness 1 is at the top of that range.
    # What was found (reported, not tuned): the t-interval covers 93.5 % at skewness 1
    # (93.4 % with this seed: inside 93-97 % by 5.6 SE), 94.6 % at 0.5; it falls below
    # 93 % from skewness about 1.2 on; at the exponential's 2 it covers 89.5 % (the next
    # test pins that).
    rng = np.random.default_rng(2035)
    cover = _coverage(rng.gamma(4.0, 1.0, (SIMS, 8)) - 4.0, 0.0)
    assert 0.93 <= cover <= 0.97
    mirrored = _coverage(4.0 - rng.gamma(4.0, 1.0, (SIMS, 8)), 0.0)
    assert 0.93 <= mirrored <= 0.97


def test_coverage_at_n8_strongly_skewed_differences_is_below_nominal():
    # The limit the tables' note states: exponential differences (skewness 2) at n = 8 are
    # covered about 89.5 % of the time, not 95 %. A studentized bootstrap (bootstrap-t)
    # measured 94 % there but is 15 % wider on normal differences and erratic at n = 8;
    # the tables keep the t-interval, whose assumption (near-symmetric differences) holds
    # for ours, and say where it stops holding.
    rng = np.random.default_rng(2035)
    cover = _coverage(rng.exponential(1.0, (SIMS, 8)) - 1.0, 0.0)
    assert 0.88 <= cover <= 0.91


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1.0, 1.0), min_size=2, max_size=12),
    st.floats(-1.0, 1.0),
    st.floats(0.1, 10.0),
)
def test_interval_moves_with_a_shift_scales_and_flips(diffs, shift, scale):
    low, high = paired_t_interval(diffs)
    mean = float(np.mean(diffs))
    assert low <= mean + 1e-12 and mean - 1e-12 <= high
    assert high - low == pytest.approx(
        2 * stats.t.ppf(0.975, len(diffs) - 1) * np.std(diffs, ddof=1) / math.sqrt(len(diffs)),
        abs=1e-9,
    )
    assert paired_t_interval([d + shift for d in diffs]) == pytest.approx(
        (low + shift, high + shift), abs=1e-9
    )
    assert paired_t_interval([d * scale for d in diffs]) == pytest.approx(
        (low * scale, high * scale), abs=1e-9
    )
    neg_low, neg_high = paired_t_interval([-d for d in diffs])
    assert (neg_low, neg_high) == pytest.approx((-high, -low), abs=1e-12)
    # a higher level gives a wider interval around the same mean
    wide_low, wide_high = paired_t_interval(diffs, level=0.99)
    assert wide_low <= low + 1e-12 and high - 1e-12 <= wide_high


def test_vectorised_rows_match_one_at_a_time():
    rows = np.random.default_rng(5).standard_normal((7, 5))
    low, high = t_intervals(rows)
    for i, row in enumerate(rows):
        assert paired_t_interval(row.tolist()) == pytest.approx((low[i], high[i]))


def test_detectable_effect_shrinks_with_more_seeds():
    # 2.0 points of SD: about 23 points at 2 seeds, 2.3 at 8 (1.156 x 2), 0.57 at 100
    values = [detectable_effect_in_sd(n) for n in (2, 3, 5, 8, 16, 40, 100)]
    assert all(a > b for a, b in itertools.pairwise(values))
    assert detectable_effect([0.5, 0.5, 0.5]) == 0.0  # no spread: any effect is seen


def test_fewer_than_two_values_and_bad_input():
    assert paired_t_interval([]) is None and paired_t_interval([0.3]) is None
    assert detectable_effect([]) is None and detectable_effect([0.3]) is None
    assert paired_t_interval([0.4, 0.4]) == (0.4, 0.4)  # equal values: zero width
    with pytest.raises(ValueError, match=r"^level must be in \(0, 1\), got 1.5$"):
        paired_t_interval([0.1, 0.2], level=1.5)
    with pytest.raises(ValueError, match="non-finite"):
        paired_t_interval([0.1, float("nan")])
    with pytest.raises(ValueError, match="non-finite"):
        paired_t_interval([float("inf")])
    with pytest.raises(ValueError, match="non-finite"):
        detectable_effect([0.1, float("inf")])
    with pytest.raises(ValueError, match=r"^t_intervals needs at least 2 values per sample$"):
        t_intervals(np.zeros((3, 1)))
    with pytest.raises(ValueError, match=r"^a detectable effect needs n >= 2 values, got 1$"):
        detectable_effect_in_sd(1)
    with pytest.raises(ValueError, match=r"^power must be in \(0, 1\), got 1.0$"):
        detectable_effect_in_sd(8, power=1.0)
    with pytest.raises(ValueError, match=r"^power must exceed alpha \(0.05\), got 0.05$"):
        detectable_effect_in_sd(8, power=0.05)
