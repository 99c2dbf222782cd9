"""The ``verl.plugins`` entry point: importing this module registers mcgpo with verl.

``import verl`` loads every entry point of the group ``verl.plugins`` in every process
(driver and Ray workers), and swallows their errors at DEBUG level. So this module reports a
failed registration itself, loudly (``logging.error`` and a ``RuntimeWarning``), and then
re-raises. Registered (:data:`REGISTERED`): the agent loop ``mcgpo_env``, the v1 trainer
``mcgpo`` and the actor loss ``mcgpo_ppo_pair`` (installed by the trainer with
``set_loss_fn``; verl has no registry for whole loss functions).
"""

from __future__ import annotations

import logging
import warnings

__all__ = ["REGISTERED", "register"]

logger = logging.getLogger("mcgpo.integrations.verl")

REGISTERED: dict[str, str] = {}


def register() -> dict[str, str]:
    """Register the agent loop, trainer and loss; return ``{kind: name}``."""
    try:
        from mcgpo.integrations.verl import agent_loop, loss, trainer
    except Exception as err:
        message = (
            f"mcgpo: registering the verl plugin failed ({type(err).__name__}: {err}); "
            "trainer.v1.trainer_mode=mcgpo and the mcgpo_env agent loop are unavailable"
        )
        logger.error(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        raise
    REGISTERED.update(
        agent_loop=agent_loop.AGENT_LOOP_NAME, trainer=trainer.TRAINER_NAME, loss=loss.LOSS_NAME
    )
    return dict(REGISTERED)


register()
