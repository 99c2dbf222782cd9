"""One benchmark study from its parsed options: checked, warm-started, run, tabled, carried.

:func:`run_study` is what ``mcgpo bench``, ``ablate`` and ``sweep``
(:mod:`mcgpo.bench.commands`, which name the variants) do once their options are parsed:
the options checked (every mistake one line, exit 2, before any work), the warm start made
once (or ``--model`` used), every (variant, seed) run by :func:`mcgpo.bench.runner.run_plans`,
``results.md`` and the plots written (:mod:`mcgpo.bench.report`), and, with ``--carry``, the
study kept in a second folder as it runs (:mod:`mcgpo.bench.carry`).
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
from typing import NamedTuple

from mcgpo.bench import carry
from mcgpo.bench.report import report_finished, write_results
from mcgpo.bench.runner import (
    RunPlan,
    Variant,
    cli_command,
    load_run_result,
    plan_runs,
    run_plans,
)
from mcgpo.bench.sequential import look_fractions
from mcgpo.training.config import RunConfig
from mcgpo.training.run_commands import COMMANDS

__all__ = [
    "BENCH_SETS",
    "StudyError",
    "StudyOptions",
    "run_study",
    "split_items",
    "study_configs",
    "study_options",
]


def split_items(text: str, flag: str) -> list[str]:
    """A comma-separated option's items; an empty one is one line on stderr and exit 2."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        print(f"mcgpo: error: {flag} is empty", file=sys.stderr)
        raise SystemExit(2)
    return items


class StudyError(Exception):
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


class StudyOptions(NamedTuple):
    """What a study's command line says beyond its variants, checked (:func:`study_options`)."""

    seeds: list[int]
    looks: list[int]  # --sequential's (empty without)
    extra: list[str]  # the --set flags of every training run
    warm_extra: list[str]  # those of them the warm start (mcgpo sft) takes


def study_options(args: argparse.Namespace) -> StudyOptions:
    """The seeds, looks and ``--set`` flags of a parsed study command line and how its options
    combine, checked from the line alone; a mistake is a one-line StudyError."""
    seeds = _seeds(args.seeds)
    extra, warm_extra = _set_flags(args.set)
    looks = _looks(args.sequential)
    if looks and not args.report_only:
        raise StudyError("--sequential needs --report-only (a look reads finished runs)")
    if args.carry is not None and args.report_only:
        raise StudyError("--carry runs a study; to report from a carried folder, give it as --out")
    if args.model is not None and "--model" in warm_extra and not args.report_only:
        raise StudyError("give --model (no warm start) or --set model (warm-start it), not both")
    return StudyOptions(seeds, looks, extra, warm_extra)


def run_study(command: str, args: argparse.Namespace, variants: Sequence[Variant]) -> int:
    """Run ``command``'s study of ``variants`` over ``args.seeds`` as the parsed options say
    (or, with ``--report-only``, re-render its tables); the process's exit code."""
    try:
        seeds, looks, extra, warm_extra = study_options(args)
        if args.report_only:
            out = Path(args.out or f"runs/{command}-{Path(args.preset).stem}")
            return report_finished(command, args.argv, out, variants, seeds, looks)
        if args.model is not None and args.model != "tiny" and not Path(args.model).is_dir():
            raise StudyError(f"--model {args.model!r}: folder not found")
        _check_built(study_configs(args, variants), warm=args.model is None)
        out = _writable_folder(Path(args.out or f"runs/{command}-{Path(args.preset).stem}"))
        kept = _carry_folder(args.carry, out)
    except StudyError as err:
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
    for folder in failed:
        log = Path(folder) / "bench.log"
        print(
            f"mcgpo {command}: run {folder} failed: {_last_line(log)} (see {log})", file=sys.stderr
        )
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


def study_configs(args: argparse.Namespace, variants: Sequence[Variant]) -> list[RunConfig]:
    """Every run's config (the warm start's first, unless ``--model``), resolved as the child
    processes will resolve theirs: a misspelled preset, ``--set`` key or algorithm option is
    found in seconds, not after the warm start; a one-line StudyError. Nothing is built and
    no file is read but the preset (:func:`run_study` then checks the warm start's model
    folder and builds one environment)."""
    from mcgpo.training.algorithms import resolve_algo
    from mcgpo.training.config import ConfigError
    from mcgpo.training.overrides import resolve_command

    extra, warm = _set_flags(args.set)
    try:
        configs = [] if args.model else [resolve_command("sft", ["--preset", args.preset, *warm])]
        for variant in variants:
            cfg = resolve_command("train", ["--preset", args.preset, *extra, *variant.flags])
            resolve_algo(cfg.algo, cfg.rollout.group_size)
            configs.append(cfg)
    except ConfigError as err:
        raise StudyError(str(err)) from None
    return configs


def _check_built(configs: Sequence[RunConfig], warm: bool) -> None:
    """What :func:`study_configs` cannot see from the line: the warm start's model folder
    (``warm``: ``configs[0]`` is the warm start's) and the environment, name and options (one
    built: the variants' are the same)."""
    from mcgpo.training.config import ConfigError
    from mcgpo.training.environments import env_factory

    if warm and configs[0].model != "tiny" and not Path(configs[0].model).is_dir():
        from mcgpo.model_names import hub_id_hint

        hint = hub_id_hint(configs[0].model)
        raise StudyError(f"--set model={configs[0].model}: folder not found{hint}")
    try:
        if configs:
            env_factory(configs[0])
    except ConfigError as err:
        raise StudyError(str(err)) from None


def _last_line(log: Path) -> str:
    """The last line a child process wrote to its log (its error), or ''."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def _seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in split_items(text, "--seeds")]
    except ValueError:
        raise StudyError(f"--seeds must be integers, got {text!r}") from None


def _looks(text: str) -> list[int]:
    """``--sequential``'s looks (empty when not given), checked: whole, >= 2, increasing."""
    if not text:
        return []
    try:
        looks = [int(s) for s in split_items(text, "--sequential")]
    except ValueError:
        raise StudyError(f"--sequential must be integers, got {text!r}") from None
    try:
        look_fractions(looks)
    except ValueError as err:
        raise StudyError(f"--sequential: {err}") from None
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
            raise StudyError(f"--set expects KEY=VALUE, got {item!r}")
        name = key.replace("-", "_")
        if name in BENCH_SETS:
            raise StudyError(
                f"--set {key}: the benchmark sets it for each run ({BENCH_SETS[name]})"
            )
        if name != "model":
            runs += [f"--{key}", value]
        if _warm_start_takes(key):  # e.g. env.name: the warm start must see the same env
            warm += [f"--{key}", value]
    return runs, warm


def _writable_folder(folder: Path, flag: str = "--out") -> Path:
    """``folder``, created if missing; a one-line error naming ``flag`` if it cannot be
    created or written."""
    if folder.exists() and not folder.is_dir():
        raise StudyError(f"{flag} {str(folder)!r} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise StudyError(
            f"{flag} {str(folder)!r}: cannot create or write the folder ({reason})"
        ) from None
    return folder


def _carry_folder(text: str | None, out: Path) -> Path | None:
    """``--carry``'s folder (created, checked writable), restored into ``out``; None without."""
    if text is None:
        return None
    if Path(text).resolve() == out.resolve():
        raise StudyError(f"--carry {text!r} is --out itself; give another folder")
    kept = _writable_folder(Path(text), "--carry")
    try:
        restored = carry.restore(kept, out)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise StudyError(f"--carry {text!r}: cannot restore it into --out ({reason})") from None
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
        log = warm / "bench.log"
        print(f"mcgpo {command}: warm start failed: {_last_line(log)} (see {log})", file=sys.stderr)
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
