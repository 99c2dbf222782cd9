"""The group-sequential design's tables (issue 35 step 4; docs/sequential.md): the stopping
boundaries at the looks, and the power and expected number of seeds at a few true
differences, beside the fixed-sample t-test at the last look's seed count.

Power two ways: "z" is the canonical integral with the per-seed SD known
(:func:`mcgpo.bench.sequential.design_power`); "t" simulates the procedure a look runs, the
paired t-test against each look's nominal p threshold on normal differences
(:func:`~mcgpo.bench.sequential.simulated_power`, ``--draws`` comparisons, SE printed).

Run:  python benchmarks/sequential_design.py --looks 16,24,32,40 --sigma 2.31 \\
          --deltas 0,0.5,1,1.5,2,2.7
"""

from __future__ import annotations

import argparse
import math

from scipy import stats

from mcgpo.bench.sequential import (
    alpha_spent,
    design_power,
    look_fractions,
    nominal_thresholds,
    simulated_power,
    spending_boundaries,
)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _fixed_t_power(delta: float, sigma: float, n: int, alpha: float) -> float:
    """The fixed-sample two-sided paired t-test's power on n seeds (noncentral t)."""
    crit = stats.t.isf(alpha / 2.0, n - 1)
    nc = delta * math.sqrt(n) / sigma
    # the lower tail as the upper tail of -nc: scipy's nct.cdf far out in the tail is nan
    return float(stats.nct.sf(crit, n - 1, nc) + stats.nct.sf(crit, n - 1, -nc))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--looks", default="16,24,32,40", help="cumulative paired seeds per look")
    p.add_argument("--alpha", type=float, default=0.05, help="overall two-sided level")
    p.add_argument("--kind", default="obrien_fleming", choices=("obrien_fleming", "pocock"))
    p.add_argument("--sigma", default="2.31", help="per-seed SD(s) of the paired differences")
    p.add_argument("--deltas", default="0,0.5,1,1.5,2,2.7", help="true mean differences")
    p.add_argument("--draws", type=int, default=200_000, help="simulated comparisons per row")
    args = p.parse_args()
    looks = [int(x) for x in args.looks.split(",")]
    t = look_fractions(looks)
    c = spending_boundaries(t, args.alpha, args.kind)
    spent = alpha_spent(t, args.alpha, args.kind)
    print(f"Looks {looks}, two-sided alpha {args.alpha:g}, {args.kind} spending\n")
    print("| Look | Seeds | Fraction | α spent (cum.) | z boundary | Nominal p |")
    print("|---|---|---|---|---|---|")
    for k, n in enumerate(looks):
        threshold = float(nominal_thresholds(c[k]))
        print(f"| {k + 1} | {n} | {t[k]:.3f} | {spent[k]:.5f} | {c[k]:.3f} | {threshold:.5f} |")
    print(
        f"\n| σ | δ | Power z | Power t (SE) | Stop per look, t | E[seeds] z | E[seeds] t "
        f"| Fixed {looks[-1]}-seed t-test |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for sigma in _floats(args.sigma):
        for delta in _floats(args.deltas):
            z = design_power(delta, sigma, looks, args.alpha, args.kind)
            sim = simulated_power(delta, sigma, looks, args.alpha, args.kind, draws=args.draws)
            stops = " / ".join(f"{s:.3f}" for s in sim.stop)
            fixed = _fixed_t_power(delta, sigma, looks[-1], args.alpha)
            print(
                f"| {sigma:g} | {delta:g} | {z.power:.3f} | {sim.power:.3f} ({sim.se:.4f}) "
                f"| {stops} | {z.expected_n:.1f} | {sim.expected_n:.1f} | {fixed:.3f} |"
            )


if __name__ == "__main__":
    main()
