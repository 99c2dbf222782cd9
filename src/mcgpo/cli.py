"""The ``mcgpo`` command and its ten subcommands.

* ``sft``, ``train``, ``eval``: the run commands. Every field of
  :class:`~mcgpo.training.config.RunConfig` that the command takes
  (:data:`~mcgpo.training.run_commands.COMMANDS`) is a flag: top-level fields as ``--model``,
  ``--out``, ``--save-rollouts``; section fields dotted (``--train.lr 1e-4``). Estimator
  options are ``--algo.<option>`` (or ``--algo.<estimator>.<option>``: only for the
  algorithms that run that estimator) and MCGPO preference options
  ``--algo.pairs.<option>``, checked against the chosen algorithm; environment options are
  ``--env.<option>``. Every flag may also be given as ``--KEY=VALUE`` or
  ``--set KEY=VALUE`` (as ``mcgpo bench`` takes them); ``--config`` is ``--preset``. Values
  resolve as dataclass defaults < ``--preset`` < flags, with the run folder's
  ``config.toml`` in place of the defaults for ``train --resume`` and for ``eval`` of a run
  (``--run DIR``, or inferred from ``--model``/``--out``):
  :mod:`mcgpo.training.overrides`. The runs themselves are library calls
  (``mcgpo.train``, ``run_sft``, ``run_eval``): this module only parses and prints.
* ``report``: the held-out success of run folders side by side.
* ``presets``: the shipped presets, each with the command on its first line.
* ``bench``, ``ablate``, ``sweep`` (:mod:`mcgpo.bench.commands`), ``alfworld-generate``
  (the alfworld extra) and ``env serve`` (:mod:`mcgpo.envs.serving.command`, the serve
  extra) parse their own options.

A bad command line (unknown option, bad value, unknown algorithm, missing model folder, no
checkpoint to resume) prints one line on stderr and exits with code 2, never a traceback;
an unknown name gets the closest known one ("did you mean"). These mistakes, every ``--help``,
``presets`` and ``report`` are answered before torch or transformers is imported: heavy
imports stay inside the functions that run or load something.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from mcgpo.options import did_you_mean
from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.config_layout import field_type, scalar_fields
from mcgpo.training.run_commands import COMMANDS

__all__ = ["COMMANDS", "build_parser", "main", "resolve"]

SECTION_TITLES = {
    "env": "environment",
    "rollout": "rollout (sampling and prompts)",
    "algo": "algorithm",
    "train": "optimisation (PPO update)",
    "eval": "evaluation",
    "sft": "warm start (supervised fine-tuning on expert demonstrations)",
}


class UsageError(Exception):
    """A command-line mistake; reported as one line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage)
        raise UsageError(message)


def _flag(name: str) -> str:
    """``save_rollouts`` -> ``--save-rollouts``; section fields keep their dotted name."""
    return "--" + name.replace("_", "-") if "." not in name else "--" + name


# How `mcgpo eval` words the options it shares with training (a run's evaluation: the
# defaults come from the run folder's config.toml), and the training-only ones it takes
# (so that a run's own command line still works) but does not list.
EVAL_HELP = {
    "model": "policy folder to evaluate (a run's DIR/model: the run's config.toml is the "
    "base), or 'tiny'",
    "out": "folder eval.json is written to (default: the run folder, else 'runs/run')",
    "seed": "seed of the evaluation's sampling (and of a 'tiny' model)",
    "preset": "preset name or TOML path; with a run folder its values may not change the "
    "run's tasks or prompts",
}
USAGE = {
    "eval": "mcgpo eval [--run DIR | --model DIR] [--KEY VALUE | --set KEY=VALUE ...]",
}
EVAL_HIDDEN = {
    "rollout.groups",
    "rollout.group_size",
    "rollout.temperature",
    "rollout.vllm_sleep",
    "env.train_split",
    "eval.every",
}


def _add_field(group: Any, dest: str, f: Any, default: Any, command: str = "train") -> None:
    kind = field_type(f)
    shown = f"{default!r}" if kind is str else str(default).lower() if kind is bool else default
    extra: dict[str, Any] = {}
    if kind is bool:
        extra = {"nargs": "?", "const": "true", "metavar": "BOOL"}
    else:
        extra = {"metavar": kind.__name__.upper()}
    text = f"{f.metadata.get('help', '')} (default: {shown})"
    if command == "eval":
        text = (
            f"{EVAL_HELP[dest]} (default: the run's, else {shown})" if dest in EVAL_HELP else text
        )
        text = argparse.SUPPRESS if dest in EVAL_HIDDEN else text
    flags = [_flag(dest), "--config"] if dest == "preset" else [_flag(dest)]
    if "_" in dest and "." not in dest:  # --report_to as Hugging Face's Trainer spells it
        flags.append("--" + dest)
    group.add_argument(*flags, dest=dest, default=argparse.SUPPRESS, help=text, **extra)


def _algo_epilog() -> str:
    """Every algorithm with its options and their defaults, then each default's reason."""
    from mcgpo.options import option_help
    from mcgpo.training.algorithms import ALGORITHMS, algorithm_options

    lines = [
        "algorithms and their options (--algo.<option> VALUE; --algo.<estimator>.<option> "
        "VALUE applies only to algorithms that run that estimator, e.g. --algo.graphgpo.omega "
        "for graphgpo, mcgpo and graphgpo_shaping):"
    ]
    reasons: dict[str, dict[str, tuple[object, str]]] = {}
    for name in sorted(ALGORITHMS):
        options, pairs = algorithm_options(name)
        helps = option_help(options)
        body = ", ".join(f"{k}={v}" for k, (v, _) in helps.items()) or "(no options)"
        lines.append(f"  {name}: {body}")
        reasons.setdefault(options.OWNER, helps)
        if pairs is not None:
            pair_helps = option_help(pairs)
            body = ", ".join(f"{k}={v}" for k, (v, _) in pair_helps.items())
            lines.append(f"    pair options (--algo.pairs.<option> VALUE): {body}")
            reasons.setdefault("mcgpo pairs", pair_helps)
    lines.append("why these defaults (docs/algorithms/<name>.md):")
    for owner, helps in reasons.items():
        lines.append(f"  {owner}:")
        lines += [f"    {k}={v}: {why}" for k, (v, why) in helps.items()]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mcgpo",
        description="Group-based RL for multi-turn LLM agents (MCGPO, GraphGPO, GiGPO, ...).",
        allow_abbrev=False,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    base = RunConfig()
    top_fields = {f.name: f for f in scalar_fields(RunConfig)}
    for command, (tops, sections, summary) in COMMANDS.items():
        sub = commands.add_parser(
            command,
            usage=USAGE.get(
                command, f"mcgpo {command} [--preset NAME] [--KEY VALUE | --set KEY=VALUE ...]"
            ),
            help=summary,
            description=summary,
            allow_abbrev=False,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog=_algo_epilog() if "algo" in sections else None,
        )
        group = sub.add_argument_group("run")
        if command == "eval":
            group.add_argument(
                "--run",
                metavar="DIR",
                default=argparse.SUPPRESS,
                help="the run folder to evaluate: its config.toml is the base, its model/ (or "
                "newest checkpoint) the policy, eval.json goes into it; inferred from --model "
                "DIR/model or --out DIR; 'none' evaluates without a run's config",
            )
        for name in tops:
            _add_field(group, name, top_fields[name], getattr(base, name), command)
        group.add_argument(
            "--set",
            metavar="KEY=VALUE",
            default=argparse.SUPPRESS,
            help="any option as KEY=VALUE (e.g. --set train.lr=1e-4, as mcgpo bench takes "
            "them); the same as --KEY VALUE",
        )
        for section in sections:
            group = sub.add_argument_group(f"[{section}] {SECTION_TITLES[section]}")
            obj = getattr(base, section)
            for f in scalar_fields(type(obj)):
                _add_field(group, f"{section}.{f.name}", f, getattr(obj, f.name), command)
    for name, (_, summary) in DELEGATED.items():
        commands.add_parser(name, help=summary, add_help=False)
    commands.add_parser("presets", help="list the shipped presets and the command of each")
    report = commands.add_parser(
        "report",
        help="held-out success of run folders side by side (sft and train runs); --plot "
        "draws their curves",
    )
    # "*" and checked in _plot_target: --plot RUN (no PATH.png) leaves no folder to argparse
    report.add_argument("folders", nargs="*", metavar="RUN", help="run folders, in order")
    report.add_argument(
        "--plot",
        nargs="?",
        const="",
        metavar="PATH.png",
        help="also draw the runs' curves from metrics.jsonl (success, return, losses) to "
        "PATH.png (default: RUN/curves.png for one run, curves.png for several)",
    )
    return parser


def resolve(command: str, argv: Sequence[str]) -> RunConfig:
    """The run config of ``mcgpo <command> <argv>`` (:func:`mcgpo.training.overrides.
    resolve_command`: the defaults or the run folder's config.toml, then the preset, then the
    overrides); raises ConfigError."""
    from mcgpo.training.overrides import resolve_command

    return resolve_command(command, argv)


def _print_presets() -> None:
    from mcgpo.training.presets import available_presets, preset_command

    for name in available_presets():
        print(f"{name:20s} {preset_command(name)}")


def _print_report(folders: list[str]) -> None:
    from mcgpo.training.metrics import Table, run_stages

    staged: list[tuple[str, dict[str, dict[str, float]]]] = []
    for folder in folders:
        if not Path(folder).is_dir():
            raise UsageError(f"run folder {folder!r} not found")
        stages = run_stages(Path(folder))
        if not stages:
            raise UsageError(f"run folder {folder!r} holds no evaluation")
        staged.append((folder, stages))
    labels = [label for _, stages in staged for label in stages]
    columns: dict[str, dict[str, float]] = {}
    for folder, stages in staged:  # two runs at the same stage: each column names its folder
        for label, values in stages.items():
            columns[f"{folder}: {label}" if labels.count(label) > 1 else label] = values
    print(Table.from_metrics("held-out success (" + ", ".join(folders) + ")", columns).render())


def _plot_target(folders: list[str], plot: str | None) -> tuple[list[str], Path | None]:
    """The run folders and the PNG of ``report --plot``: a ``--plot`` value that does not end
    in .png is the first run folder (``report --plot runs/a``); no path: RUN/curves.png for
    one run, curves.png for several."""
    if plot and not plot.lower().endswith(".png"):
        folders, plot = [plot, *folders], ""
    if not folders:
        raise UsageError("name at least one run folder")
    if plot is None:
        return folders, None
    if plot:
        return folders, Path(plot)
    return folders, Path(folders[0]) / "curves.png" if len(folders) == 1 else Path("curves.png")


def _plot_report(folders: list[str], path: Path) -> None:
    from mcgpo.training.curves import plot_runs

    try:
        plot_runs([Path(f) for f in folders], path)
    except ValueError as err:
        raise UsageError(str(err)) from None
    except OSError as err:
        raise UsageError(f"--plot {str(path)!r}: cannot write ({err.strerror})") from None
    print(f"curves: {path}")


def _bench(argv: list[str]) -> int:
    from mcgpo.bench.commands import bench_main

    return bench_main(argv)


def _ablate(argv: list[str]) -> int:
    from mcgpo.bench.commands import ablate_main

    return ablate_main(argv)


def _sweep(argv: list[str]) -> int:
    from mcgpo.bench.commands import sweep_main

    return sweep_main(argv)


def _alfworld_generate(argv: list[str]) -> int:
    try:
        from mcgpo.envs.alfworld.generate import main as generate_main
    except ImportError as err:  # the extra is missing: one line naming the install command
        print(f"mcgpo alfworld-generate: error: {err}", file=sys.stderr)
        return 2
    return generate_main(argv)


def _env(argv: list[str]) -> int:
    from mcgpo.envs.serving.command import main as env_main

    return env_main(argv)


def _export(argv: list[str]) -> int:
    from mcgpo.training.export import main as export_main

    return export_main(argv)


# Commands with their own option parsers (mcgpo <command> --help shows them).
DELEGATED: dict[str, tuple[Any, str]] = {
    "bench": (_bench, "compare methods over seeds from one warm start: results.md, plots"),
    "ablate": (_ablate, "MCGPO's factorial controls in the bench format"),
    "sweep": (_sweep, "MCGPO's hyper-parameters, one at a time around the defaults"),
    "alfworld-generate": (_alfworld_generate, "generate ALFWorld-style games offline (extra)"),
    "env": (_env, "env serve: serve an environment over HTTP (docs/envs/serving.md)"),
    "export": (_export, "export --merge RUN: a LoRA run's adapters merged into a model folder"),
}


# Every command by name, in the order `mcgpo --help` lists them.
NAMED = ("bench", "ablate", "sweep", "alfworld-generate", "env", "export", "presets", "report")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        return DELEGATED[argv[0]][0](argv[1:])
    interrupted_cfg = None  # the run's config once checked: what a Ctrl-C line names
    try:
        parser = build_parser()
        if argv and not argv[0].startswith("-") and argv[0] not in (*COMMANDS, *NAMED):
            known = [*COMMANDS, *NAMED]
            raise UsageError(
                f"unknown command {argv[0]!r}{did_you_mean(argv[0], known)} (choose from "
                f"{', '.join(known)})"
            )
        if not argv or argv[0] not in (*COMMANDS, "presets", "report"):
            parser.parse_args(argv)  # handles --help; anything else is an error
            raise UsageError(
                "choose a command: sft, train, eval, bench, ablate, sweep, presets, report, "
                "alfworld-generate, env or export"
            )
        command = argv[0]
        if command == "presets":
            parser.parse_args(argv)
            _print_presets()
            return 0
        if command == "report":
            args = parser.parse_args(argv)
            folders, plot = _plot_target(args.folders, args.plot)
            _print_report(folders)
            if plot is not None:
                _plot_report(folders, plot)
            return 0
        if any(a in ("-h", "--help") for a in argv[1:]):
            parser.parse_args([command, "--help"])
        from mcgpo.training.preflight import preflight

        cfg, note = preflight(command, resolve(command, argv[1:]), argv[1:])
        interrupted_cfg = cfg
        if cfg.nproc > 1:  # train, sft and eval run on several processes
            from mcgpo.training.distributed import check_world, launch_local, launched_world_size

            if launched_world_size() == 1:  # the --nproc shortcut: start the N processes
                check_world(cfg, cfg.nproc, command)  # a bad world setting: one line, exit 2
                return launch_local(cfg.nproc, argv)  # (their rank 0 prints the note)
        if note and int(os.environ.get("RANK", "0")) == 0:
            print(f"mcgpo {command}: note: {note}", file=sys.stderr)
        code = _run(command, cfg, " ".join(["mcgpo", *argv]))
        if os.environ.get("WORLD_SIZE", "1") != "1":  # a torchrun rank: see leave_launched_process
            from mcgpo.training.distributed import leave_launched_process

            leave_launched_process(code)
        return code
    except (UsageError, ConfigError) as err:
        command = argv[0] if argv and argv[0] in (*COMMANDS, "presets", "report") else ""
        print(f"mcgpo{' ' + command if command else ''}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line saying what is left and how to go on
        from mcgpo.training.run_folder import interrupted_line

        command = argv[0] if argv and argv[0] in COMMANDS else ""
        print(interrupted_line(command, interrupted_cfg), file=sys.stderr)
        return 130


def _run(command: str, cfg: RunConfig, command_line: str) -> int:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" bars at every checkpoint
    if command == "train":
        from mcgpo.training.pipeline import RolloutProducerError
        from mcgpo.training.trainer import TrainingStopped, train

        try:
            summary = train(cfg, command=command_line)
        except (TrainingStopped, RolloutProducerError) as err:  # one line, exit 1
            print(f"mcgpo train: error: {err}", file=sys.stderr)
            return 1
    elif command == "sft":
        from mcgpo.training.sft import run_sft

        summary = run_sft(cfg, command=command_line)
    else:
        from mcgpo.training.evaluate import run_eval

        summary = run_eval(cfg, command=command_line)
    if int(os.environ.get("RANK", "0")) == 0:  # several processes: rank 0 prints
        print(summary.render())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
