"""The run folder (``--out``): created and checked writable; a fresh run refuses a folder
that already holds one, and a resumed run must find its checkpoint and use the settings it was
started with, except the few in :data:`RESUMABLE`."""

from __future__ import annotations

import os
from pathlib import Path

from mcgpo.training.algorithms import ALGORITHMS
from mcgpo.training.checkpoint import latest_checkpoint
from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.config_layout import flatten, from_dict
from mcgpo.training.presets import load_preset

__all__ = [
    "RESUMABLE",
    "check_run_folder",
    "check_same_run",
    "unused_algo_keys",
    "writable_folder",
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
    "env.workers",  # where the environments step never changes the rollouts
    "env.step_timeout",
    "train.old_logprobs_check",  # measures the pi_old mismatch, never changes the update
    "rollout.vllm_gpu_memory_utilization",  # the engine's memory, never its samples
    "train.compile",  # compiled or eager layers: the same maths, float rounding apart
}


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
        if checkpoint is None:
            raise ConfigError(f"--resume: no checkpoint in {str(folder)!r}")
        check_same_run(folder / "config.toml", cfg)
    elif checkpoint is not None or (folder / "metrics.jsonl").exists():
        raise ConfigError(
            f"run folder {str(folder)!r} already holds a run; use --resume or another --out"
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
    saved = flatten(from_dict(load_preset(str(saved_path))))
    now = flatten(cfg)
    unused = unused_algo_keys(cfg.algo.name)
    for key in sorted(set(saved) | set(now)):
        if key in RESUMABLE or (key in unused and saved.get("algo.name") == cfg.algo.name):
            continue
        if saved.get(key) != now.get(key):
            raise ConfigError(
                f"--resume: {key} is {now.get(key)!r} but the run was started with "
                f"{saved.get(key)!r}"
            )
