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

:func:`check_verl_config` refuses the verl settings the plugin would silently ignore or
break (a critic, a KL penalty in the reward, rollout correction, a reward model or custom
reward function, distillation, dynamic-sampling group filters) and, when the pair loss is
on, the mini-batch settings that would split preference pairs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mcgpo.training.algorithms import ALGORITHMS, resolve_algo
from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.config_layout import from_dict

__all__ = ["PLUGIN_SECTIONS", "check_verl_config", "plugin_config"]

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


def _get(config: Any, dotted: str, default: Any = None) -> Any:
    node = config
    for key in dotted.split("."):
        if node is None:
            return default
        try:
            node = node.get(key, None)
        except AttributeError:
            return default
    return default if node is None else node


def _refuse(key: str, why: str) -> ConfigError:
    return ConfigError(f"{key}: {why} (the mcgpo trainer does not support it)")


def check_verl_config(verl_config: Any, run: RunConfig) -> None:
    """Refuse, with a one-line ConfigError, a verl setting the mcgpo trainer cannot honour.

    mcgpo's estimators give every row its advantage, so verl's critic, its KL-in-reward
    penalty and its reward computation are never run: asking for them would be silently
    ignored. With ``lambda_pair > 0`` the pair loss needs each pair's two rows in one
    micro-batch: verl's actor must not shuffle (``actor.shuffle``) and fixed micro-batches
    (``use_dynamic_bsz: false``) must hold an even number of rows.
    """
    checks = [
        ("critic.enable", _get(verl_config, "critic.enable") is True,
         "mcgpo's estimators give the advantages; verl's critic would be trained for nothing"),
        ("algorithm.adv_estimator", _get(verl_config, "critic.enable") is None
         and str(_get(verl_config, "algorithm.adv_estimator", "gae")) == "gae",
         "'gae' makes verl build a critic (need_critic); set grpo (the plugin replaces the "
         "advantages anyway)"),
        ("algorithm.use_kl_in_reward", bool(_get(verl_config, "algorithm.use_kl_in_reward")),
         "the KL penalty in the reward is never applied; use actor.use_kl_loss"),
        ("algorithm.rollout_correction.rollout_is",
         _get(verl_config, "algorithm.rollout_correction.rollout_is") is not None,
         "rollout importance weights are not applied to mcgpo's loss"),
        ("algorithm.rollout_correction.rollout_rs",
         _get(verl_config, "algorithm.rollout_correction.rollout_rs") is not None,
         "rollout rejection sampling would drop rows after the pairs are built"),
        ("algorithm.rollout_correction.bypass_mode",
         bool(_get(verl_config, "algorithm.rollout_correction.bypass_mode")),
         "bypass mode replaces the old log-probs mcgpo's ratio uses"),
        ("algorithm.filter_groups.enable", bool(_get(verl_config, "algorithm.filter_groups.enable")),
         "group filtering drops rows after the credit is computed"),
        ("reward_model.enable", bool(_get(verl_config, "reward_model.enable"))
         or bool(_get(verl_config, "reward.reward_model.enable")),
         "rewards come from the environment's per-step outcome, not a reward model"),
        ("custom_reward_function.path", _get(verl_config, "custom_reward_function.path") is not None
         or _get(verl_config, "reward.custom_reward_function.path") is not None,
         "rewards come from the environment's per-step outcome, not a reward function"),
        ("distillation.enabled", bool(_get(verl_config, "distillation.enabled")),
         "the distillation loss is not part of mcgpo's loss"),
    ]  # fmt: skip
    for key, bad, why in checks:
        if bad:
            raise _refuse(key, why)
    pairs = ALGORITHMS[run.algo.name].pairs and float(getattr(run.algo, "lambda_pair", 0.0)) > 0
    if not pairs:
        return
    actor = "actor_rollout_ref.actor"
    if bool(_get(verl_config, f"{actor}.shuffle")):
        raise ConfigError(
            f"{actor}.shuffle: true shuffles rows inside each mini-batch and splits preference "
            "pairs; set it to false with the pair loss on (mcgpo.algo.lambda_pair > 0)"
        )
    gpus = int(_get(verl_config, "trainer.n_gpus_per_node", 1)) * int(
        _get(verl_config, "trainer.nnodes", 1)
    )
    dp = max(gpus // int(_get(verl_config, f"{actor}.ulysses_sequence_parallel_size", 1)), 1)
    mini = _get(verl_config, f"{actor}.ppo_mini_batch_size")
    n = int(_get(verl_config, "actor_rollout_ref.rollout.n", 1))
    if mini is not None and (int(mini) * n) % (2 * dp):
        raise ConfigError(
            f"{actor}.ppo_mini_batch_size: {mini} x rollout.n {n} = {int(mini) * n} rows per "
            f"mini-batch do not give each of the {dp} data-parallel ranks an even share, so "
            "preference pairs would be split"
        )
    if not bool(_get(verl_config, f"{actor}.use_dynamic_bsz")):
        micro = _get(verl_config, f"{actor}.ppo_micro_batch_size_per_gpu")
        if micro is not None and int(micro) % 2:
            raise ConfigError(
                f"{actor}.ppo_micro_batch_size_per_gpu: {micro} is odd, so fixed micro-batches "
                "split preference pairs; make it even (or set use_dynamic_bsz: true)"
            )
