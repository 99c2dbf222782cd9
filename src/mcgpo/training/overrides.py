"""Overrides, one syntax for every run command, and the base they apply to.

Every run command (``mcgpo train | sft | eval``, and the runs ``mcgpo bench`` starts) takes
the same overrides: ``--section.key VALUE``, ``--section.key=VALUE`` and
``--set section.key=VALUE`` (top-level keys too: ``--seed 1``, ``--set seed=1``;
``--save-rollouts`` and ``--save_rollouts`` alike; a true/false key alone means true).
``--config PATH`` is ``--preset PATH``. An unknown key is a one-line :class:`ConfigError`
with the closest known one (:func:`mcgpo.options.did_you_mean`).

What the overrides apply to (:func:`resolve_command`):

* a fresh ``train`` or ``sft``, or an ``eval`` of no run: the defaults, then ``--preset``;
* ``train --resume``: the run folder's ``config.toml`` (``--out``): nothing needs retyping;
  keys outside :data:`~mcgpo.training.run_folder.RESUMABLE` may not change, and every one
  that does is named;
* ``eval`` of a run (``--run DIR``, or inferred from ``--model DIR/model`` or
  ``--out DIR``): that run's ``config.toml``, the model ``DIR/model`` (else its newest
  checkpoint's) and ``eval.json`` into ``DIR``; the keys that define the run's tasks and
  prompts (:data:`EVAL_FIXED`, and the environment's options) may not change.

:func:`load_config` is the Python form: ``load_config("household-smoke", **{"train.updates":
2})``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcgpo.options import did_you_mean, parse_scalar
from mcgpo.training.checkpoint_folders import latest_checkpoint
from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.config_layout import SECTIONS, coerce, flatten, from_dict, scalar_fields
from mcgpo.training.presets import load_preset
from mcgpo.training.run_commands import COMMANDS
from mcgpo.training.run_folder import RESUMABLE, fixed_changes, saved_config

__all__ = [
    "EVAL_FIXED",
    "Flags",
    "eval_run_folder",
    "known_flags",
    "load_config",
    "nest",
    "parse_flags",
    "resolve_command",
]

# The settings of a run that ``mcgpo eval`` of it may not change: they define the tasks and
# the prompts the policy was trained on (the environment's own options too). Anything else an
# eval takes may change (eval.*, sizes, the machine, the model folder).
EVAL_FIXED = ("env.name", "rollout.history", "rollout.response_format", "corpus_episodes")

# --run's value that evaluates without any run's config (a transfer to another environment).
NO_RUN = "none"


@dataclass(frozen=True)
class Flags:
    """A run command's overrides, as given: dotted key -> value (text from a command line)."""

    values: dict[str, Any] = field(default_factory=dict)
    run: str | None = None  # eval's --run DIR


def _fields(section: str | None) -> dict[str, Any]:
    cls = RunConfig if section is None else type(getattr(RunConfig(), section))
    return {f.name: f for f in scalar_fields(cls)}


def known_flags(command: str) -> list[str]:
    """Every ``--flag`` of ``command`` (its top-level keys, then its sections' keys)."""
    spec = COMMANDS[command]
    flags = ["--" + t.replace("_", "-") for t in spec.tops]
    flags += [f"--{s}.{name}" for s in spec.sections for name in _fields(s)]
    return flags + ["--config", "--set"] + (["--run"] if command == "eval" else [])


def _key(command: str, name: str) -> str:
    """The dotted config key of a flag name (``save-rollouts`` -> ``save_rollouts``,
    ``config`` -> ``preset``); an unknown one is a ConfigError naming the closest."""
    spec = COMMANDS[command]
    section, dot, rest = name.partition(".")
    if not dot:
        top = {"config": "preset"}.get(name, name.replace("-", "_"))
        if top in spec.tops:
            return top
    elif section in spec.sections and rest:
        path = rest.replace("-", "_").split(".")
        if len(path) == 1 and path[0] in _fields(section):
            return f"{section}.{path[0]}"
        # component options, checked by their owners: --env.<option>, --algo.<option>,
        # --algo.pairs.<option>, --algo.<estimator>.<option>
        if (section == "env" and len(path) == 1) or (section == "algo" and len(path) <= 2):
            return ".".join([section, *path])
    raise ConfigError(f"unknown option --{name}{did_you_mean('--' + name, known_flags(command))}")


def _is_bool(key: str) -> bool:
    section, _, name = key.rpartition(".")
    f = _fields(section or None).get(name) if section in ("", *SECTIONS) else None
    return f is not None and str(f.type) == "bool"


def _names_a_folder(value: str) -> bool:
    """A value that is not true/false and is, or looks like, a folder (``runs/hq``)."""
    if isinstance(parse_scalar(value), bool):
        return False
    return "/" in value or Path(value).is_dir()


def parse_flags(command: str, tokens: Sequence[str]) -> Flags:
    """The overrides of ``mcgpo <command> <tokens>`` (module docstring for the syntax)."""
    if command not in COMMANDS:
        raise ValueError(f"command must be one of {', '.join(COMMANDS)}; got {command!r}")
    values: dict[str, Any] = {}
    run = None
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--") or token == "--":
            raise ConfigError(f"unexpected argument {token!r}")
        name, eq, value = token[2:].partition("=")
        if name == "set":
            if not eq:
                if i >= len(tokens):
                    raise ConfigError("--set needs KEY=VALUE")
                value, i = tokens[i], i + 1
            name, eq, value = value.partition("=")
            if not eq or not name:
                raise ConfigError(f"--set expects KEY=VALUE, got {name + eq + value!r}")
        elif name == "run" and command == "eval":
            if not eq:
                if i >= len(tokens) or tokens[i].startswith("--"):
                    raise ConfigError("option --run needs a value")
                value, i = tokens[i], i + 1
            run = value
            continue
        key = _key(command, name)
        if not eq:
            takes_next = i < len(tokens) and not tokens[i].startswith("--")
            if _is_bool(key) and not takes_next:
                value = "true"  # --resume alone
            elif not takes_next:
                raise ConfigError(f"option --{name} needs a value")
            else:
                value, i = tokens[i], i + 1
            if key == "resume" and _names_a_folder(value):  # --resume RUN
                raise ConfigError(
                    f"--resume takes no folder: the run is --out (mcgpo {command} --resume "
                    f"--out {value})"
                )
        values[key] = value
    return Flags(values, run)


def nest(values: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys -> the nested (TOML) layout :func:`from_dict` reads."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        *path, name = key.split(".")
        table = out
        for part in path:
            table = table.setdefault(part, {})
        table[name] = value
    return out


def _preset_data(values: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    preset = str(values.get("preset", ""))
    return (load_preset(preset) if preset else {}), preset


def load_config(preset: str = "", /, **overrides: Any) -> RunConfig:
    """A checked run config: the defaults, then ``preset`` (a name or a TOML path), then
    ``overrides`` by dotted key, as the command line gives them::

        cfg = mcgpo.load_config("household-smoke", **{"train.updates": 2, "out": "runs/a"})
        mcgpo.train(cfg)

    Values may be typed (``2``) or text (``"2"``); unknown keys and bad values raise
    :class:`ConfigError` naming the key."""
    cfg = RunConfig()
    if preset:
        cfg = from_dict(load_preset(preset), cfg, where=f"preset {preset}")
        cfg = from_dict({"preset": preset}, cfg)
    cfg = from_dict(nest(overrides), cfg)
    cfg.check()
    return cfg


def eval_run_folder(flags: Flags) -> Path | None:
    """The run an ``mcgpo eval`` reads its config from: ``--run DIR`` (``none``: no run),
    else the folder holding ``config.toml`` above ``--model`` (``DIR/model``,
    ``DIR/checkpoints/update-N/model``), else ``--out`` if it holds one."""
    if flags.run is not None:
        if flags.run == NO_RUN:
            return None
        folder = Path(flags.run)
        if not (folder / "config.toml").is_file():
            raise ConfigError(f"--run {flags.run!r}: no config.toml there (not a run folder)")
        return folder
    model = flags.values.get("model")
    if model is not None and model != "tiny":
        for folder in list(Path(model).parents)[:3]:
            if (folder / "config.toml").is_file():
                return folder
    out = flags.values.get("out")
    if out is not None and (Path(out) / "config.toml").is_file():
        return Path(out)
    return None


def _run_model(folder: Path) -> str:
    """A run folder's policy: its final ``model/``, else its newest checkpoint's."""
    if (folder / "model").is_dir():
        return str(folder / "model")
    checkpoint = latest_checkpoint(folder)
    if checkpoint is not None:
        return str(checkpoint / "model")
    raise ConfigError(f"run folder {str(folder)!r} holds no model yet (no model/, no checkpoint)")


def _eval_may_change(key: str) -> bool:
    env_fields = {f"env.{name}" for name in _fields("env")}
    fixed = key in EVAL_FIXED or (key.startswith("env.") and key not in env_fields)
    return not fixed


def resolve_command(command: str, tokens: Sequence[str]) -> RunConfig:
    """The checked run config of ``mcgpo <command> <tokens>`` (module docstring)."""
    flags = parse_flags(command, tokens)
    given = dict(flags.values)
    preset_data, preset = _preset_data(given)
    overrides = nest(given)
    resume = command == "train" and coerce("resume", given.get("resume", False), bool)
    if resume and (Path(given.get("out", RunConfig().out)) / "config.toml").is_file():
        folder = Path(given.get("out", RunConfig().out))
        base = saved_config(folder)
        cfg = _apply(base, preset_data, preset, overrides)
        changes = fixed_changes(flatten(base), flatten(cfg), lambda key: key in RESUMABLE)
        if changes:
            raise ConfigError(
                f"--resume: {'; '.join(changes)} (config.toml of {str(folder)!r} is the base; "
                "drop these options)"
            )
    elif command == "eval" and (folder := eval_run_folder(flags)) is not None:
        base = from_dict({"model": given.get("model") or _run_model(folder)}, saved_config(folder))
        cfg = _apply(base, preset_data, preset, overrides)
        changes = fixed_changes(flatten(base), flatten(cfg), _eval_may_change)
        if changes:
            raise ConfigError(
                f"run folder {str(folder)!r}: {'; '.join(changes)} (these define the run's "
                "tasks and prompts; drop them, or give --run none to evaluate without the "
                "run's config)"
            )
    else:
        cfg = _apply(RunConfig(), preset_data, preset, overrides)
    cfg.check()
    return cfg


def _apply(
    base: RunConfig, preset_data: Mapping[str, Any], preset: str, overrides: Mapping[str, Any]
) -> RunConfig:
    """``base``, then the preset's values, then the overrides (the preset's name kept)."""
    cfg = from_dict(preset_data, base, where=f"preset {preset}") if preset else base
    return from_dict(overrides, cfg)
