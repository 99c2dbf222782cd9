"""Re-check of the powered comparison's numbers (issue 42) from the carried runs.

Reads ``docs/results/powered-household-mid`` (``evals.jsonl``: every evaluation of the 80
runs; ``runs/mcgpo-s*/metrics.jsonl``: the pair probe) and prints what the README and
docs/results/mcgpo-powered.md state about it:

* the paired difference MCGPO − GraphGPO at each look (16, 24, 32, 40 seeds), integrated
  success (the mean of the evaluations at updates 0, 4, 8, 12) and final success, with the
  95 % t-interval and the fixed-n MDE (80 % power, two-sided 5 %) at 40 seeds;
* how much the update-0 evaluation (the same in both arms of a seed) shrinks an effect on
  the integrated scale: the integrated difference against the mean of the three later
  points' differences;
* the power of the pre-registered sequential design (O'Brien–Fleming-type looks at 16, 24,
  32, 40; ``mcgpo.bench.sequential.simulated_power``) for a true gain in final success of
  +0.47, +1.0 and +1.46 points (the paper's range) at the observed SD of the paired final
  difference;
* the pair probe over the 40 MCGPO runs: ``pairs/grad_ratio`` (the pair term's gradient
  norm over the task term's, on each update's first optimiser step) and ``pairs/grad_cos``,
  as the mean of each run's mean (the convention of benchmarks/dose_response.py) and pooled
  over updates.

Run:  python benchmarks/powered_recheck.py [docs/results/powered-household-mid]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

from mcgpo.bench.sequential import simulated_power

LOOKS = (16, 24, 32, 40)
EVAL_UPDATES = (0, 4, 8, 12)
PAPER_GAINS = (0.47, 1.0, 1.46)


def paired(evals: list[dict]) -> dict[str, np.ndarray]:
    """Per seed (sorted), in points: the MCGPO − GraphGPO difference of each evaluation."""
    success: dict[tuple[str, int, int], float] = {}
    for e in evals:
        success[(e["method"], e["seed"], e["update"])] = 100 * e["success"]
    seeds = sorted({s for m, s, _ in success if m == "mcgpo"})
    diff = np.array(
        [
            [success[("mcgpo", s, u)] - success[("graphgpo", s, u)] for u in EVAL_UPDATES]
            for s in seeds
        ]
    )
    return {"seeds": np.array(seeds), "points": diff}


def t_interval(x: np.ndarray) -> tuple[float, float, float, float]:
    """Mean, 95 % t-interval, and the fixed-n MDE (80 % power, two-sided 5 %)."""
    n, sd = len(x), float(np.std(x, ddof=1))
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    mde = (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.80, n - 1)) * sd / math.sqrt(n)
    return float(np.mean(x)), float(np.mean(x) - half), float(np.mean(x) + half), mde


def probe(folder: Path, seeds: int) -> dict[str, float]:
    """The pair probe over the MCGPO runs of the first ``seeds`` seeds (200, 201, ...)."""
    run_ratio, run_cos, pooled_ratio, pooled_cos = [], [], [], []
    for path in sorted(folder.glob("runs/mcgpo-s*/metrics.jsonl")):
        if int(path.parent.name.rsplit("-s", 1)[1]) >= 200 + seeds:
            continue
        records = [json.loads(line) for line in path.read_text().splitlines() if line]
        ratio = [r["pairs/grad_ratio"] for r in records if "pairs/grad_ratio" in r]
        cos = [r["pairs/grad_cos"] for r in records if "pairs/grad_cos" in r]
        run_ratio.append(np.mean(ratio))
        run_cos.append(np.mean(cos))
        pooled_ratio += ratio
        pooled_cos += cos
    return {
        "runs": len(run_ratio),
        "grad_ratio (mean of run means)": float(np.mean(run_ratio)),
        "grad_ratio (pooled over updates)": float(np.mean(pooled_ratio)),
        "grad_cos (mean of run means)": float(np.mean(run_cos)),
        "grad_cos (pooled over updates)": float(np.mean(pooled_cos)),
    }


def main(folder: Path) -> None:
    evals = [json.loads(line) for line in (folder / "evals.jsonl").read_text().splitlines() if line]
    data = paired(evals)
    points = data["points"]
    integrated, final = points.mean(axis=1), points[:, -1]
    print("| look | n | Δ integrated | Δ final [95 % t] |")
    print("|---|---|---|---|")
    for n in LOOKS:
        m, lo, hi, _ = t_interval(final[:n])
        print(
            f"| {LOOKS.index(n) + 1} | {n} | {integrated[:n].mean():+.2f} | {m:+.2f} [{lo:+.2f}, {hi:+.2f}] |"
        )
    for name, x in (("integrated", integrated), ("final", final)):
        m, lo, hi, mde = t_interval(x)
        sd = float(np.std(x, ddof=1))
        print(f"{name}: {m:+.2f} [{lo:+.2f}, {hi:+.2f}], paired SD {sd:.2f}, MDE {mde:.2f}")
    later = points[:, 1:].mean(axis=1)
    print(
        f"update 0 identical in both arms: max |Δ at update 0| = {np.abs(points[:, 0]).max():.2f}; "
        f"integrated = 3/4 of the later points' mean ({integrated.mean():+.3f} vs "
        f"{later.mean():+.3f} x 0.75 = {0.75 * later.mean():+.3f})"
    )
    sd_final = float(np.std(final, ddof=1))
    for gain in PAPER_GAINS:
        power = simulated_power(gain, sd_final, LOOKS, draws=200_000, seed=0)
        print(f"sequential design, final success, true gain {gain:+.2f}: power {power.power:.2f}")
    for n in LOOKS:
        shown = ", ".join(f"{k} {v:.3f}" for k, v in probe(folder, n).items() if k != "runs")
        print(f"pair probe, look {LOOKS.index(n) + 1} ({n} runs): {shown}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/results/powered-household-mid"))
