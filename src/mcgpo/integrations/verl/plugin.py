"""The ``verl.plugins`` entry point: importing this module registers mcgpo with verl.

``import verl`` loads every entry point of the group ``verl.plugins`` in every process
(driver and Ray workers), and swallows their errors at DEBUG level. So this module reports a
failed registration itself, loudly (``logging.error`` and a ``RuntimeWarning``), and then
re-raises. Registered (:data:`REGISTERED`): the agent loop ``mcgpo_env``, the v1 trainer
``mcgpo``, the actor loss ``mcgpo_ppo_pair`` (installed by the trainer with
``set_loss_fn``; verl has no registry for whole loss functions), the CPU rollout backend
``mcgpo_cpu`` (:mod:`.cpu_replica`) and the platform ``cpu`` (:mod:`.cpu_platform`; with
``VERL_PLATFORM=cpu`` also verl's FSDP engine for the device ``cpu``).
"""

from __future__ import annotations

import logging
import os
import warnings

__all__ = ["REGISTERED", "register"]

logger = logging.getLogger("mcgpo.integrations.verl")

REGISTERED: dict[str, str] = {}
CPU_ROLLOUT = "mcgpo_cpu"  # mcgpo.integrations.verl.cpu_replica.ROLLOUT_NAME


def _load_cpu_replica() -> type:
    from mcgpo.integrations.verl.cpu_replica import CpuReplica

    return CpuReplica


def _register_cpu_rollout() -> None:
    """``rollout.name=mcgpo_cpu`` in verl's two rollout registries, by name only: the
    module is imported where used (importing it here would be circular in its own server
    process, which imports verl and so this plugin while unpickling the server class)."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(CPU_ROLLOUT, _load_cpu_replica)
    _ROLLOUT_REGISTRY[(CPU_ROLLOUT, "async")] = (
        "mcgpo.integrations.verl.cpu_replica.CpuServerAdapter"
    )


def register() -> dict[str, str]:
    """Register the agent loop, trainer and loss; return ``{kind: name}``."""
    try:
        # the CPU platform first: verl modules read the platform at import time
        from mcgpo.integrations.verl import cpu_platform

        if os.environ.get("VERL_PLATFORM", "").strip().lower() == cpu_platform.PLATFORM_NAME:
            cpu_platform.register_cpu_engine()
        from mcgpo.integrations.verl import agent_loop, loss, trainer

        _register_cpu_rollout()
    except Exception as err:
        message = (
            f"mcgpo: registering the verl plugin failed ({type(err).__name__}: {err}); "
            "trainer.v1.trainer_mode=mcgpo and the mcgpo_env agent loop are unavailable"
        )
        logger.error(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        raise
    REGISTERED.update(
        agent_loop=agent_loop.AGENT_LOOP_NAME,
        trainer=trainer.TRAINER_NAME,
        loss=loss.LOSS_NAME,
        rollout=CPU_ROLLOUT,
        platform=cpu_platform.PLATFORM_NAME,
    )
    return dict(REGISTERED)


register()
