"""The plugin's own configuration block: ``mcgpo:`` at the top of the verl config.

verl's ``AlgoConfig`` is a strict dataclass (an unknown key is a TypeError), so mcgpo's
options live in their own block, in the TOML layout of mcgpo's run configs
(:func:`mcgpo.training.config_layout.from_dict`) restricted to the sections the plugin reads::

    mcgpo:
      env: {name: alfworld, max_turns: 50, train_split: train, <env options>...}
      rollout: {history: 2, response_format: auto}   # the rest is verl's (ROLLOUT_KEYS_IN_VERL)
      algo: {name: mcgpo, lambda_pair: 10.0, <estimator options>..., pairs: {...}}
      train: {max_failed_updates: 3}   # the only train key (max_failed_updates())

Everything is checked by mcgpo's own options classes (:func:`resolve_algo`), with the group
size N taken from verl's ``actor_rollout_ref.rollout.n``; an unknown key is a ConfigError,
and so is a ``mcgpo.rollout`` key that verl governs (:data:`ROLLOUT_KEYS_IN_VERL`, the
message naming verl's key). :func:`check_trainer` refuses every verl trainer and mode but
the plugin's own; :func:`check_env` builds one environment with ``mcgpo.env``'s options.

:func:`check_verl_config` refuses the verl settings the plugin would silently ignore or
break (a critic, a KL penalty in the reward, an advantage estimator other than mcgpo's, the
parts of rollout correction mcgpo has no counterpart for, a reward model or custom reward
function, distillation, dynamic-sampling group filters) and, when the pair loss is on, the
mini-batch settings that would split preference pairs.

verl's own advantage switches are honoured where they mean what mcgpo computes, refused
where they would be ignored (:func:`plugin_config`, :func:`check_verl_config`):

* ``algorithm.adv_estimator``: ``grpo`` (the critic-free value the examples use: verl's
  ``gae`` builds a critic) or the name of ``mcgpo.algo.name`` (``rloo`` with
  ``mcgpo.algo.name: rloo``); any other estimator would never run (the advantages are
  mcgpo's), so it is refused.
* ``algorithm.norm_adv_by_std_in_grpo: false`` (Dr. GRPO, no division by the group SD):
  with ``mcgpo.algo.name: grpo`` it sets mcgpo's ``norm_by_std: false`` (and conflicts with an
  explicit ``norm_by_std: true``); RLOO never divides by the SD, so it is a no-op there as
  in verl; for any other estimator it is refused, naming that estimator's own ``mode``.
* ``algorithm.rollout_correction``: :func:`rollout_correction`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from mcgpo.training.algorithms import ALGORITHMS, resolve_algo
from mcgpo.training.build import env_factory
from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.config_layout import from_dict

__all__ = [
    "PLUGIN_SECTIONS",
    "ROLLOUT_KEYS_IN_VERL",
    "ROLLOUT_KEYS_MCGPO_ONLY",
    "RolloutCorrection",
    "check_env",
    "check_trainer",
    "check_verl_config",
    "max_failed_updates",
    "plugin_config",
    "rollout_correction",
]

PLUGIN_SECTIONS = ("env", "rollout", "algo")  # and train, for max_failed_updates only
MAX_FAILED_UPDATES = RunConfig().train.max_failed_updates  # mcgpo's own default, defined once
# mcgpo.rollout keys the plugin reads (the agent loop); every other one is verl's to set
ROLLOUT_KEYS_USED = ("history", "response_format")
# mcgpo.rollout's other keys: the verl key that governs each (refused, naming it)
ROLLOUT_KEYS_IN_VERL: dict[str, str] = {
    "groups": "data.train_batch_size",
    "group_size": "actor_rollout_ref.rollout.n",
    "temperature": "actor_rollout_ref.rollout.temperature",
    "max_new_tokens": "data.max_response_length (and actor_rollout_ref.rollout.response_length)",
    "max_prompt_tokens": "data.max_prompt_length (and actor_rollout_ref.rollout.prompt_length)",
    "sampler": "actor_rollout_ref.rollout.name",
    "decode_attention": "actor_rollout_ref.rollout.name",
    "engine": "actor_rollout_ref.rollout.name",
    "vllm_gpu_memory_utilization": "actor_rollout_ref.rollout.gpu_memory_utilization",
    "vllm_dtype": "actor_rollout_ref.rollout.dtype",
    "vllm_sleep": "actor_rollout_ref.rollout.free_cache_engine",
}
# mcgpo.rollout's keys for mcgpo's own rollout loop, with no counterpart under verl (refused,
# saying why): every RolloutConfig field is in exactly one of these three
ROLLOUT_KEYS_MCGPO_ONLY: dict[str, str] = {
    "overlap_env": "verl's agent loop plays every episode as a task of its own, so its "
    "environment steps already run beside other episodes' decoding",
    "overlap_pieces": "it cuts mcgpo's own rollout loop into pieces (rollout.overlap_env)",
    "batch_invariant": "verl's rollout server batches the requests itself",
}


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


def max_failed_updates(verl_config: Any) -> int:
    """``mcgpo.train.max_failed_updates``: updates in a row whose every trajectory errored
    after which the ``mcgpo`` trainer stops the run (0: never), default
    :data:`MAX_FAILED_UPDATES` as mcgpo's own ``train.max_failed_updates``. The only
    ``mcgpo.train`` key: verl's actor config governs the rest of training."""
    block = _plain(verl_config.get("mcgpo", None) or {}).get("train") or {}
    if not isinstance(block, Mapping):
        raise ConfigError("mcgpo.train: must be a mapping")
    for key in block:
        if key != "max_failed_updates":
            raise ConfigError(
                f"mcgpo.train.{key}: verl's actor config (actor_rollout_ref.actor.*) governs "
                "training; the plugin reads only mcgpo.train.max_failed_updates"
            )
    value = block.get("max_failed_updates", MAX_FAILED_UPDATES)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"mcgpo.train.max_failed_updates: {value!r}, want an integer >= 0")
    return value


def plugin_config(verl_config: Any) -> RunConfig:
    """The mcgpo run config of a verl config: its ``mcgpo`` block, algo options resolved."""
    block = _plain(verl_config.get("mcgpo", None) or {})
    max_failed_updates(verl_config)  # mcgpo.train: checked there, not a RunConfig section
    block.pop("train", None)
    unknown = sorted(set(block) - set(PLUGIN_SECTIONS))
    if unknown:
        raise ConfigError(
            f"mcgpo.{unknown[0]}: unknown section; the plugin reads {', '.join(PLUGIN_SECTIONS)}"
        )
    for key in (block.get("rollout") or {}) if isinstance(block.get("rollout"), Mapping) else ():
        if key not in ROLLOUT_KEYS_USED and key in ROLLOUT_KEYS_IN_VERL:
            raise ConfigError(
                f"mcgpo.rollout.{key}: verl sets this, not the plugin (it would be ignored); "
                f"set {ROLLOUT_KEYS_IN_VERL[key]} instead"
            )
        if key in ROLLOUT_KEYS_MCGPO_ONLY:
            raise ConfigError(
                f"mcgpo.rollout.{key}: mcgpo train's own rollouts only, the plugin would "
                f"ignore it ({ROLLOUT_KEYS_MCGPO_ONLY[key]})"
            )
    cfg = from_dict(block, where="mcgpo")
    cfg = dataclasses.replace(cfg, algo=_grpo_std_switch(verl_config, cfg.algo))
    cfg.env.check()
    cfg.rollout.check()
    cfg.algo.check()
    n = int(verl_config.actor_rollout_ref.rollout.n)
    algo = resolve_algo(cfg.algo, group_size=n)
    return dataclasses.replace(cfg, algo=algo)


def _grpo_std_switch(verl_config: Any, algo: Any) -> Any:
    """``algo`` with verl's ``algorithm.norm_adv_by_std_in_grpo: false`` honoured or refused
    (module docstring)."""
    if _get(verl_config, "algorithm.norm_adv_by_std_in_grpo", True) is not False:
        return algo
    key = "algorithm.norm_adv_by_std_in_grpo"
    estimator = ALGORITHMS[algo.name].estimator if algo.name in ALGORITHMS else algo.name
    if estimator == "rloo":
        return algo  # RLOO's baseline has no SD to divide by, in verl as here
    if estimator != "grpo":
        own = "base_options" if estimator == "progress_gpo" else "mode: mean_norm"
        mode = f"mcgpo.algo.{estimator}.{own}"
        raise ConfigError(
            f"{key}: false is GRPO's switch and mcgpo.algo.name {algo.name!r} runs the "
            f"{estimator} estimator, which would ignore it; set {mode} instead (and leave "
            f"{key} at true)"
        )  # fmt: skip
    given = {**algo.per_estimator.get("grpo", {}), **algo.estimator}
    if "norm_by_std" in given and str(given["norm_by_std"]).lower() not in ("false", "0"):
        raise ConfigError(
            f"{key}: false contradicts mcgpo.algo.norm_by_std: {given['norm_by_std']}; "
            "set one of them"
        )
    return dataclasses.replace(algo, estimator={**algo.estimator, "norm_by_std": False})


def check_env(run: RunConfig) -> None:
    """Build one environment of ``mcgpo.env`` with its options, as mcgpo's own trainer does
    at set-up: a bad name or option, a missing extra or missing data is a one-line
    ConfigError here (the check command, the trainer's start-up) instead of an error in
    every agent-loop session."""
    try:
        env_factory(run)
    except ConfigError as err:
        raise ConfigError(f"mcgpo.{err}") from None


@dataclasses.dataclass(frozen=True)
class RolloutCorrection:
    """verl's ``algorithm.rollout_correction`` as the arguments of
    :func:`mcgpo.objectives.rollout_correction_weights`."""

    mode: str  # "tis" or "mis"
    level: str  # "token" or "sequence"
    cap: float  # > 1


def _threshold(spec: Any) -> tuple[float, float | None]:
    """``(upper, lower or None)`` of verl's ``rollout_is_threshold``: a number or a
    number-like string (TIS's upper bound), or ``"lower_upper"`` (IcePop's bounds)."""
    key = "algorithm.rollout_correction.rollout_is_threshold"
    text = str(spec).strip()
    try:
        if isinstance(spec, str) and "_" in text:
            low, high = text.split("_", 1)
            return float(high), float(low)
        return float(text), None
    except ValueError:
        raise ConfigError(f"{key}: {spec!r} is not a number or 'lower_upper'") from None


def rollout_correction(verl_config: Any) -> RolloutCorrection | None:
    """mcgpo's correction for verl's ``algorithm.rollout_correction`` (None: off).

    verl 0.9.1 (``trainer/ppo/rollout_corr_helper.py``, decoupled mode) weights each
    policy-gradient token by rho = pi_old / pi_rollout, ``rollout_is`` "token" (per token)
    or "sequence" (exp of the row's summed log-ratio, on all its tokens), log-ratios clamped
    to [-20, 20]; ``rollout_is_threshold`` a number U: TIS, w = min(rho, U); the string
    ``"L_U"``: IcePop, w = rho inside [L, U] and 0 outside. These are mcgpo's ``tis``
    (cap U) and, when L = 1/U (to 6 digits), ``mis`` (cap U), at the same level. The rest has
    no faithful mapping and is refused (one line, :func:`check_verl_config`): IcePop bounds
    with L != 1/U, a bound U <= 1 (mcgpo's cap is > 1), ``rollout_is_batch_normalize``
    (weights rescaled to batch mean 1), rejection sampling ``rollout_rs`` (it edits the
    response mask after mcgpo's pairs are built), ``bypass_mode`` (pi_rollout as pi_old), and
    ``rollout.calculate_log_probs: false`` (no rollout log-probs to weigh with).
    """
    block = "algorithm.rollout_correction"
    level = _get(verl_config, f"{block}.rollout_is")
    if level is None:
        return None
    if level not in ("token", "sequence"):
        raise ConfigError(f"{block}.rollout_is: {level!r}, want token or sequence (or null)")
    upper, lower = _threshold(_get(verl_config, f"{block}.rollout_is_threshold", 2.0))
    if not (math.isfinite(upper) and upper > 1.0):
        raise ConfigError(
            f"{block}.rollout_is_threshold: upper bound {upper:g} <= 1; mcgpo's rollout "
            "correction caps the ratio at a value > 1"
        )
    if lower is None:
        return RolloutCorrection("tis", str(level), upper)
    if not math.isclose(lower, 1.0 / upper, rel_tol=1e-6):
        raise ConfigError(
            f"{block}.rollout_is_threshold: IcePop bounds [{lower:g}, {upper:g}] are not "
            f"[1/U, U]: mcgpo's mis masks outside [1/cap, cap]; use '{1.0 / upper:g}_{upper:g}'"
        )
    return RolloutCorrection("mis", str(level), upper)


# What to run instead of a verl trainer or mode the plugin does not support
_USE_INSTEAD = (
    "run python -m verl.trainer.main_ppo with trainer.use_v1=true trainer.v1.trainer_mode=mcgpo "
    "(synchronous); for reproducible asynchrony use mcgpo's own trainer (train.async_lag)"
)


def check_trainer(verl_config: Any) -> None:
    """Refuse, in one line naming what to set instead, every verl trainer and mode that
    would run the plugin's agent loop without the plugin's trainer, or the plugin's trainer
    in a way it was not proven in.

    The plugin runs only as verl 0.9.1's v1 trainer ``mcgpo`` (``trainer.use_v1: true``,
    ``trainer.v1.trainer_mode: mcgpo``), which is verl's synchronous trainer. Refused:
    the legacy trainer (``use_v1: false``), verl's own v1 modes (``sync``,
    ``colocate_async``, ``separate_async``: verl's GRPO on each episode's final reward,
    ``mcgpo.algo`` ignored, no pair loss), the experimental ``one_step_off_policy`` and
    ``fully_async_policy`` trainers (their own entry points and config blocks: ``rollout``
    and ``async_training`` at the top), a custom replay buffer
    (``trainer.v1.sampler.custom_sampler``) and decoupled local updates
    (``trainer.v1.sync.parameter_sync_step`` > 1).
    """
    mode = _get(verl_config, "trainer.v1.trainer_mode")
    v1 = _get(verl_config, "trainer.use_v1")
    checks: list[_Check] = [
        ("async_training", _get(verl_config, "async_training") is not None,
         "verl.experimental.fully_async_policy is not supported by the mcgpo plugin (its "
         "rollouter returns one output per trajectory and runs verl's own advantages)"),
        ("rollout", _get(verl_config, "rollout") is not None,
         "a top-level rollout block is verl.experimental.one_step_off_policy's, which the "
         "mcgpo plugin does not support (one output per trajectory, verl's own advantages)"),
        ("trainer.use_v1", v1 is not True,
         f"{v1!r}: the mcgpo trainer is a v1 trainer; set it to true"),
        ("trainer.v1.trainer_mode", mode != "mcgpo",
         f"{mode!r} is not the plugin's trainer: verl's own trainers run verl's GRPO on each "
         "episode's final reward (mcgpo.algo ignored, no pair loss), and the async modes "
         "colocate_async and separate_async are not supported"),
        ("trainer.v1.sampler.custom_sampler",
         bool(_get(verl_config, "trainer.v1.sampler.custom_sampler.path")),
         "a custom replay buffer may split or hold back task groups; leave it unset"),
        ("trainer.v1.sync.parameter_sync_step",
         int(_get(verl_config, "trainer.v1.sync.parameter_sync_step", 1)) != 1,
         "local updates on parts of a batch split its task groups over updates; set it to 1"),
    ]  # fmt: skip
    for key, bad, why in checks:
        if bad:
            raise ConfigError(f"{key}: {why} ({_USE_INSTEAD})")


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
    _refuse_first(
        _advantage_checks(verl_config, run)
        + _rollout_correction_checks(verl_config)
        + _reward_and_loss_checks(verl_config)
    )
    rollout_correction(verl_config)  # its own one-line refusals
    if ALGORITHMS[run.algo.name].pairs and float(getattr(run.algo, "lambda_pair", 0.0)) > 0:
        _check_pairs_stay_whole(verl_config)


_Check = tuple[str, bool, str]  # (the verl key, whether it is refused, why)


def _refuse_first(checks: list[_Check]) -> None:
    for key, bad, why in checks:
        if bad:
            raise _refuse(key, why)


def _advantage_checks(verl_config: Any, run: RunConfig) -> list[_Check]:
    """verl's critic, KL-in-reward penalty and advantage estimators, which mcgpo replaces."""
    estimator = str(_get(verl_config, "algorithm.adv_estimator", "gae"))
    return [
        ("critic.enable", _get(verl_config, "critic.enable") is True,
         "mcgpo's estimators give the advantages; verl's critic would be trained for nothing"),
        ("algorithm.adv_estimator", estimator == "gae",
         "'gae' needs a critic's values (with critic.enable unset verl builds one; with it "
         "false GAE has no values) and mcgpo replaces the advantages anyway; set grpo"),
        ("algorithm.use_kl_in_reward", bool(_get(verl_config, "algorithm.use_kl_in_reward")),
         "the KL penalty in the reward is never applied; use actor.use_kl_loss"),
        ("algorithm.adv_estimator", estimator not in ("gae", "grpo", run.algo.name),
         f"{_get(verl_config, 'algorithm.adv_estimator')!r} would never run: the advantages "
         f"are mcgpo.algo.name's ({run.algo.name!r}); name the estimator there (e.g. "
         "mcgpo.algo.name: rloo) and keep adv_estimator: grpo"),
    ]  # fmt: skip


def _rollout_correction_checks(verl_config: Any) -> list[_Check]:
    """The parts of verl's rollout correction mcgpo has no counterpart for."""
    block = "algorithm.rollout_correction"
    weighted = _get(verl_config, f"{block}.rollout_is") is not None
    return [
        (f"{block}.rollout_rs", _get(verl_config, f"{block}.rollout_rs") is not None,
         "rejection sampling edits response_mask after mcgpo's advantages and pairs are "
         "built (a rejected row would stay paired); use rollout_is (TIS, or IcePop bounds "
         "'1/U_U')"),
        (f"{block}.bypass_mode", bool(_get(verl_config, f"{block}.bypass_mode")),
         "bypass mode replaces the old log-probs mcgpo's ratio uses"),
        (f"{block}.rollout_is_batch_normalize",
         weighted and bool(_get(verl_config, f"{block}.rollout_is_batch_normalize")),
         "rescaling the weights to batch mean 1 has no counterpart in "
         "mcgpo.objectives.rollout_correction_weights"),
        ("actor_rollout_ref.rollout.calculate_log_probs",
         weighted and not bool(_get(verl_config, "actor_rollout_ref.rollout.calculate_log_probs")),
         f"false records no rollout log-probs (rollout_log_probs), which {block}.rollout_is "
         "needs; set it to true"),
    ]  # fmt: skip


def _reward_and_loss_checks(verl_config: Any) -> list[_Check]:
    """verl's group filters, reward model or function, and distillation loss."""
    return [
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


def _check_pairs_stay_whole(verl_config: Any) -> None:
    """With the pair loss on: no shuffling, and mini- and fixed micro-batches that hold
    whole preference pairs on every data-parallel rank."""
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
