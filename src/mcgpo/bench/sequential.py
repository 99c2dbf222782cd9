"""Group-sequential paired comparison: stopping boundaries, a look's decision, the power.

Issue 35 step 4 compares MCGPO against GraphGPO on paired seeds with interim looks (at 16,
24, 32 and 40 seeds): after each look the comparison stops if the paired difference of
integrated success is beyond that look's boundary, else it goes on, and at the last look it
ends either way. Looking four times at a 5 % test would reject a true null far more often
than 5 %; the boundaries below keep the overall two-sided error at α.

**The canonical process** (Jennison & Turnbull 2000, *Group Sequential Methods with
Applications to Clinical Trials*, ch. 3). With ``n_k`` seeds at look k out of ``n_K`` at the
last, the information fraction is ``t_k = n_k / n_K`` and the z statistics ``Z_1..Z_K`` of the
cumulative means are jointly normal with ``Corr(Z_i, Z_j) = sqrt(t_i / t_j)`` (i <= j) and,
when the true mean difference is δ with per-seed SD σ, means ``θ sqrt(t_k)`` with the drift
``θ = δ sqrt(n_K) / σ`` (0 under the null).

**Alpha spending** (Lan & DeMets 1983, Biometrika 70:659). A spending function α*(t) rises
from 0 to α; the boundary ``c_k`` solves, under the null,
``P(|Z_1| < c_1, ..., |Z_{k-1}| < c_{k-1}, |Z_k| >= c_k) = α*(t_k) - α*(t_{k-1})``, i.e. the
continuation probability ``P(|Z_j| < c_j, j <= k)`` is ``1 - α*(t_k)``. The boundaries at
the looks so far depend only on the fractions so far, so a look held at another seed count
than planned (a failed seed) just uses its own fraction. Two spending functions, both
symmetric two-sided at total level α (each side spends half):

* ``obrien_fleming``: each side spends ``2 - 2 Φ(z_{1-α/4} / sqrt(t))``, the Lan–DeMets
  O'Brien–Fleming-type function at one-sided level α/2, so the total is
  ``α*(t) = 4 (1 - Φ(z_{1-α/4} / sqrt(t)))``. This is what the R packages ldbounds
  (``bounds(t, iuse=1, alpha=0.05, side=2)``) and gsDesign (``sfLDOF``) compute, and it gives
  their published boundaries (4.333, 2.963, 2.359, 2.014 at four equally spaced looks,
  α = 0.05; DeMets & Lan 1994, Stat. Med. 13:1341). Reading the same formula with α/2 in
  place of α/4 as the *total* two-sided spend gives other, lower early boundaries (2.772,
  1.979 at two looks) that match no table;
* ``pocock``: ``α*(t) = α log(1 + (e - 1) t)`` (Lan–DeMets Pocock-type).

The probabilities of the box ``|Z_j| < c_j`` are scipy's multivariate normal CDF (Genz's
quasi-Monte Carlo integration, absolute error about 1e-6, a fixed generator so results
repeat) and each boundary is a Brent root between two bounds that hold for any
correlation: ``z_{1 - α*(t_k)/2} <= c_k <= z_{1 - (α*(t_k) - α*(t_{k-1}))/2}``.

**A look** (:func:`evaluate_look`). The boundaries are for known σ; with 16 to 40 seeds σ
is estimated, so, as is usual for small samples, each boundary is carried to the p-value
scale: the look's nominal threshold is ``p_k = 2 (1 - Φ(c_k))`` and the paired t-test's
two-sided p-value (n - 1 df) is compared with it. The look's repeated confidence interval
(Jennison & Turnbull ch. 9) is the t-interval at level 1 - p_k,
``mean ± t_{1 - p_k/2, n-1} SD / sqrt(n)``: it excludes 0 exactly when the look stops.

**Power** (:func:`design_power`: the canonical integral, σ known; :func:`simulated_power`:
the t-test procedure itself on normal differences, by simulation). Both give the stopping
probability at each look and the expected number of seeds.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize, stats

__all__ = [
    "SPENDING_KINDS",
    "Decision",
    "DesignPower",
    "LookResult",
    "alpha_spent",
    "design_power",
    "evaluate_look",
    "look_fractions",
    "look_index",
    "nominal_thresholds",
    "simulated_power",
    "spending_boundaries",
]

SPENDING_KINDS = ("obrien_fleming", "pocock")
_CDF_ABSEPS = 1e-6  # absolute error of scipy's multivariate normal CDF (Genz QMC)
_CDF_SEED = 20261204  # the CDF's quasi-Monte Carlo generator: fixed, so boundaries repeat


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


def _check_kind(kind: str) -> None:
    if kind not in SPENDING_KINDS:
        raise ValueError(f"unknown spending kind {kind!r}; known: {', '.join(SPENDING_KINDS)}")


def _check_fractions(fractions: ArrayLike) -> np.ndarray:
    t = np.asarray(fractions, dtype=np.float64).reshape(-1)
    if t.size == 0:
        raise ValueError("information fractions: none given")
    if not np.all(np.isfinite(t)) or t[0] <= 0.0:
        raise ValueError(f"information fractions must be finite and > 0, got {t.tolist()}")
    if np.any(np.diff(t) <= 0.0):
        raise ValueError(f"information fractions must increase, got {t.tolist()}")
    if not math.isclose(t[-1], 1.0, rel_tol=0.0, abs_tol=1e-12):
        raise ValueError(f"the last information fraction must be 1, got {t[-1]:g}")
    return t


def look_fractions(looks: Sequence[int]) -> np.ndarray:
    """The information fractions ``n_k / n_K`` of looks at ``looks`` (cumulative seed counts,
    increasing, each >= 2)."""
    n = [int(x) for x in looks]
    if not n:
        raise ValueError("looks: none given")
    if any(x != y for x, y in zip(n, looks, strict=True)) or n[0] < 2:
        raise ValueError(f"looks must be whole seed counts >= 2, got {list(looks)}")
    if any(b <= a for a, b in itertools.pairwise(n)):
        raise ValueError(f"looks must increase, got {n}")
    return np.asarray(n, dtype=np.float64) / n[-1]


def alpha_spent(
    fractions: ArrayLike, alpha: float = 0.05, kind: str = "obrien_fleming"
) -> np.ndarray:
    """The two-sided α spent up to each information fraction (cumulative, α at t = 1)."""
    _check_alpha(alpha)
    _check_kind(kind)
    t = np.asarray(fractions, dtype=np.float64)
    if kind == "pocock":
        return alpha * np.log1p((math.e - 1.0) * t)
    return 4.0 * stats.norm.sf(stats.norm.isf(alpha / 4.0) / np.sqrt(t))


def _correlation(t: np.ndarray) -> np.ndarray:
    """Corr(Z_i, Z_j) = sqrt(t_min / t_max) of the canonical process."""
    return np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))


def _continuation(c: np.ndarray, t: np.ndarray, drift: float = 0.0) -> float:
    """P(|Z_j| < c_j for every j) for the canonical process at fractions ``t`` with drift θ."""
    mean = drift * np.sqrt(t)
    if c.size == 1:
        return float(stats.norm.cdf(c[0] - mean[0]) - stats.norm.cdf(-c[0] - mean[0]))
    cdf = stats.multivariate_normal.cdf(
        c,
        mean=mean,
        cov=_correlation(t),
        lower_limit=-c,
        abseps=_CDF_ABSEPS,
        releps=0.0,
        rng=np.random.default_rng(_CDF_SEED),
    )
    return float(cdf)


@lru_cache(maxsize=64)
def _boundaries(t: tuple[float, ...], alpha: float, kind: str) -> tuple[float, ...]:
    spent = alpha_spent(np.asarray(t), alpha, kind)
    frac = np.asarray(t)
    c: list[float] = []
    for k in range(len(t)):
        if k == 0:
            c.append(float(stats.norm.isf(spent[0] / 2.0)))
            continue
        # crossing at k alone is at least 2(1 - Φ(c)) - α*(t_{k-1}) and at most 2(1 - Φ(c)):
        # the root lies between the two z quantiles below (widened for the CDF's error)
        low = float(stats.norm.isf(spent[k] / 2.0)) - 1e-3
        high = float(stats.norm.isf((spent[k] - spent[k - 1]) / 2.0)) + 1e-3
        target = 1.0 - spent[k]
        prev = np.asarray(c)

        def excess(x: float, prev: np.ndarray = prev, k: int = k, target: float = target) -> float:
            return _continuation(np.append(prev, x), frac[: k + 1]) - target

        c.append(float(optimize.brentq(excess, low, high, xtol=1e-6)))
    return tuple(c)


def spending_boundaries(
    fractions: ArrayLike, alpha: float = 0.05, kind: str = "obrien_fleming"
) -> np.ndarray:
    """The two-sided z boundaries c_k at information fractions ``fractions`` (increasing,
    last 1) for total two-sided level ``alpha`` and the Lan–DeMets spending function
    ``kind`` (``obrien_fleming`` or ``pocock``; see the module docstring): the null
    probability of stopping first at look k is ``α*(t_k) - α*(t_{k-1})``."""
    t = _check_fractions(fractions)
    _check_alpha(alpha)
    _check_kind(kind)
    return np.asarray(_boundaries(tuple(t.tolist()), float(alpha), kind))


def nominal_thresholds(boundaries_z: ArrayLike) -> np.ndarray:
    """The nominal two-sided p-value thresholds ``2 (1 - Φ(c_k))`` of z boundaries."""
    return 2.0 * stats.norm.sf(np.asarray(boundaries_z, dtype=np.float64))


def look_index(n: int, looks: Sequence[int]) -> int:
    """The 0-based index of the look held at ``n`` paired seeds; a one-line ValueError when
    ``n`` is not one of ``looks``."""
    look_fractions(looks)
    if n not in looks:
        planned = ", ".join(map(str, looks))
        raise ValueError(f"{n} paired seeds is not a planned look ({planned})")
    return list(looks).index(n)


class Decision(enum.Enum):
    """What a look decides; differences are method minus baseline."""

    METHOD_BETTER = "stop: method better"
    BASELINE_BETTER = "stop: baseline better"
    CONTINUE = "continue"
    NO_DIFFERENCE = "final: no difference shown"

    def text(self, method: str = "method", baseline: str = "baseline") -> str:
        """The decision with the arms' names, e.g. ``stop: mcgpo better``."""
        if self is Decision.METHOD_BETTER:
            return f"stop: {method} better"
        if self is Decision.BASELINE_BETTER:
            return f"stop: {baseline} better"
        return self.value


@dataclass(frozen=True)
class LookResult:
    """One look at n paired differences (method minus baseline).

    ``look`` is 1-based out of ``looks``; ``t`` is the paired t statistic and ``p`` its
    two-sided p-value (n - 1 df); ``threshold`` the look's nominal p-value boundary; the
    ``interval`` is the repeated confidence interval at level ``1 - threshold``."""

    look: int
    looks: int
    n: int
    mean: float
    sd: float
    t: float
    p: float
    threshold: float
    boundary_z: float
    decision: Decision
    interval: tuple[float, float]

    @property
    def level(self) -> float:
        """The repeated confidence interval's level, 1 - threshold."""
        return 1.0 - self.threshold


def evaluate_look(
    differences: Sequence[float], boundaries_z: ArrayLike, look_index: int
) -> LookResult:
    """The decision at look ``look_index`` (0-based) of a design with z boundaries
    ``boundaries_z``, from the paired differences available then: stop when the paired
    t-test's two-sided p-value is at most the look's nominal threshold (towards the side of
    the mean), else continue, or at the last look end with no difference shown."""
    d = np.asarray(list(differences), dtype=np.float64)
    c = np.asarray(boundaries_z, dtype=np.float64).reshape(-1)
    if d.size < 2:
        raise ValueError(f"a look needs at least 2 paired differences, got {d.size}")
    if not np.all(np.isfinite(d)):
        raise ValueError("a look's paired differences must be finite")
    if c.size == 0 or not np.all(np.isfinite(c)) or np.any(c <= 0.0):
        raise ValueError(f"boundaries must be finite and > 0, got {c.tolist()}")
    if not 0 <= look_index < c.size:
        raise ValueError(f"look index {look_index} is outside the design's {c.size} looks")
    n = int(d.size)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    threshold = float(nominal_thresholds(c[look_index]))
    se = sd / math.sqrt(n)
    if se > 0.0:
        t = mean / se
        p = float(2.0 * stats.t.sf(abs(t), n - 1))
    else:  # all differences equal: no spread, the sign is certain unless the mean is 0
        t = math.copysign(math.inf, mean) if mean != 0.0 else 0.0
        p = 0.0 if mean != 0.0 else 1.0
    half = float(stats.t.isf(threshold / 2.0, n - 1)) * se
    if p <= threshold:
        decision = Decision.METHOD_BETTER if mean > 0 else Decision.BASELINE_BETTER
    elif look_index == c.size - 1:
        decision = Decision.NO_DIFFERENCE
    else:
        decision = Decision.CONTINUE
    return LookResult(
        look=look_index + 1,
        looks=int(c.size),
        n=n,
        mean=mean,
        sd=sd,
        t=float(t),
        p=p,
        threshold=threshold,
        boundary_z=float(c[look_index]),
        decision=decision,
        interval=(mean - half, mean + half),
    )


@dataclass(frozen=True)
class DesignPower:
    """Operating characteristics of a design at one true difference.

    ``power``: the probability of stopping at some look for a difference (either side);
    ``stop``: the probability of stopping first at each look (the last look's entry is the
    probability of rejecting there, so ``sum(stop) == power``); ``expected_n``: the expected
    number of paired seeds; ``se``: the Monte-Carlo SE of ``power`` (0 when computed)."""

    power: float
    stop: tuple[float, ...]
    expected_n: float
    se: float = 0.0


def _expected_n(looks: Sequence[int], stop: Sequence[float]) -> float:
    reach_last = 1.0 - sum(stop[:-1])
    return float(
        sum(n * s for n, s in zip(looks[:-1], stop[:-1], strict=True)) + looks[-1] * reach_last
    )


def _check_effect(delta: float, sigma: float) -> None:
    if not math.isfinite(delta):
        raise ValueError(f"delta must be finite, got {delta}")
    if not (math.isfinite(sigma) and sigma > 0.0):
        raise ValueError(f"sigma must be finite and > 0, got {sigma}")


def design_power(
    delta: float,
    sigma: float,
    looks: Sequence[int],
    alpha: float = 0.05,
    kind: str = "obrien_fleming",
) -> DesignPower:
    """Power and expected seeds of the design with looks at ``looks`` seeds, for a true mean
    difference ``delta`` with per-seed SD ``sigma`` known (the canonical process with drift
    ``delta sqrt(n_K) / sigma``; the z-test, so slightly above the t-test procedure's)."""
    _check_effect(delta, sigma)
    t = look_fractions(looks)
    c = spending_boundaries(t, alpha, kind)
    drift = delta * math.sqrt(looks[-1]) / sigma
    cont = [1.0] + [_continuation(c[: k + 1], t[: k + 1], drift) for k in range(len(t))]
    stop = tuple(max(0.0, cont[k] - cont[k + 1]) for k in range(len(t)))
    return DesignPower(power=1.0 - cont[-1], stop=stop, expected_n=_expected_n(looks, stop))


def simulated_power(
    delta: float,
    sigma: float,
    looks: Sequence[int],
    alpha: float = 0.05,
    kind: str = "obrien_fleming",
    *,
    draws: int = 200_000,
    seed: int = 0,
) -> DesignPower:
    """Power and expected seeds of the procedure :func:`evaluate_look` runs (paired t-test
    against each look's nominal p threshold), by simulating ``draws`` comparisons of normal
    differences with mean ``delta`` and SD ``sigma`` (vectorised, in chunks)."""
    _check_effect(delta, sigma)
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    t = look_fractions(looks)
    p_k = nominal_thresholds(spending_boundaries(t, alpha, kind))
    n_k = np.asarray(looks, dtype=np.int64)
    crit = stats.t.isf(p_k / 2.0, n_k - 1)  # |t| >= crit  <=>  p <= p_k
    rng = np.random.default_rng(seed)
    first = np.empty(draws, dtype=np.int64)  # first look that rejects; len(looks) for none
    chunk = max(1, 4_000_000 // int(n_k[-1]))
    for lo in range(0, draws, chunk):
        x = rng.normal(delta, sigma, size=(min(chunk, draws - lo), int(n_k[-1])))
        hit = np.column_stack(
            [np.abs(_t_stats(x[:, :n])) >= cv for n, cv in zip(n_k, crit, strict=True)]
        )
        first[lo : lo + x.shape[0]] = np.where(hit.any(axis=1), hit.argmax(axis=1), len(n_k))
    counts = np.bincount(first, minlength=len(n_k) + 1) / draws
    stop = tuple(float(s) for s in counts[:-1])
    power = float(sum(stop))
    return DesignPower(
        power=power,
        stop=stop,
        expected_n=_expected_n(looks, stop),
        se=math.sqrt(power * (1.0 - power) / draws),
    )


def _t_stats(x: np.ndarray) -> np.ndarray:
    """The one-sample t statistic of each row (inf-signed where a row has no spread)."""
    n = x.shape[1]
    with np.errstate(divide="ignore", invalid="ignore"):
        return x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(n))
