"""The dose-response table of the MCGPO pair term, and step 3's rule (issue 35).

Reads the finished runs of ``mcgpo sweep --params algo.lambda_pair --values 0,...`` with
``--set train.pair_probe=true`` (folders ``runs/mcgpo-lambda_pair=<λ>-s<seed>``) and prints,
per λ, the means over seeds of: integrated and final success, the paired integrated
difference against λ = 0, and the pair probe's readouts averaged over each run's updates
(``pairs/weighted_margin_after`` W, ``pairs/accuracy_after`` A, ``pairs/grad_ratio``,
``pairs/grad_cos``, and the in-update ``pairs/margin`` / ``pairs/accuracy``). Then the rule
of docs/results/mcgpo-powered.md step 3: a λ > 0 moves the pairs' ranking if W(λ) > W(0) on
every seed and the mean over seeds of A(λ) − A(0) is at least 0.05; step 4 runs the
smallest such λ (none: step 4 waits).

Run:  python benchmarks/dose_response.py runs/dose-household-mid
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

RUN = re.compile(r"mcgpo-lambda_pair=([0-9.]+)-s(\d+)$")
READOUTS = (
    "pairs/weighted_margin_after",
    "pairs/accuracy_after",
    "pairs/grad_ratio",
    "pairs/grad_cos",
    "pairs/margin",
    "pairs/accuracy",
)


def run_summary(folder: Path) -> dict[str, float]:
    """Integrated and final success (percent) and the readouts' means over the updates."""
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x]
    evals = [100 * r["eval/success"] for r in rows if "eval/success" in r]
    updates = [r for r in rows if "update/rows" in r]
    out = {"integrated": float(np.mean(evals)), "final": evals[-1]}
    for key in READOUTS:
        values = [r[key] for r in updates if key in r]
        out[key] = float(np.mean(values)) if values else float("nan")
    return out


def finished_runs(bench: Path) -> dict[tuple[float, int], dict[str, float]]:
    """(λ, seed) -> summary of every finished run (``bench-done.json``) under bench/runs."""
    out = {}
    for folder in sorted((bench / "runs").glob("mcgpo-lambda_pair=*")):
        match = RUN.match(folder.name)
        if match and (folder / "bench-done.json").is_file():
            out[(float(match.group(1)), int(match.group(2)))] = run_summary(folder)
    return out


def choose_lambda(
    runs: dict[tuple[float, int], dict[str, float]], seeds: list[int]
) -> tuple[float | None, dict[float, tuple[bool, float]]]:
    """Step 3's rule over ``seeds`` (every λ needs every seed): (chosen λ or None, and per
    λ > 0 whether W beat λ = 0 on every seed and the mean A gain)."""
    lambdas = sorted({lam for lam, _ in runs if lam > 0})
    verdict = {}
    for lam in lambdas:
        if not all((lam, s) in runs and (0.0, s) in runs for s in seeds):
            continue
        w = all(
            runs[(lam, s)]["pairs/weighted_margin_after"]
            > runs[(0.0, s)]["pairs/weighted_margin_after"]
            for s in seeds
        )
        gain = float(
            np.mean(
                [
                    runs[(lam, s)]["pairs/accuracy_after"] - runs[(0.0, s)]["pairs/accuracy_after"]
                    for s in seeds
                ]
            )
        )
        verdict[lam] = (w, gain)
    moving = [lam for lam, (w, gain) in verdict.items() if w and gain >= 0.05]
    return (min(moving) if moving else None), verdict


def render(runs: dict[tuple[float, int], dict[str, float]], seeds: list[int]) -> str:
    lines = [
        "| λ | seeds | integrated | final | Δ integrated vs λ=0 | W | A | grad ratio | grad cos "
        "| in-update margin | in-update accuracy |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lam in sorted({lam for lam, _ in runs}):
        mine = [runs[(lam, s)] for s in seeds if (lam, s) in runs]
        base = [
            runs[(0.0, s)]["integrated"] for s in seeds if (lam, s) in runs and (0.0, s) in runs
        ]
        own = [runs[(lam, s)]["integrated"] for s in seeds if (lam, s) in runs and (0.0, s) in runs]

        def mean(key: str, mine: list[dict[str, float]] = mine) -> float:
            values = [m[key] for m in mine if not np.isnan(m[key])]
            return float(np.mean(values)) if values else float("nan")

        delta = float(np.mean(np.subtract(own, base))) if base else float("nan")
        lines.append(
            f"| {lam:g} | {len(mine)} | {mean('integrated'):.1f} | {mean('final'):.1f} | "
            f"{delta:+.1f} | {mean('pairs/weighted_margin_after'):.4f} | "
            f"{mean('pairs/accuracy_after'):.3f} | {mean('pairs/grad_ratio'):.3f} | "
            f"{mean('pairs/grad_cos'):.3f} | {mean('pairs/margin'):.4f} | "
            f"{mean('pairs/accuracy'):.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bench", type=Path, help="the sweep's --out folder")
    p.add_argument("--seeds", default="100,101,102", help="the rule's seeds (all needed)")
    p.add_argument("--values", default="0,1,3,10,30", help="the rule's λ values (all needed)")
    args = p.parse_args(argv)
    if not (args.bench / "runs").is_dir():
        p.error(f"{str(args.bench)!r}: no runs/ folder")
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = finished_runs(args.bench)
    print(render(runs, seeds))
    chosen, verdict = choose_lambda(runs, seeds)
    for lam, (w, gain) in verdict.items():
        print(f"λ = {lam:g}: W above λ = 0 on every seed: {w}; mean A gain {gain:+.3f}")
    values = [float(v) for v in args.values.split(",")]
    missing = [(lam, s) for lam in values for s in seeds if (lam, s) not in runs]
    if missing:
        left = ", ".join(f"λ {lam:g} seed {s}" for lam, s in missing)
        print(f"runs not finished ({left}): the rule is not applied yet", file=sys.stderr)
        return 1
    print(
        f"step 3's rule: λ_pair = {chosen:g}" if chosen else "step 3's rule: no λ moves the ranking"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
