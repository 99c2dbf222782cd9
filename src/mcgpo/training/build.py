"""A run's parts built from its config: the environment factory (from
:mod:`mcgpo.training.environments`), the policy, the options of rollouts and evaluations,
their sampling seeds, and AdamW. Each mistake a user can make here (a bad environment
option, a model folder that cannot be loaded) is a one-line
:class:`~mcgpo.training.config.ConfigError`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mcgpo.rollout.group_rollout import CollectOptions
from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.environments import env_factory, typed_env_options

__all__ = [
    "build_optimizer",
    "collect_options",
    "env_factory",
    "load_model",
    "response_format_for",
    "rollout_seed",
    "tiny_corpus",
    "typed_env_options",
    "wrap_lora",
]


def load_model(
    cfg: RunConfig,
    path: str | Path | None = None,
    *,
    make_env: Callable[[], Any] | None = None,
) -> tuple[Any, Any]:
    """The policy of ``cfg.model`` (or ``path``) on ``cfg.device``: a folder, or 'tiny'.

    ``make_env``: the run's environment factory (default ``env_factory(cfg)``); for 'tiny'
    the tokenizer learns the text of the environment as configured (its sizes, its game
    cache), from ``cfg.corpus_episodes`` expert-led training episodes."""
    from mcgpo.policy import build_tiny_policy, load_policy
    from mcgpo.policy.loading import PolicyLoadError

    source = str(path or cfg.model)
    if source == "tiny":
        texts = tiny_corpus(cfg, make_env or env_factory(cfg))
        model, tokenizer = build_tiny_policy(texts, seed=cfg.seed)
    else:
        try:
            model, tokenizer = load_policy(source)
        except PolicyLoadError as err:
            raise ConfigError(str(err)) from None
    from mcgpo.policy.precision import cast_weights

    return cast_weights(model, cfg.train.precision).to(cfg.device), tokenizer


def tiny_corpus(cfg: RunConfig, make_env: Callable[[], Any]) -> Iterable[str]:
    """The tiny tokenizer's corpus: ``cfg.corpus_episodes`` episodes of the run's environment,
    named (its exploration seeded) as the environment itself: for ``remote`` the served one,
    so a run on a served environment builds the local run's tokenizer and weights."""
    from mcgpo.rollout.corpus import environment_corpus

    name = cfg.env.name
    if name == "remote":
        name = str(typed_env_options(cfg).get("remote_name", name))
    return environment_corpus(
        (name,), episodes=cfg.corpus_episodes, seed=cfg.seed, make=lambda _: make_env()
    )


def response_format_for(cfg: RunConfig, tokenizer: Any) -> str:
    """``rollout.response_format``, with ``auto`` resolved from the tokenizer."""
    from mcgpo.rollout.prompts import default_response_format

    fmt = cfg.rollout.response_format
    return default_response_format(tokenizer) if fmt == "auto" else fmt


def collect_options(
    cfg: RunConfig,
    response_format: str,
    *,
    split: str,
    temperature: float,
    group_size: int,
    seed: int,
) -> CollectOptions:
    """The options of :func:`mcgpo.rollout.collect` for a run: turn limit, response and
    prompt budgets, history and environment workers from ``cfg``; split, temperature, group
    size and seed differ between training rollouts and evaluation, so the caller names them."""
    return CollectOptions(
        group_size=group_size,
        split=split,
        temperature=temperature,
        max_turns=cfg.env.max_turns or None,
        max_new_tokens=cfg.rollout.max_new_tokens,
        history=cfg.rollout.history,
        response_format=response_format,
        seed=seed,
        max_prompt_tokens=cfg.rollout.max_prompt_tokens,
        workers=cfg.env.workers,
        step_timeout=cfg.env.step_timeout,
        sampler=cfg.rollout.sampler,
        decode_attention=cfg.rollout.decode_attention,
        overlap_env=cfg.rollout.overlap_env,
        overlap_pieces=cfg.rollout.overlap_pieces,
        batch_invariant=cfg.rollout.batch_invariant,
    )


def rollout_seed(seed: int, update: int) -> int:
    """The sampling seed of the rollouts of ``update`` (1-based) in a run with ``seed``."""
    return int(np.random.SeedSequence([seed, update]).generate_state(1)[0])


def build_optimizer(model: Any, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (decay on all of them, as verl's FSDP actor)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def wrap_lora(cfg: RunConfig, model: Any, base_path: str | Path | None) -> Any:
    """``model`` with ``train.lora_*`` adapters (:func:`mcgpo.policy.lora.add_lora`, drawn
    from ``cfg.seed``); ``base_path``: the base model's folder, named in the adapter folder.
    Targets that match no module, or a model PEFT cannot wrap, are a ConfigError."""
    from mcgpo.policy.lora import LoraError, add_lora

    train = cfg.train
    try:
        return add_lora(
            model, rank=train.lora_rank, alpha=train.lora_alpha, dropout=train.lora_dropout,
            targets=train.lora_targets, seed=cfg.seed,
            base_path=str(Path(base_path).resolve()) if base_path is not None else None,
        )  # fmt: skip
    except LoraError as err:
        raise ConfigError(f"train.lora_targets {train.lora_targets!r}: {err}") from None
