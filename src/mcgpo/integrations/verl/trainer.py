"""The v1 trainer ``mcgpo`` (``trainer.v1.trainer_mode=mcgpo``): verl's synchronous PPO
trainer with mcgpo's credit assignment, pair loss and pair-aware batch layout.

* ``__init__`` checks the verl config against what the plugin honours
  (:func:`~mcgpo.integrations.verl.config.check_trainer`,
  :func:`~mcgpo.integrations.verl.config.check_verl_config`) and builds one environment
  (:func:`~mcgpo.integrations.verl.config.check_env`): a setting it would silently ignore
  is a one-line ConfigError before any worker starts.
* ``trainer_mode`` reads ``"sync"`` to verl's base trainer, which treats every other mode
  as asynchronous: this trainer runs verl's synchronous replay buffer, batch sizes and
  checkpoints.
* ``on_init_end`` installs :func:`mcgpo.integrations.verl.loss.mcgpo_ppo_loss` on the actor
  with ``set_loss_fn`` (``lambda_pair`` from ``mcgpo.algo.lambda_pair``; 0 for algorithms
  without pairs).
* ``_balance_batch`` (verl runs it before the log-prob and advantage steps) runs verl's own
  length balancing, then mcgpo's credit assignment (``mcgpo.estimate`` and, for MCGPO,
  ``build_preferences``: :func:`~mcgpo.integrations.verl.batch.batch_credit`) on the rows'
  ``extra_fields``, and reorders the batch with :func:`lay_out_batch` so that each pair's
  two rows sit on one data-parallel rank, side by side, spread over that rank's
  mini-batches (:mod:`mcgpo.integrations.verl.layout`). The credit is kept for the
  advantage step; verl's ``global_seqlen/balanced_*`` metrics are recomputed for the final
  order.
* ``_compute_advantage`` writes that credit (per-token advantages, masks, pair fields) into
  the batch, and with verl's ``algorithm.rollout_correction.rollout_is`` set, the
  ``rollout_is_weights`` of mcgpo's :func:`~mcgpo.objectives.rollout_correction_weights`
  (:func:`~mcgpo.integrations.verl.config.rollout_correction` maps verl's settings; verl's
  ``ppo_loss`` applies them to the policy-gradient tokens) and its
  ``rollout_correction/*`` metrics. This is where verl's own trainer computes its weights
  (``trainer_base._compute_advantage``), from the same ``old_log_probs`` and
  ``rollout_log_probs``.
* ``_update_actor`` also adds ``actor/pair_accuracy`` (:func:`pair_accuracy`).
* ``_update_actor`` adds ``force_group_size=2`` when there are pairs and micro-batches are
  dynamic (``use_dynamic_bsz``), so verl's token-balanced split keeps rows ``2k, 2k+1``
  together; fixed micro-batches are contiguous, so an even ``ppo_micro_batch_size_per_gpu``
  does (the config check requires it).

* ``_compute_advantage`` also writes ``mcgpo_mini_rows`` (the learned rows of each row's
  mini-batch, the pair loss's normaliser), counts trajectories and errored ones, and warns
  when every trajectory of the update errored (with the first error); ``_update_actor``
  then takes no optimiser step, and ``mcgpo.train.max_failed_updates`` such updates in a
  row stop the run.
* ``_val_metrics_update`` adds mcgpo's ``eval/*`` to verl's validation metrics
  (:mod:`mcgpo.integrations.verl.validation`).

verl's synthetic padding rows (``is_padding`` tags) are left out of the StepTable.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.seqlen_balancing import calculate_workload, log_seqlen_unbalance

from mcgpo.integrations.verl.batch import (
    BatchCredit,
    batch_credit,
    credit_fields,
    failure_counts,
    first_error,
    layout_partner,
    mini_batch_learned_rows,
    take,
)
from mcgpo.integrations.verl.config import (
    check_env,
    check_trainer,
    check_verl_config,
    max_failed_updates,
    plugin_config,
    rollout_correction,
)
from mcgpo.integrations.verl.layout import LayoutStats, pair_layout
from mcgpo.integrations.verl.loss import mcgpo_ppo_loss, rollout_is_weights
from mcgpo.integrations.verl.validation import validation_metrics
from mcgpo.training.algorithms import ALGORITHMS
from mcgpo.training.config import ConfigError, RunConfig

__all__ = [
    "TRAINER_NAME",
    "McgpoTrainer",
    "credit_metrics",
    "lambda_pair",
    "lay_out_batch",
    "pair_accuracy",
    "split_pairs",
]

TRAINER_NAME = "mcgpo"
logger = logging.getLogger(__name__)


def lambda_pair(run: Any) -> float:
    """The pair-loss weight of a plugin config: 0 for algorithms without pairs."""
    return float(run.algo.lambda_pair) if ALGORITHMS[run.algo.name].pairs else 0.0


def split_pairs(partner: np.ndarray, parts: int) -> int:
    """Pairs whose two rows lie in different ones of ``parts`` equal contiguous chunks."""
    partner = np.asarray(partner, dtype=np.int64)
    size = len(partner) // parts
    rows = np.flatnonzero(partner > np.arange(len(partner)))
    return int(np.sum(rows // size != partner[rows] // size))


def lay_out_batch(
    extra_fields: Sequence[Mapping[str, Any]],
    padding: Sequence[bool],
    workload: np.ndarray,
    run: RunConfig,
    *,
    group_size: int,
    dp_size: int,
    mini_batch_rows: int,
) -> tuple[np.ndarray, BatchCredit, LayoutStats]:
    """Credit of a batch in verl's balanced order, and the order verl should dispatch it in.

    ``extra_fields``/``padding``/``workload``: per row of the batch as verl balanced it
    (rank ``d`` holds rows ``[d*S, (d+1)*S)``); ``mini_batch_rows``: rows of one mini-batch
    over all ranks (``ppo_mini_batch_size * rollout.n``). Returns ``(order, credit in the
    new order, stats)``. The layout's pairs are :func:`layout_partner`'s, so every
    algorithm gets the same order for the same rows.
    """
    if mini_batch_rows % dp_size:
        raise ConfigError(
            f"actor.ppo_mini_batch_size * rollout.n = {mini_batch_rows} rows do not split "
            f"over {dp_size} data-parallel ranks"
        )
    result = batch_credit(list(extra_fields), run.algo, padding)
    partner = layout_partner(result, run.algo, group_size)
    per_rank = mini_batch_rows // dp_size
    if per_rank % 2 and np.any(partner >= 0):
        raise ConfigError(
            f"actor.ppo_mini_batch_size * rollout.n / dp = {per_rank} rows per rank per "
            "mini-batch is odd, so preference pairs cannot stay together; make it even"
        )
    order, stats = pair_layout(partner, workload, dp_size, per_rank)
    return order, take(result, order), stats


@register_trainer(TRAINER_NAME)
class McgpoTrainer(PPOTrainerSync):
    """verl's sync trainer with mcgpo advantages, preferences, pair loss and layout."""

    def __init__(self, config: Any) -> None:
        check_trainer(config)  # fail before any worker starts
        self.mcgpo = plugin_config(config)
        check_verl_config(config, self.mcgpo)
        check_env(self.mcgpo)  # one environment built with mcgpo.env's options
        self._correction = rollout_correction(config)  # verl's rollout_is, as mcgpo's
        self._max_failed_updates = max_failed_updates(config)
        self._failed_updates = 0  # consecutive updates whose every trajectory errored
        self._first_error = ""  # the first error message of the batch being updated
        self._learned_rows = 0  # learned rows of the batch being updated
        # (row keys, credit, layout stats, failure counts) of the batch _balance_batch laid out
        self._credit: tuple[list[Any], BatchCredit, LayoutStats, dict[str, int]] | None = None
        super().__init__(config)

    @property
    def trainer_mode(self) -> str:
        """``"sync"`` for verl's base trainer: it treats any other mode (this trainer's name
        included) as async, with ``ReplayBufferAsync``, ``gen_batch_size`` forced to 1 and
        TransferQueue checkpoints; this trainer is verl's synchronous one."""
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, mode: str) -> None:  # PPOTrainer.__init__ assigns the config's
        if mode != TRAINER_NAME:
            raise ConfigError(f"trainer.v1.trainer_mode: {mode!r}, not {TRAINER_NAME!r}")

    def on_init_end(self) -> None:
        super().on_init_end()
        actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        loss = partial(mcgpo_ppo_loss, config=actor_config, lambda_pair=lambda_pair(self.mcgpo))
        self.actor_rollout_wg.set_loss_fn(loss)

    def _dp_size(self) -> int:
        info = self.actor_rollout_wg._dispatch_info.get("actor")
        if info is None:
            info = self.actor_rollout_wg._query_dispatch_info("actor")
            self.actor_rollout_wg._dispatch_info["actor"] = info
        return max(info) + 1

    def _balance_batch(
        self, batch: Any, metrics: dict, logging_prefix: str = "global_seqlen",
        keep_minibatch: bool = False,
    ) -> Any:  # fmt: skip
        batch = super()._balance_batch(batch, metrics, logging_prefix, keep_minibatch)
        dp = self._dp_size()
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"]
        )
        seq_lens = torch.tensor([tag["seq_len"] for tag in batch.tags], dtype=torch.int64)
        actor, n = self.config.actor_rollout_ref.actor, int(self.config.actor_rollout_ref.rollout.n)
        padding = [bool(t.get("is_padding", False)) for t in batch.tags]
        failures = failure_counts(data["extra_fields"], padding)
        self._first_error = first_error(data["extra_fields"], padding)
        order, result, stats = lay_out_batch(
            list(data["extra_fields"]), padding,
            calculate_workload(seq_lens).cpu().numpy(), self.mcgpo, group_size=n, dp_size=dp,
            mini_batch_rows=int(actor.ppo_mini_batch_size) * n,
        )  # fmt: skip
        batch.reorder([int(i) for i in order])
        self._credit = (list(batch.keys), result, stats, failures)
        size = len(batch) // dp
        chunks = [list(range(d * size, (d + 1) * size)) for d in range(dp)]
        final = log_seqlen_unbalance(
            seqlen_list=seq_lens[torch.as_tensor(order)].tolist(), partitions=chunks,
            prefix=logging_prefix,
        )  # fmt: skip
        metrics.update({k: v for k, v in final.items() if "/balanced" in k})
        return batch

    def _credit_of(self, batch: Any) -> tuple[BatchCredit, LayoutStats | None, dict[str, int]]:
        """The credit ``_balance_batch`` computed for these rows in this order (else anew)."""
        cached, self._credit = self._credit, None
        if cached is not None and cached[0] == list(batch.keys):
            return cached[1], cached[2], cached[3]
        logger.warning("mcgpo: the batch changed after its layout; credit recomputed")
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"]
        )
        padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
        self._first_error = first_error(data, padding)
        return batch_credit(data, self.mcgpo.algo, padding), None, failure_counts(data, padding)

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        result, stats, failures = self._credit_of(batch)
        select = ["response_mask"]
        if self._correction is not None:
            select += ["old_log_probs", "rollout_log_probs"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=select)  # fmt: skip
        fields = credit_fields(result, data["response_mask"])
        if self._correction is not None:
            fields["rollout_is_weights"], corrected = rollout_is_weights(
                data["old_log_probs"], data["rollout_log_probs"], fields["response_mask"],
                self._correction,
            )  # fmt: skip
            metrics.update(corrected)
        actor, n = self.config.actor_rollout_ref.actor, int(self.config.actor_rollout_ref.rollout.n)
        dp = self._dp_size()
        per_rank = int(actor.ppo_mini_batch_size) * n // dp
        fields["mcgpo_mini_rows"] = torch.as_tensor(
            mini_batch_learned_rows(result.learn, dp, per_rank)
        )  # the pair loss's normaliser (loss.py)
        batch = tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id,
            fields=TensorDict(fields, batch_size=len(batch)),
        )  # fmt: skip
        metrics.update(credit_metrics(result, stats, dp, failures))
        self._learned_rows = int(np.sum(result.learn))
        self._count_failed_update(result, metrics)
        return batch

    def _count_failed_update(self, result: BatchCredit, metrics: dict) -> None:
        """Warn when every trajectory of this update errored (each time, with the first
        error); stop the run after ``max_failed_updates`` such updates in a row."""
        table = result.table
        if len(table) == 0 or not bool(np.all(table.errored)):
            self._failed_updates = 0
            return
        self._failed_updates += 1
        first = self._first_error or "no message"
        logger.warning(
            "mcgpo: update %d: every trajectory errored (%d); nothing is learned from it "
            "(%d in a row). First error: %s",
            self.global_steps, int(metrics.get("mcgpo/errored_trajectories", 0)),
            self._failed_updates, first,
        )  # fmt: skip
        limit = self._max_failed_updates
        if limit and self._failed_updates >= limit:
            raise RuntimeError(
                f"mcgpo: {self._failed_updates} updates in a row had every trajectory errored "
                f"(first error: {first}); stopping. The last checkpoint (trainer.save_freq) is "
                "kept: once the environment is back, rerun with trainer.resume_mode=auto"
            )

    def _update_actor(self, batch: Any, metrics: dict) -> Any:
        # dynamic micro-batches only: there force_group_size=2 keeps rows 2k, 2k+1 together;
        # fixed ones are contiguous chunks of micro_batch_size_per_gpu * force_group_size
        # rows (workers/engine/utils.py prepare_micro_batches), so an even size already
        # keeps partners together and 2 would double the micro-batch
        if lambda_pair(self.mcgpo) and self.config.actor_rollout_ref.actor.use_dynamic_bsz:
            batch.extra_info["force_group_size"] = 2
        if self._learned_rows == 0:  # every trajectory errored: no optimiser step (as mcgpo's
            metrics["mcgpo/optimizer_steps"] = 0.0  # own trainer; AdamW's decay would still
            return batch  # move the weights)
        batch = super()._update_actor(batch, metrics)
        metrics.update(pair_accuracy(metrics))
        return batch

    def _val_metrics_update(
        self, data_sources: Any, sample_uids: Any, reward_extra_infos_dict: dict[str, list],
        sample_turns: Any, expected_acc_counts: dict | None = None,
    ) -> dict[str, float]:  # fmt: skip
        """verl's ``val-core`` / ``val-aux`` metrics plus mcgpo's ``eval/*`` (success, score,
        turns, valid actions, errored episodes, success per task type) from the episodes'
        ``reward_extra_info`` (:mod:`mcgpo.integrations.verl.validation`)."""
        out = super()._val_metrics_update(
            data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
            expected_acc_counts=expected_acc_counts,
        )  # fmt: skip
        expected = sum((expected_acc_counts or {}).values()) or None
        evaluated = validation_metrics(reward_extra_infos_dict, expected=expected)
        if evaluated.get("eval/errored", 0.0) > 0:
            logger.warning(
                "mcgpo: validation: %d of %d episodes errored (left out of eval/success)",
                int(evaluated["eval/errored"]), int(evaluated["eval/episodes"]),
            )  # fmt: skip
        return {**out, **evaluated}


def pair_accuracy(metrics: Mapping[str, Any]) -> dict[str, float]:
    """``actor/pair_accuracy`` = ``actor/pairs_correct / actor/pairs`` of an update's reduced
    actor metrics (both the mean over mini-batches of a mini-batch total, so the ratio is
    the update's share of pairs ranked right); empty without pairs."""
    pairs = float(metrics.get("actor/pairs", 0.0) or 0.0)
    if pairs <= 0:
        return {}
    return {"actor/pair_accuracy": float(metrics["actor/pairs_correct"]) / pairs}


def credit_metrics(
    result: BatchCredit, stats: LayoutStats | None, dp_size: int,
    failures: Mapping[str, int] | None = None,
) -> dict:  # fmt: skip
    """The ``mcgpo/*`` metrics of one batch's credit, layout and environment failures
    (:func:`~mcgpo.integrations.verl.batch.failure_counts`: ``mcgpo/env_timeouts``,
    ``mcgpo/env_crashes``, ``mcgpo/env_errors``)."""
    table = result.table
    out = {f"mcgpo/{k}": v for k, v in result.credit.stats.items()}
    out["mcgpo/pairs"] = float(np.sum(result.sign > 0))
    out["mcgpo/pairs_split_dp"] = float(split_pairs(result.partner, dp_size))
    out["mcgpo/errored_rows"] = float(np.sum(table.errored))
    out["mcgpo/trajectories"] = float(len(np.unique(table.traj)))
    out["mcgpo/errored_trajectories"] = float(len(np.unique(table.traj[table.errored])))
    out["mcgpo/padding_rows"] = float(len(result.learn) - len(result.rows))
    if stats is not None:
        out["mcgpo/layout_pairs"] = float(stats.pairs)
        out["mcgpo/layout_split_before"] = float(stats.split_before)
        out["mcgpo/layout_split_after"] = float(stats.split_after)
        out["mcgpo/layout_rows_moved"] = float(stats.moved)
    for name, count in (failures or {}).items():
        out[f"mcgpo/{name}"] = float(count)
    return out
