"""``mcgpo bench``, ``mcgpo ablate`` and ``mcgpo sweep``: the comparison tables in one command.

All three share one flow (:mod:`mcgpo.bench.study`, on :mod:`mcgpo.bench.runner`): warm
start once, run every
(variant, seed) as its own process from the same warm-started policy, then aggregate the
evaluations into ``results.md`` (mean ± SD over seeds, and each method's paired difference
against GraphGPO, or the first method, with its 95 % paired t-interval and minimum detectable
effect), plots and the raw points. With ``--report-only`` they only re-render ``results.md``,
``evals.jsonl`` and the plots from the finished runs in ``--out`` (:mod:`mcgpo.bench.report`),
and with ``--sequential 16,24,32,40`` add the group-sequential looks at integrated success
(docs/sequential.md). With ``--carry DIR`` the study is kept in DIR as it runs
(:mod:`mcgpo.bench.carry`).

* ``bench``: the methods named by ``--algos`` with their default options.
* ``ablate``: MCGPO's controls (seed 000, "Factorial controls"): opposite-fold vs same-fold
  vs pooled evidence; evidence weighting vs uniform; joint vs state-only vs rubric-only
  matching; exact vs coarse action identity at the coarse level; and GraphGPO + shaping,
  next to GraphGPO and default MCGPO; and issue 25's leave-pair-out + Beta labels
  (``mcgpo/leave_pair_out+beta``, ours). Its results.md adds each row's paired difference
  against default MCGPO (the method a control changes) to the one against GraphGPO.
* ``sweep``: one hyper-parameter of MCGPO at a time around the defaults (epsilon, kappa,
  q_coarse, lambda_pair).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from mcgpo.bench.runner import Variant, default_parallel
from mcgpo.bench.study import run_study, split_items
from mcgpo.command_line import OneLineParser
from mcgpo.options import did_you_mean

__all__ = ["ABLATIONS", "SWEEP", "ablate_main", "bench_main", "parse_study", "sweep_main"]

ABLATIONS: tuple[Variant, ...] = (
    Variant("graphgpo", ("--algo.name", "graphgpo")),
    Variant("mcgpo", ("--algo.name", "mcgpo")),
    Variant("mcgpo/same_fold", ("--algo.name", "mcgpo", "--algo.pairs.evidence", "same_fold")),
    Variant("mcgpo/pooled", ("--algo.name", "mcgpo", "--algo.pairs.evidence", "pooled")),
    Variant("mcgpo/uniform", ("--algo.name", "mcgpo", "--algo.pairs.weighting", "uniform")),
    Variant("mcgpo/state_only", ("--algo.name", "mcgpo", "--algo.pairs.matching", "state_only")),
    Variant("mcgpo/rubric_only", ("--algo.name", "mcgpo", "--algo.pairs.matching", "rubric_only")),
    Variant(
        "mcgpo/coarse_actions=exact",
        ("--algo.name", "mcgpo", "--algo.pairs.coarse_actions", "exact"),
    ),
    Variant("graphgpo+shaping", ("--algo.name", "graphgpo_shaping")),
    # issue 25's label variant (ours): leave-pair-out evidence and Beta-posterior confidence,
    # the one docs/results/mcgpo-label-variants.md's pre-registered rule sends to training
    Variant(
        "mcgpo/leave_pair_out+beta",
        (
            "--algo.name",
            "mcgpo",
            "--algo.pairs.evidence",
            "leave_pair_out",
            "--algo.pairs.weighting",
            "beta",
        ),
    ),
)

# one parameter at a time; the first value of each list is the default
SWEEP: dict[str, tuple[str, ...]] = {
    "algo.pairs.epsilon": ("0.25", "0.0", "0.5"),
    "algo.pairs.kappa": ("1", "0", "4"),
    "algo.pairs.q_coarse": ("0.5", "1.0", "0.25"),
    "algo.lambda_pair": ("10.0", "1.0", "3.0", "30.0"),  # issue 35's dose-response, around 10
}


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = OneLineParser(prog=prog, description=description, allow_abbrev=False)
    p.add_argument(
        "--preset",
        "--config",
        default="household-quick",
        help="training preset, a name or a TOML path (default: %(default)s)",
    )
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default: %(default)s)")
    p.add_argument(
        "--out", default=None, help="benchmark folder (default: runs/<command>-<preset>)"
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=default_parallel(),
        help="runs at once, started seed by seed (default: the number of cores, %(default)s)",
    )
    p.add_argument(
        "--model", default=None, help="start from this policy folder instead of a fresh warm start"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra flag for every training run, e.g. --set train.updates=10 (or, as mcgpo train "
        "takes it, --train.updates 10); the warm start "
        "also gets the env, rollout, sft and eval ones, and model=FOLDER goes to the warm start "
        "only (the policy it fine-tunes); out, seed, threads, progress and resume are the "
        "benchmark's own",
    )
    p.add_argument(
        "--carry",
        default=None,
        metavar="DIR",
        help="keep the study in DIR as it runs (a few MB: finished runs' metrics and configs, "
        "the warm start, tables and plots; no checkpoints): DIR is restored into --out "
        "first, each run is copied there the moment it finishes, the tables at the end; "
        "the same command on a fresh clone resumes from DIR (mcgpo.bench.carry)",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="no warm start, no training: re-render results.md (keeping its header), "
        "evals.jsonl and the plots from the runs of this command line that finished in --out "
        "(their metrics.jsonl; a folder kept by --carry or scripts/bench_carry.py will do)",
    )
    p.add_argument(
        "--sequential",
        default="",
        metavar="LOOKS",
        help="with --report-only: the group-sequential design's looks as cumulative paired "
        "seeds, e.g. 16,24,32,40 (two-sided alpha 0.05, Lan-DeMets O'Brien-Fleming-type "
        "spending); results.md gets a 'Group-sequential look' section: each method's paired "
        "difference of integrated success against the baseline at the look held at its "
        "number of shared seeds, and whether to stop (docs/sequential.md)",
    )
    return p


def bench_main(argv: Sequence[str] | None = None) -> int:
    return run_study("bench", *parse_study("bench", argv))


def ablate_main(argv: Sequence[str] | None = None) -> int:
    return run_study("ablate", *parse_study("ablate", argv))


def sweep_main(argv: Sequence[str] | None = None) -> int:
    return run_study("sweep", *parse_study("sweep", argv))


def parse_study(
    command: str, argv: Sequence[str] | None = None
) -> tuple[argparse.Namespace, list[Variant]]:
    """The options and variants of ``mcgpo <command> <argv>`` (bench, ablate or sweep), as
    :func:`~mcgpo.bench.study.run_study` takes them; nothing is checked on disk or run yet.
    A bad option is one line on stderr and SystemExit(2)."""
    return {"bench": _bench, "ablate": _ablate, "sweep": _sweep}[command](argv)


def _bench(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[Variant]]:
    p = _parser(
        "mcgpo bench",
        "Compare methods over seeds from one warm-started policy. results.md holds success "
        "mean ± SD over seeds and, under it, each method's paired difference against "
        "graphgpo (or the first method): mean over shared seeds, 95 % paired t-interval and "
        "the minimum detectable effect at 80 % power.",
    )
    p.add_argument(
        "--algos",
        default="grpo,gigpo,graphgpo,mcgpo",
        help="comma-separated methods (default: %(default)s)",
    )
    args = _parse(p, argv)
    from mcgpo.training.algorithms import ALGORITHMS

    algos = split_items(args.algos, "--algos")
    unknown = [a for a in algos if a not in ALGORITHMS]
    if unknown:
        p.error(f"unknown algorithm {unknown[0]!r}; known: {', '.join(ALGORITHMS)}")
    return args, [Variant(a, ("--algo.name", a)) for a in algos]


def _ablate(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[Variant]]:
    p = _parser("mcgpo ablate", "MCGPO's factorial controls, in the bench table's format.")
    p.add_argument("--only", default="", help="comma-separated labels to run (default: all)")
    args = _parse(p, argv)
    return args, _only(p, args.only, list(ABLATIONS), "ablation")


def _only(
    p: argparse.ArgumentParser, only: str, variants: list[Variant], what: str
) -> list[Variant]:
    """The variants named by ``--only`` (all when empty), in their declared order."""
    if not only:
        return variants
    wanted = split_items(only, "--only")
    labels = [v.label for v in variants]
    unknown = [w for w in wanted if w not in labels]
    if unknown:
        p.error(f"unknown {what} {unknown[0]!r}; known: {', '.join(labels)}")
    return [v for v in variants if v.label in wanted]


def _sweep(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[Variant]]:
    p = _parser("mcgpo sweep", "MCGPO's hyper-parameters, one at a time around the defaults.")
    p.add_argument("--params", default=",".join(SWEEP), help="which parameters (default: all)")
    p.add_argument(
        "--only",
        default="",
        help="comma-separated labels to run, e.g. mcgpo,mcgpo/lambda_pair=3.0 (default: all)",
    )
    p.add_argument(
        "--values",
        default="",
        help="comma-separated values of the one parameter in --params, run instead of its "
        "built-in list and of the default mcgpo row (e.g. a dose-response: --params "
        "algo.lambda_pair --values 1,3,10,30)",
    )
    p.add_argument(
        "--baseline",
        default="",
        choices=("", "graphgpo"),
        help="also run this method, the paired differences' baseline (default: none)",
    )
    args = _parse(p, argv)
    keys = split_items(args.params, "--params")
    for key in keys:
        if key not in SWEEP:
            p.error(f"unknown sweep parameter {key!r}; known: {', '.join(SWEEP)}")
    variants = [Variant(args.baseline, ("--algo.name", args.baseline))] if args.baseline else []
    if args.values:
        if len(keys) != 1:
            p.error(f"--values needs exactly one parameter in --params, got {len(keys)}")
        points = {keys[0]: tuple(split_items(args.values, "--values"))}
    else:
        variants.append(Variant("mcgpo", ("--algo.name", "mcgpo")))
        points = {key: SWEEP[key][1:] for key in keys}
    for key, values in points.items():
        for value in values:
            variants.append(
                Variant(
                    f"mcgpo/{key.rsplit('.', 1)[-1]}={value}",
                    ("--algo.name", "mcgpo", f"--{key}", value),
                )
            )
    return args, _only(p, args.only, variants, "sweep point")


def _parse(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``p``'s options, with the command line itself as ``argv`` (for the results header).

    A run option in ``mcgpo train``'s form (``--train.lr 1e-3``, ``--train.lr=1e-3``) is taken
    as ``--set train.lr=1e-3``; anything else unknown is one line naming the closest option."""
    given = list(sys.argv[2:] if argv is None else argv)
    args, rest = p.parse_known_args(given)
    i = 0
    while i < len(rest):
        name, eq, value = rest[i].removeprefix("--").partition("=")
        if not rest[i].startswith("--") or "." not in name:
            known = [o for a in p._actions for o in a.option_strings]
            p.error(f"unrecognized argument {rest[i]}{did_you_mean(rest[i], known)}")
        if not eq:
            if i + 1 >= len(rest) or rest[i + 1].startswith("--"):
                p.error(f"option --{name} needs a value")
            value, i = rest[i + 1], i + 1
        args.set.append(f"{name}={value}")
        i += 1
    args.argv = given
    return args
