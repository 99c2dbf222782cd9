"""Setup for the trainer, kept apart from the loop: everything that builds objects.

:func:`setup_run` resolves the algorithm options, prepares the run folder (or checks the one
being resumed), seeds and threads torch, loads the policy and the frozen reference, builds
AdamW, restores a checkpoint and opens the metric sinks. The loop in
:mod:`mcgpo.training.trainer` only uses what it returns.

Seeds: every random choice derives from ``(seed, update)`` (rollout sampling, evaluation
sampling) or from the restored RNG state, so a stopped-and-resumed run equals the
uninterrupted one. Training tasks are consecutive task numbers from a cursor that the
checkpoint stores.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mcgpo.training.checkpoint import latest_checkpoint, load_checkpoint, restore_rng
from mcgpo.training.config import ConfigError, RunConfig, flatten, from_dict, parse_scalar
from mcgpo.training.metrics import MetricSinks

__all__ = [
    "Run",
    "apply_runtime",
    "build_optimizer",
    "env_factory",
    "load_model",
    "response_format_for",
    "rollout_seed",
    "setup_run",
]

# Settings that may change when a run is resumed; anything else must match the saved config.
RESUMABLE = {
    "resume",
    "preset",
    "progress",
    "tensorboard",
    "save_rollouts",
    "threads",
    "device",
    "train.updates",
    "train.save_every",
}


@dataclass
class Run:
    """What the loop works with. ``update`` and ``task_cursor`` advance as it goes."""

    cfg: RunConfig  # resolved: algorithm options filled in
    folder: Path
    model: Any
    tokenizer: Any
    ref_model: Any  # frozen initial policy for the KL term (None when kl_coef == 0)
    optimizer: torch.optim.Optimizer
    make_env: Callable[[], Any]
    response_format: str
    sinks: MetricSinks
    update: int  # updates completed
    task_cursor: int  # number of the next training task


def apply_runtime(cfg: RunConfig) -> None:
    """Threads, determinism and the global seeds."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    torch.manual_seed(cfg.seed)


def load_model(
    cfg: RunConfig,
    path: str | Path | None = None,
    *,
    make_env: Callable[[], Any] | None = None,
) -> tuple[Any, Any]:
    """The policy of ``cfg.model`` (or ``path``) on ``cfg.device``: a folder, or 'tiny'.

    ``make_env``: the run's environment factory (default ``env_factory(cfg)``), used for the
    tiny model's tokenizer corpus."""
    from mcgpo.policy import build_tiny_policy, load_policy
    from mcgpo.policy.loading import PolicyLoadError

    source = str(path or cfg.model)
    if source == "tiny":
        # the tokenizer learns the text of the environment as configured (its sizes, its
        # game cache), from cfg.corpus_episodes expert-led training episodes
        make = make_env or env_factory(cfg)
        model, tokenizer = build_tiny_policy(
            (cfg.env.name,), seed=cfg.seed, episodes=cfg.corpus_episodes, make=lambda _: make()
        )
    else:
        try:
            model, tokenizer = load_policy(source)
        except PolicyLoadError as err:
            raise ConfigError(str(err)) from None
    return model.to(cfg.device), tokenizer


def env_factory(cfg: RunConfig) -> Callable[[], Any]:
    """A no-argument factory of fresh environments of ``cfg.env.name``."""
    from mcgpo.envs import make_env

    name, typed = cfg.env.name, typed_env_options(cfg)

    def make() -> Any:
        return make_env(name, **typed)

    try:
        make()  # a bad name or option, or a missing extra, is reported before any model work
    except (ValueError, TypeError, ImportError) as err:
        raise ConfigError(f"env {name!r}: {str(err).splitlines()[0]}") from None
    return make


def typed_env_options(cfg: RunConfig) -> dict[str, Any]:
    """Environment options with command-line strings read as TOML would (12 -> int)."""
    return {k: parse_scalar(v) if isinstance(v, str) else v for k, v in cfg.env.options.items()}


def response_format_for(cfg: RunConfig, tokenizer: Any) -> str:
    """``rollout.response_format``, with ``auto`` resolved from the tokenizer."""
    from mcgpo.rollout.prompts import default_response_format

    fmt = cfg.rollout.response_format
    return default_response_format(tokenizer) if fmt == "auto" else fmt


def build_optimizer(model: Any, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (decay on all of them, as verl's FSDP actor)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def rollout_seed(seed: int, update: int) -> int:
    """The sampling seed of the rollouts of ``update`` (1-based) in a run with ``seed``."""
    return int(np.random.SeedSequence([seed, update]).generate_state(1)[0])


def setup_run(cfg: RunConfig, command: str = "") -> Run:
    """Everything the training loop needs; a fresh run or the resumed one in ``cfg.out``."""
    from mcgpo.training.algorithms import resolve_algo
    from mcgpo.training.presets import to_toml

    cfg = dataclasses.replace(
        cfg,
        algo=resolve_algo(cfg.algo, cfg.rollout.group_size),
        env=dataclasses.replace(cfg.env, options=typed_env_options(cfg)),
    )
    folder = Path(cfg.out)
    checkpoint = latest_checkpoint(folder)
    if cfg.resume:
        if checkpoint is None:
            raise ConfigError(f"--resume: no checkpoint in {str(folder)!r}")
        _check_same_run(folder / "config.toml", cfg)
    elif checkpoint is not None or (folder / "metrics.jsonl").exists():
        raise ConfigError(
            f"run folder {str(folder)!r} already holds a run; use --resume or another --out"
        )
    make_env = env_factory(cfg)
    apply_runtime(cfg)
    model, tokenizer = load_model(cfg, make_env=make_env)
    ref_model = None
    if cfg.train.kl_coef > 0:  # the initial policy, also when resuming
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    update, cursor = 0, cfg.seed * 1_000_000
    state = load_checkpoint(checkpoint) if cfg.resume and checkpoint is not None else None
    if state is not None:
        model, _ = load_model(cfg, state.model_path)
        update, cursor = state.update, state.task_cursor
    if cfg.train.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False  # the sampler passes its own cache explicitly
    optimizer = build_optimizer(model, cfg.train.lr, cfg.train.weight_decay)
    if state is not None:
        optimizer.load_state_dict(state.optimizer)
        restore_rng(state.rng)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.toml").write_text(to_toml(cfg, command), encoding="utf-8")
    sinks = MetricSinks(
        folder, tensorboard=cfg.tensorboard, resume_at=update if cfg.resume else None
    )
    return Run(
        cfg=cfg,
        folder=folder,
        model=model,
        tokenizer=tokenizer,
        ref_model=ref_model,
        optimizer=optimizer,
        make_env=make_env,
        response_format=response_format_for(cfg, tokenizer),
        sinks=sinks,
        update=update,
        task_cursor=cursor,
    )


def _check_same_run(saved_path: Path, cfg: RunConfig) -> None:
    """A resumed run must use the saved settings, except the few in RESUMABLE."""
    from mcgpo.training.presets import load_preset

    if not saved_path.is_file():
        raise ConfigError(f"--resume: {str(saved_path)!r} is missing")
    saved = flatten(from_dict(load_preset(str(saved_path))))
    now = flatten(cfg)
    for key in sorted(set(saved) | set(now)):
        if key in RESUMABLE:
            continue
        if saved.get(key) != now.get(key):
            raise ConfigError(
                f"--resume: {key} is {now.get(key)!r} but the run was started with "
                f"{saved.get(key)!r}"
            )
