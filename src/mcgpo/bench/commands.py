"""``mcgpo bench``, ``mcgpo ablate`` and ``mcgpo sweep``: the comparison tables in one command.

All three share one flow (see :mod:`mcgpo.bench.runner`): warm start once, run every
(variant, seed) as its own process from the same warm-started policy, then aggregate the
evaluations into ``results.md`` (mean ± SD over seeds, and each method's paired difference
against GraphGPO, or the first method, with its 95 % paired t-interval and minimum detectable
effect), plots and the raw points. With ``--report-only`` they only re-render ``results.md``
from the finished runs in ``--out`` (:mod:`mcgpo.bench.report`), and with ``--sequential
16,24,32,40`` add the group-sequential look at integrated success (docs/sequential.md).

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
import datetime as dt
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from mcgpo.bench import carry
from mcgpo.bench.report import report_finished, write_results
from mcgpo.bench.runner import (
    RunPlan,
    Variant,
    cli_command,
    default_parallel,
    load_run_result,
    plan_runs,
    run_plans,
)
from mcgpo.bench.sequential import look_fractions
from mcgpo.training.run_commands import COMMANDS

__all__ = ["ABLATIONS", "BENCH_SETS", "SWEEP", "ablate_main", "bench_main", "sweep_main"]

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


class _OneLineParser(argparse.ArgumentParser):
    """Bad input gives one line on stderr and exit code 2 (argparse prints usage too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = _OneLineParser(prog=prog, description=description, allow_abbrev=False)
    p.add_argument(
        "--preset", default="household-quick", help="training preset (default: %(default)s)"
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
        help="extra flag for every training run, e.g. --set train.updates=10; the warm start "
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
        help="no warm start, no training: re-render results.md from the runs of this command "
        "line that finished in --out (their metrics.jsonl; a folder saved by "
        "scripts/bench_carry.py will do), keeping its header; plots and evals.jsonl stay",
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

    algos = _split(args.algos, "--algos")
    unknown = [a for a in algos if a not in ALGORITHMS]
    if unknown:
        p.error(f"unknown algorithm {unknown[0]!r}; known: {', '.join(ALGORITHMS)}")
    variants = [Variant(a, ("--algo.name", a)) for a in algos]
    return _run("bench", args, variants)


def ablate_main(argv: Sequence[str] | None = None) -> int:
    p = _parser("mcgpo ablate", "MCGPO's factorial controls, in the bench table's format.")
    p.add_argument("--only", default="", help="comma-separated labels to run (default: all)")
    args = _parse(p, argv)
    return _run("ablate", args, _only(p, args.only, list(ABLATIONS), "ablation"))


def _only(
    p: argparse.ArgumentParser, only: str, variants: list[Variant], what: str
) -> list[Variant]:
    """The variants named by ``--only`` (all when empty), in their declared order."""
    if not only:
        return variants
    wanted = _split(only, "--only")
    labels = [v.label for v in variants]
    unknown = [w for w in wanted if w not in labels]
    if unknown:
        p.error(f"unknown {what} {unknown[0]!r}; known: {', '.join(labels)}")
    return [v for v in variants if v.label in wanted]


def sweep_main(argv: Sequence[str] | None = None) -> int:
    p = _parser("mcgpo sweep", "MCGPO's hyper-parameters, one at a time around the defaults.")
    p.add_argument("--params", default=",".join(SWEEP), help="which parameters (default: all)")
    p.add_argument(
        "--only",
        default="",
        help="comma-separated labels to run, e.g. mcgpo,mcgpo/lambda_pair=0.3 (default: all)",
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
    keys = _split(args.params, "--params")
    for key in keys:
        if key not in SWEEP:
            p.error(f"unknown sweep parameter {key!r}; known: {', '.join(SWEEP)}")
    variants = [Variant(args.baseline, ("--algo.name", args.baseline))] if args.baseline else []
    if args.values:
        if len(keys) != 1:
            p.error(f"--values needs exactly one parameter in --params, got {len(keys)}")
        points = {keys[0]: tuple(_split(args.values, "--values"))}
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
    return _run("sweep", args, _only(p, args.only, variants, "sweep point"))


def _parse(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``p``'s options, with the command line itself as ``argv`` (for the results header)."""
    given = list(sys.argv[2:] if argv is None else argv)
    args = p.parse_args(given)
    args.argv = given
    return args


def _split(text: str, flag: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        print(f"mcgpo: error: {flag} is empty", file=sys.stderr)
        raise SystemExit(2)
    return items


class _BadInput(Exception):
    """A bad benchmark option; reported as one line with exit code 2."""


# Run options the benchmark sets on each run itself; `--set` of one is an error that names
# the benchmark's own option for it.
BENCH_SETS: dict[str, str] = {
    "out": "use --out",
    "seed": "use --seeds",
    "threads": "they follow --parallel",
    "progress": "runs log to bench.log",
    "resume": "a half-finished run is resumed by itself",
}


def _run(command: str, args: argparse.Namespace, variants: Sequence[Variant]) -> int:
    try:
        seeds = _seeds(args.seeds)
        extra, warm_extra = _set_flags(args.set)
        looks = _looks(args.sequential)
        if looks and not args.report_only:
            raise _BadInput("--sequential needs --report-only (a look reads finished runs)")
        if args.carry is not None and args.report_only:
            raise _BadInput(
                "--carry runs a study; to report from a carried folder, give it as --out"
            )
        if args.report_only:
            out = Path(args.out or f"runs/{command}-{Path(args.preset).stem}")
            return report_finished(command, args.argv, out, variants, seeds, looks)
        if args.model is not None and "--model" in warm_extra:
            raise _BadInput("give --model (no warm start) or --set model (warm-start it), not both")
        if args.model is not None and args.model != "tiny" and not Path(args.model).is_dir():
            raise _BadInput(f"--model {args.model!r}: folder not found")
        out = _writable_folder(Path(args.out or f"runs/{command}-{Path(args.preset).stem}"))
        kept = _carry_folder(args.carry, out)
    except _BadInput as err:
        print(f"mcgpo {command}: error: {err}", file=sys.stderr)
        return 2
    common = ["--preset", args.preset]
    parallel = max(1, args.parallel)
    threads = max(1, (os.cpu_count() or 1) // parallel)
    model = args.model
    if model is None:
        model = _warm_start(command, out / "warmstart", [*common, *warm_extra])
        if model is None:
            return 1
        if kept is not None:
            carry.carry_warm_start(out, kept)
    plans = plan_runs(
        variants, seeds, out, common=[*common, *extra, "--model", model], threads=threads
    )
    print(f"[{command}] {len(plans)} runs, {parallel} at once, in {out / 'runs'}", file=sys.stderr)
    on_done = None if kept is None else _carrier(command, out, kept)
    codes = run_plans(plans, parallel=parallel, on_done=on_done)
    failed = [str(f) for f, c in codes.items() if c != 0]
    finished = [p for p in plans if codes.get(p.folder) == 0]
    if not finished:
        print(f"mcgpo {command}: no run finished; see the bench.log files", file=sys.stderr)
        return 1
    runs = [load_run_result(p.variant.label, p.seed, p.folder) for p in finished]
    header = [
        f"Command: `mcgpo {command} {' '.join(args.argv)}`".rstrip(),
        f"Preset: `{args.preset}`; seeds: {', '.join(map(str, seeds))}; "
        f"machine: {platform.machine()} {os.cpu_count()} cores, {platform.system()}; "
        f"date: {dt.date.today().isoformat()}.",
    ]
    if failed:
        header.append(f"Runs that failed and are left out: {', '.join(failed)}.")
    write_results(command, out, runs, header)
    if kept is not None:
        try:
            carry.save(out, kept)
        except OSError as err:
            reason = err.strerror or type(err).__name__
            print(f"mcgpo {command}: error: could not carry to {kept} ({reason})", file=sys.stderr)
            return 1
        print(f"[{command}] carried to {kept}", file=sys.stderr)
    return 0 if not failed else 1


def _seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in _split(text, "--seeds")]
    except ValueError:
        raise _BadInput(f"--seeds must be integers, got {text!r}") from None


def _looks(text: str) -> list[int]:
    """``--sequential``'s looks (empty when not given), checked: whole, >= 2, increasing."""
    if not text:
        return []
    try:
        looks = [int(s) for s in _split(text, "--sequential")]
    except ValueError:
        raise _BadInput(f"--sequential must be integers, got {text!r}") from None
    try:
        look_fractions(looks)
    except ValueError as err:
        raise _BadInput(f"--sequential: {err}") from None
    return looks


def _set_flags(items: Sequence[str]) -> tuple[list[str], list[str]]:
    """The ``--set KEY=VALUE`` items as flags for the training runs and for the warm start.

    ``model`` goes to the warm start only (the policy it fine-tunes; the runs start from the
    warm-started one); keys the warm start (``mcgpo sft``) does not take go to the runs only.
    """
    runs, warm = [], []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _BadInput(f"--set expects KEY=VALUE, got {item!r}")
        name = key.replace("-", "_")
        if name in BENCH_SETS:
            raise _BadInput(f"--set {key}: the benchmark sets it for each run ({BENCH_SETS[name]})")
        if name != "model":
            runs += [f"--{key}", value]
        if _warm_start_takes(key):  # e.g. env.name: the warm start must see the same env
            warm += [f"--{key}", value]
    return runs, warm


def _writable_folder(folder: Path, flag: str = "--out") -> Path:
    """``folder``, created if missing; a one-line error naming ``flag`` if it cannot be
    created or written."""
    if folder.exists() and not folder.is_dir():
        raise _BadInput(f"{flag} {str(folder)!r} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise _BadInput(
            f"{flag} {str(folder)!r}: cannot create or write the folder ({reason})"
        ) from None
    return folder


def _carry_folder(text: str | None, out: Path) -> Path | None:
    """``--carry``'s folder (created, checked writable), restored into ``out``; None without."""
    if text is None:
        return None
    if Path(text).resolve() == out.resolve():
        raise _BadInput(f"--carry {text!r} is --out itself; give another folder")
    kept = _writable_folder(Path(text), "--carry")
    try:
        restored = carry.restore(kept, out)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise _BadInput(f"--carry {text!r}: cannot restore it into --out ({reason})") from None
    if restored:
        print(f"[carry] {len(restored)} files restored from {kept} into {out}", file=sys.stderr)
    return kept


def _carrier(command: str, out: Path, kept: Path) -> Callable[[RunPlan], None]:
    """``run_plans``' ``on_done`` for ``--carry``: copy the finished run into ``kept``. A copy
    that fails (a full or vanished disk) is reported in one line and does not stop the runs
    still going: the run stays finished in ``--out``, and the save at the end tries again."""

    def carry_one(plan: RunPlan) -> None:
        try:
            carry.carry_run(plan.folder, out, kept)
        except OSError as err:
            reason = err.strerror or type(err).__name__
            print(
                f"[{command}] could not carry {plan.folder.name} to {kept} ({reason}); "
                "it stays in --out and is carried again at the end",
                file=sys.stderr,
            )

    return carry_one


def _warm_start(command: str, warm: Path, flags: Sequence[str]) -> str | None:
    """The warm-started model folder (made by ``mcgpo sft`` unless it exists); None if the
    warm start failed (reported on stderr)."""
    model = warm / "model"
    if model.exists():
        return str(model)
    print(f"[{command}] warm start -> {warm}", file=sys.stderr)
    # the warm start is one process alone: it gets every core
    codes = run_plans([_warm_plan(warm, flags, max(1, os.cpu_count() or 1))], parallel=1)
    if codes[warm] != 0:
        print(f"mcgpo {command}: warm start failed, see {warm / 'bench.log'}", file=sys.stderr)
        return None
    return str(model)


def _warm_start_takes(key: str) -> bool:
    """Whether ``mcgpo sft`` accepts the ``--set`` key (env.*, rollout.*, sft.*, eval.*, and
    the run options it has, e.g. corpus-episodes and model); train-only keys and those the
    benchmark sets itself (:data:`BENCH_SETS`) stay out of it."""
    sft = COMMANDS["sft"]
    section, dot, _ = key.partition(".")
    if dot:
        return section in sft.sections
    name = key.replace("-", "_")
    return name in sft.tops and name not in BENCH_SETS


def _warm_plan(warm: Path, common: Sequence[str], threads: int) -> RunPlan:
    argv = cli_command(
        "sft", *common, "--out", str(warm), "--threads", str(threads), "--progress", "false"
    )
    return RunPlan(Variant("warmstart", ()), 0, warm, tuple(argv))
