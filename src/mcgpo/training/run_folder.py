"""The run folder (``--out``): created and checked writable; a fresh run refuses a folder
that already holds one, and a resumed run must find its checkpoint and use the settings it was
started with, except the few in :data:`RESUMABLE`.

``config.toml`` records the run: its first comment line is the command that started it, one
``# resumed: ...`` line follows per resume (:func:`write_run_config` appends, never
overwrites), and its ``[code]`` table is the code that ran (:func:`code_version`; ignored
when the file is read back as a config, and by the resume and eval comparisons).
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import tomli_w

from mcgpo.options import parse_scalar
from mcgpo.training.algorithms import ALGORITHMS
from mcgpo.training.atomic_files import atomic_write_text
from mcgpo.training.checkpoint_folders import latest_checkpoint
from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.config_layout import flatten, from_dict
from mcgpo.training.presets import comment_text, load_preset, parse_toml, to_toml

__all__ = [
    "RESUMABLE",
    "check_run_folder",
    "check_same_run",
    "check_sft_folder",
    "code_version",
    "fixed_changes",
    "interrupted_line",
    "saved_config",
    "stopped_before_a_checkpoint",
    "unused_algo_keys",
    "writable_folder",
    "write_run_config",
]

# Settings that may change when a run is resumed; anything else must match the saved config.
RESUMABLE = {
    "resume",
    "preset",
    "progress",
    "tensorboard",
    "report_to",  # where the metrics are also sent, never what the run does
    "save_rollouts",
    "threads",
    "device",
    "train.updates",
    "train.save_every",
    "train.max_failed_updates",  # when to give up on a failing environment
    "env.workers",  # where the environments step never changes the rollouts
    "env.step_timeout",
    "train.old_logprobs_check",  # measures the pi_old mismatch, never changes the update
    "rollout.vllm_gpu_memory_utilization",  # the engine's memory, never its samples
    "train.compile",  # compiled or eager layers: the same maths, float rounding apart
    "out",  # never compared: a run folder that was moved resumes where it now is
    # evaluation plays its own tasks with its own generators: never the training stream
    "eval.every",
    "eval.tasks",
    "eval.split",
    "eval.temperature",
    "rollout.overlap_env",  # environment steps overlapped with decoding: the same rollouts
    "rollout.overlap_pieces",
}


def code_version() -> dict[str, Any]:
    """The code that runs: ``version`` (the installed mcgpo's), ``commit`` and ``dirty``
    (tracked files changed) of the git work tree that holds the package, each None where
    not known (an installed wheel, no ``git``). Written to ``config.toml``'s ``[code]``."""
    try:
        version: str | None = importlib.metadata.version("mcgpo")
    except importlib.metadata.PackageNotFoundError:
        version = None
    here = Path(__file__).resolve().parent
    commit = _git(here, "rev-parse", "HEAD")
    status = None if commit is None else _git(here, "status", "--porcelain", "--untracked-files=no")
    return {"version": version, "commit": commit, "dirty": None if status is None else bool(status)}


def _git(folder: Path, *args: str) -> str | None:
    """``git args`` run in ``folder``, its stripped output; None if git or the repo is absent."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=folder, capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def write_run_config(folder: Path, cfg: RunConfig, command: str = "") -> None:
    """Write ``folder/config.toml`` for ``cfg``: the command that started the run stays its
    first comment line, a resumed run (``cfg.resume``) appends ``# resumed: <command>`` and
    its code to ``[[code.resumed]]``; a fresh run records :func:`code_version` in ``[code]``."""
    path = Path(folder) / "config.toml"
    code = {k: v for k, v in code_version().items() if v is not None}
    first, resumes, saved_code = command, [], {}
    if cfg.resume and path.is_file():
        text = path.read_text(encoding="utf-8")
        comments = [line[1:].strip() for line in _head_comments(text)]
        first = comments[0] if comments else ""
        resumes = [c.removeprefix("resumed:").strip() for c in comments if c.startswith("resumed:")]
        saved_code = dict(parse_toml(text, str(path)).get("code", {}))
        command = command or "mcgpo.train (Python)"
        resumed = [*saved_code.get("resumed", []), {"command": command, **code}]
        code = {**{k: v for k, v in saved_code.items() if k != "resumed"}, "resumed": resumed}
        resumes.append(command)
    body = to_toml(cfg, first)
    head, _, rest = body.partition("\n")
    lines = [head, *(f"# resumed: {comment_text(c)}" for c in resumes)]
    text = "\n".join(lines) + "\n" + rest
    if code:
        text += "\n" + tomli_w.dumps({"code": code})
    atomic_write_text(path, text)


def _head_comments(text: str) -> list[str]:
    """The comment lines at the top of a TOML file."""
    out = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        out.append(line)
    return out


def saved_config(folder: Path) -> RunConfig:
    """The config a run folder's ``config.toml`` holds, with ``out`` the folder where it is
    now (a moved folder still names its old place); a one-line ConfigError if unreadable."""
    path = Path(folder) / "config.toml"
    if not path.is_file():
        raise ConfigError(f"run folder {str(folder)!r} has no config.toml")
    cfg = from_dict(load_preset(str(path)), where=str(path))
    return from_dict({"out": str(folder)}, cfg)


def fixed_changes(
    saved: Mapping[str, Any], now: Mapping[str, Any], may_change: Callable[[str], bool]
) -> list[str]:
    """``"<key> is <now> but the run was started with <saved>"`` for every flattened key
    that differs and may not change, ``algo.name`` first (it explains the options that
    differ with it), then in alphabetical order."""
    keys = sorted(set(saved) | set(now), key=lambda k: (k != "algo.name", k))
    return [
        f"{key} is {now[key]!r} but the run was started "
        + (f"with {saved[key]!r}" if key in saved else "without it")
        if key in now
        else f"{key} is unset but the run was started with {saved[key]!r}"
        for key in keys
        if not may_change(key) and _as_read(saved.get(key)) != _as_read(now.get(key))
    ]


def _as_read(value: Any) -> Any:
    """A component option given on the command line is a string until its owner reads it
    (``--env.retries 0``); compared as TOML would read it, it equals the saved ``0``."""
    return parse_scalar(value) if isinstance(value, str) else value


def writable_folder(path: str | Path) -> Path:
    """``path`` as a folder that exists and can be written; else a one-line ConfigError."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"--out {str(folder)!r} exists and is not a folder") from None
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ConfigError(f"--out {str(folder)!r}: cannot create the folder ({reason})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {str(folder)!r}: the folder is not writable")
    return folder


def check_run_folder(cfg: RunConfig) -> None:
    """A fresh run needs a folder without a run; a resumed one its checkpoint and settings."""
    folder = Path(cfg.out)
    checkpoint = latest_checkpoint(folder)
    if cfg.resume:
        if not folder.is_dir():  # --out left at its default, or mistyped
            raise ConfigError(f"--resume: no run folder {str(folder)!r} (--out names the run)")
        if checkpoint is None and not stopped_before_a_checkpoint(folder):
            raise ConfigError(f"--resume: no checkpoint in {str(folder)!r}")
        check_same_run(folder / "config.toml", cfg)
    elif checkpoint is not None or (folder / "metrics.jsonl").exists():
        raise ConfigError(
            f"run folder {str(folder)!r} already holds a run; use --resume or another --out"
        )


def stopped_before_a_checkpoint(folder: Path) -> bool:
    """A run that was started (its ``config.toml``) and stopped before it saved any
    checkpoint (Ctrl-C during its first ``train.save_every`` updates): ``--resume`` starts
    it again from update 0, with its settings."""
    folder = Path(folder)
    started = (folder / "config.toml").is_file()
    return started and not any((folder / "checkpoints").glob("update-*"))


def interrupted_line(command: str, cfg: RunConfig | None) -> str:
    """The one line ``mcgpo <command>`` prints on Ctrl-C: what is left and how to go on."""
    if cfg is None:
        return f"mcgpo{' ' + command if command else ''}: interrupted"
    out = str(cfg.out)
    if command == "train":
        checkpoint = latest_checkpoint(Path(out))
        go_on = f"mcgpo train --resume --out {out}"
        if checkpoint is not None:
            update = int(checkpoint.name.rsplit("-", 1)[-1])
            return (
                f"mcgpo train: interrupted; {go_on} goes on from its checkpoint at update {update}"
            )
        if stopped_before_a_checkpoint(Path(out)):
            return f"mcgpo train: interrupted before the first checkpoint; {go_on} starts it again"
    if command == "sft" and not (Path(out) / "model").exists():
        return "mcgpo sft: interrupted before the policy was saved; run the same command again"
    if command == "eval":
        return "mcgpo eval: interrupted; nothing was written (eval.json is written at the end)"
    return f"mcgpo {command}: interrupted"


def check_sft_folder(cfg: RunConfig) -> None:
    """``mcgpo sft`` starts a fresh run: a folder with a policy in it (``model/``, or a
    checkpoint: an sft or a train run) is refused, not overwritten. One without (a warm start
    that stopped before saving, which ``mcgpo bench`` starts again) is written into."""
    folder = Path(cfg.out)
    held = "model/" if (folder / "model").exists() else None
    if held is None and latest_checkpoint(folder) is not None:
        held = "checkpoints/"
    if held is not None:
        raise ConfigError(
            f"run folder {str(folder)!r} already holds a run (its {held}); mcgpo sft starts a "
            "fresh one: use another --out"
        )


def unused_algo_keys(name: str) -> set[str]:
    """The ``algo.*`` settings that algorithm ``name`` never reads: ``lambda_pair`` without a
    pair loss, ``shaping_coef`` without shaping. A default of one of them may change between
    releases (``lambda_pair``: 1.0 to 10.0, issue 35) without changing such a run."""
    spec = ALGORITHMS.get(name)
    if spec is None:
        return set()
    unused = set()
    if not spec.pairs:
        unused.add("algo.lambda_pair")
    if not spec.shaping:
        unused.add("algo.shaping_coef")
    return unused


def check_same_run(saved_path: Path, cfg: RunConfig) -> None:
    """A resumed run must use the saved settings, except the few in RESUMABLE and the
    algorithm's unused ones (:func:`unused_algo_keys`)."""
    if not saved_path.is_file():
        raise ConfigError(f"--resume: {str(saved_path)!r} is missing")
    saved = flatten(from_dict(load_preset(str(saved_path)), where=str(saved_path)))
    now = flatten(cfg)
    unused = unused_algo_keys(cfg.algo.name)
    same_algo = saved.get("algo.name") == cfg.algo.name
    changes = fixed_changes(
        saved, now, lambda key: key in RESUMABLE or (key in unused and same_algo)
    )
    if changes:
        raise ConfigError("--resume: " + "; ".join(changes))
