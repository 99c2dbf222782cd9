"""Check a verl config for the mcgpo plugin before a GPU is booked.

::

    python -m mcgpo.integrations.verl.check --config-path=$PWD/configs/verl \\
        --config-name=alfworld_mcgpo [key=value ...]

takes the arguments of ``python -m verl.trainer.main_ppo``, composes the config as
``main_ppo`` does (Hydra, verl's ``ppo_trainer`` on the search path), runs verl's own
``validate_config`` with ``need_reference_policy`` / ``need_critic`` as ``main_ppo`` passes
them, then the plugin's checks (:func:`~mcgpo.integrations.verl.config.check_trainer`,
:func:`~mcgpo.integrations.verl.config.plugin_config`,
:func:`~mcgpo.integrations.verl.config.check_verl_config`,
:func:`~mcgpo.integrations.verl.config.check_env`: one environment is built with
``mcgpo.env``'s options, so run the check where the run's environment data is). It prints
one line: what will run, or what is wrong (exit 2). No worker, model or dataset is loaded.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from mcgpo.integrations.verl.config import (
    check_env,
    check_trainer,
    check_verl_config,
    plugin_config,
    rollout_correction,
)
from mcgpo.training.config import ConfigError

__all__ = ["check_config", "compose_config", "main"]


def compose_config(config_path: str, config_name: str, overrides: Sequence[str] = ()) -> Any:
    """The verl config ``main_ppo --config-path --config-name overrides...`` would run."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    path = os.path.abspath(os.path.expanduser(config_path))
    if not os.path.isdir(path):
        raise ConfigError(f"--config-path: {config_path} is not a directory")
    if not os.path.isfile(os.path.join(path, f"{config_name}.yaml")):
        raise ConfigError(f"--config-name: no {config_name}.yaml in {path}")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=path, version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


def check_config(config: Any) -> str:
    """verl's validation and the plugin's checks of a composed config; a summary line."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    check_trainer(config)  # verl's own and experimental trainers, async modes
    run = plugin_config(config)  # the agent loop and trainer read it first
    check_verl_config(config, run)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # need_critic warns that the critic is off
        critic, ref = need_critic(config), need_reference_policy(config)
    validate_config(config=config, use_reference_policy=ref, use_critic=critic)
    check_env(run)  # builds one environment with mcgpo.env's options
    arr, n = config.actor_rollout_ref, int(config.actor_rollout_ref.rollout.n)
    gpus = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    lam = f" lambda_pair={run.algo.lambda_pair:g}" if run.algo.name == "mcgpo" else ""
    corr = rollout_correction(config)
    fix = f"rollout correction {corr.mode} {corr.level} cap {corr.cap:g}" if corr else ""
    return (
        f"ok: {run.algo.name}{lam} on {run.env.name}, {config.data.train_batch_size} tasks x "
        f"{n} rollouts per update, mini-batches of {int(arr.actor.ppo_mini_batch_size) * n} "
        f"step rows, {gpus} GPUs, rollout {arr.rollout.name}, "
        f"KL loss {'on' if ref else 'off'}, no critic, " + (fix or "no rollout correction")
    )


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {text}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mcgpo.integrations.verl.check",
        description="Check a verl config for the mcgpo plugin (main_ppo's arguments).",
    )
    parser.add_argument("--config-path", required=True, help="folder of the config (main_ppo's)")
    parser.add_argument("--config-name", required=True, help="config file name, no .yaml")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, key=value")
    args = parser.parse_args(argv)
    try:
        config = compose_config(args.config_path, args.config_name, args.overrides)
        print(check_config(config))
    except (ConfigError, ValueError, AssertionError, TypeError, KeyError) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # Hydra's own errors (bad override, missing group)
        if type(exc).__module__.split(".")[0] in ("hydra", "omegaconf"):
            print(f"error: {_one_line(exc)}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
