"""The plugin's own configuration block: ``mcgpo:`` at the top of the verl config.

verl's ``AlgoConfig`` is a strict dataclass (an unknown key is a TypeError), so mcgpo's
options live in their own block, in the TOML layout of mcgpo's run configs
(:func:`mcgpo.training.config_layout.from_dict`) restricted to the sections the plugin reads::

    mcgpo:
      env: {name: alfworld, max_turns: 50, train_split: train, <env options>...}
      rollout: {history: 2, response_format: auto, max_prompt_tokens: 2048}
      algo: {name: mcgpo, lambda_pair: 1.0, <estimator options>..., pairs: {...}}

Everything is checked by mcgpo's own options classes (:func:`resolve_algo`), with the group
size N taken from verl's ``actor_rollout_ref.rollout.n``; an unknown key is a ConfigError.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mcgpo.training.algorithms import resolve_algo
from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.config_layout import from_dict

__all__ = ["PLUGIN_SECTIONS", "plugin_config"]

PLUGIN_SECTIONS = ("env", "rollout", "algo")


def _plain(block: Any) -> dict[str, Any]:
    """An OmegaConf node (or a plain mapping) as nested dicts."""
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:  # pragma: no cover - verl always brings omegaconf
        DictConfig = ()  # type: ignore[assignment]
    if DictConfig and isinstance(block, DictConfig):
        return OmegaConf.to_container(block, resolve=True)  # type: ignore[return-value]
    if not isinstance(block, Mapping):
        raise ConfigError(f"mcgpo: the plugin block must be a mapping, got {type(block).__name__}")
    return {k: _plain(v) if isinstance(v, Mapping) else v for k, v in block.items()}


def plugin_config(verl_config: Any) -> RunConfig:
    """The mcgpo run config of a verl config: its ``mcgpo`` block, algo options resolved."""
    block = _plain(verl_config.get("mcgpo", None) or {})
    unknown = sorted(set(block) - set(PLUGIN_SECTIONS))
    if unknown:
        raise ConfigError(
            f"mcgpo.{unknown[0]}: unknown section; the plugin reads {', '.join(PLUGIN_SECTIONS)}"
        )
    cfg = from_dict(block, where="mcgpo")
    cfg.env.check()
    cfg.rollout.check()
    cfg.algo.check()
    n = int(verl_config.actor_rollout_ref.rollout.n)
    algo = resolve_algo(cfg.algo, group_size=n)
    return dataclasses.replace(cfg, algo=algo)
