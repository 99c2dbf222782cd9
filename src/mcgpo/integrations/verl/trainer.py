"""The v1 trainer ``mcgpo`` (``trainer.v1.trainer_mode=mcgpo``): verl's synchronous PPO
trainer with mcgpo's credit assignment and pair loss.

* ``on_init_end`` installs :func:`mcgpo.integrations.verl.loss.mcgpo_ppo_loss` on the actor
  with ``set_loss_fn`` (``lambda_pair`` from ``mcgpo.algo.lambda_pair``; 0 for algorithms
  without pairs).
* ``_compute_advantage`` replaces verl's: it fetches the rows' ``extra_fields`` from
  TransferQueue, builds the StepTable, runs ``mcgpo.estimate`` (any registered estimator)
  and, for MCGPO, ``build_preferences`` (:func:`mcgpo.integrations.verl.batch.batch_credit`),
  writes per-token advantages and the pair fields back, and reorders the batch so that
  partners sit side by side inside each data-parallel chunk.
* ``_update_actor`` adds ``force_group_size=2`` when there are pairs and micro-batches are
  dynamic (``use_dynamic_bsz``), so verl's token-balanced split keeps neighbours together;
  fixed micro-batches are contiguous, so an even ``ppo_micro_batch_size_per_gpu`` does.
* verl's synthetic padding rows (``is_padding`` tags) are left out of the StepTable.

What verl's own balancing does to pairs: ``_balance_batch`` (run before the advantage step)
reorders rows across data-parallel ranks by sequence length, so the two rows of a pair can
land on different ranks; those pairs are counted in ``mcgpo/pairs_split_dp`` and are left
out of the pair loss (they keep their task loss). With ``actor.shuffle=True`` the mini-batch
iterator shuffles rows and splits pairs too; set ``actor.shuffle=False``.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import numpy as np
import transfer_queue as tq
from tensordict import TensorDict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.config import omega_conf_to_dataclass

from mcgpo.integrations.verl.batch import batch_credit, credit_fields, partner_order
from mcgpo.integrations.verl.config import plugin_config
from mcgpo.integrations.verl.loss import mcgpo_ppo_loss
from mcgpo.training.algorithms import ALGORITHMS

__all__ = ["TRAINER_NAME", "McgpoTrainer"]

TRAINER_NAME = "mcgpo"
logger = logging.getLogger(__name__)


def lambda_pair(run: Any) -> float:
    """The pair-loss weight of a plugin config: 0 for algorithms without pairs."""
    return float(run.algo.lambda_pair) if ALGORITHMS[run.algo.name].pairs else 0.0


@register_trainer(TRAINER_NAME)
class McgpoTrainer(PPOTrainerSync):
    """verl's sync trainer with mcgpo advantages, preferences and pair loss."""

    def __init__(self, config: Any) -> None:
        self.mcgpo = plugin_config(config)  # fail before any worker starts
        super().__init__(config)

    def on_init_end(self) -> None:
        super().on_init_end()
        actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        loss = partial(mcgpo_ppo_loss, config=actor_config, lambda_pair=lambda_pair(self.mcgpo))
        self.actor_rollout_wg.set_loss_fn(loss)
        if self.config.actor_rollout_ref.actor.get("shuffle", False) and lambda_pair(self.mcgpo):
            logger.warning("mcgpo: actor.shuffle=True splits preference pairs; set it False")

    def _dp_size(self) -> int:
        info = self.actor_rollout_wg._dispatch_info.get("actor")
        if info is None:
            info = self.actor_rollout_wg._query_dispatch_info("actor")
            self.actor_rollout_wg._dispatch_info["actor"] = info
        return max(info) + 1

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id,
            select_fields=["extra_fields", "response_mask"],
        )  # fmt: skip
        padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
        result = batch_credit(data, self.mcgpo.algo, padding)
        fields = credit_fields(result, data["response_mask"])
        batch = tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id,
            fields=TensorDict(fields, batch_size=len(batch)),
        )  # fmt: skip
        order, split = partner_order(result.partner, self._dp_size())
        batch.reorder(order)
        metrics.update({f"mcgpo/{k}": v for k, v in result.credit.stats.items()})
        metrics["mcgpo/pairs"] = float(np.sum(result.sign > 0))
        metrics["mcgpo/pairs_split_dp"] = float(split)
        metrics["mcgpo/errored_rows"] = float(np.sum(result.table.errored))
        metrics["mcgpo/padding_rows"] = float(np.sum(padding))
        return batch

    def _update_actor(self, batch: Any, metrics: dict) -> Any:
        # dynamic micro-batches only: there force_group_size=2 keeps rows 2k, 2k+1 together;
        # fixed ones are contiguous chunks of micro_batch_size_per_gpu * force_group_size
        # rows (workers/engine/utils.py prepare_micro_batches), so an even size already
        # keeps partners together and 2 would double the micro-batch
        if lambda_pair(self.mcgpo) and self.config.actor_rollout_ref.actor.use_dynamic_bsz:
            batch.extra_info["force_group_size"] = 2
        return super()._update_actor(batch, metrics)
