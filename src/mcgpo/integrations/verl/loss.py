"""The actor loss installed with ``set_loss_fn``: verl's PPO loss + lambda_pair * L_pair.

verl's actor calls ``loss_fn(config, model_output, data)`` once per micro-batch, ``data``
being the micro-batch TensorDict with every batch field, the pair fields of
:mod:`mcgpo.integrations.verl.batch` included. The task part is verl's own ``ppo_loss``
(unchanged: its clip, dual clip, KL and entropy settings and its aggregation mode); the
pair part is mcgpo's :func:`mcgpo.objectives.pair_loss` on the pairs whose two rows are in
the micro-batch (no copy), with d from :func:`mcgpo.objectives.response_log_ratio`.

Scaling: verl normalises each micro-batch's loss by global quantities so that the summed
gradient of the micro-batches (averaged over data-parallel ranks) is the mini-batch's. The
pair term is weighted the same way by rows: ``L_pair(B_b) * |B_b| * dp_size / G`` with
``G`` the learned rows of the mini-batch over all ranks (``mcgpo_mini_rows``, written by the
``mcgpo`` trainer: verl's ``global_batch_size`` also counts its synthetic padding rows and
errored trajectories' rows, which mcgpo's own mini-batches do not hold), which is mcgpo's own
``|B_b| / |mini-batch|`` weighting (:mod:`mcgpo.objectives`); without ``mcgpo_mini_rows``,
``G = global_batch_size``. Without a global batch size (one rank, no global info) the weight
is 1.

Metrics, at the scale of mcgpo's own trainer (per mini-batch; verl's trainer then averages
the mini-batches of an update). verl's ``Metric.aggregate_dp`` averages each micro-batch
slot over the data-parallel ranks and then applies the aggregation over the micro-batches,
so, exactly as verl logs its own globally scaled ``actor/pg_loss``:

``actor/pair_loss``     the weighted term above with ``SUM`` aggregation: sum over the
                        micro-batches, mean over ranks = sum_b L_pair(B_b) |B_b| / G over all
                        the mini-batch's micro-batches = the mini-batch's pair loss, mcgpo's
                        ``loss/pair`` (with no global batch size, the plain ``MEAN``)
``actor/pairs``         pairs used (both rows in the micro-batch), ``actor/pairs_split``
                        pairs with one row here, ``actor/pairs_correct`` pairs whose margin
                        d(+) - d(-) > 0: counts times ``dp_size`` with ``SUM``, so the mean
                        over ranks is the mini-batch's total
``actor/pair_accuracy`` ``pairs_correct / pairs``, computed by the ``mcgpo`` trainer from
                        the two totals (a mean of per-micro-batch accuracies would count a
                        micro-batch without pairs as 0)

Pairs with one row outside the micro-batch are left out and counted (``actor/pairs_split``).

Rollout correction is verl's: the ``mcgpo`` trainer writes ``rollout_is_weights``
(:func:`mcgpo.objectives.rollout_correction_weights`, mapped from verl's
``algorithm.rollout_correction``: :func:`mcgpo.integrations.verl.config.rollout_correction`)
and verl's ``ppo_loss`` multiplies the policy-gradient tokens by them, as mcgpo's own
``policy_loss`` does; the pair, KL and entropy terms are not weighted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mcgpo.objectives import pair_loss, response_log_ratio, rollout_correction_weights

if TYPE_CHECKING:
    from mcgpo.integrations.verl.config import RolloutCorrection

__all__ = ["LOSS_NAME", "mcgpo_ppo_loss", "micro_batch_pairs", "rollout_is_weights"]

LOSS_NAME = "mcgpo_ppo_pair"


def micro_batch_pairs(data: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, plus, minus, weight)`` of the pairs touching a micro-batch, in batch row ids."""
    rows = data["mcgpo_row"].cpu().numpy().astype(np.int64)
    partner = data["mcgpo_partner"].cpu().numpy().astype(np.int64)
    sign = data["mcgpo_sign"].cpu().numpy().astype(np.int64)
    weight = data["mcgpo_weight"].cpu().numpy().astype(np.float64)
    plus = np.where(sign > 0, rows, partner)[sign != 0]
    minus = np.where(sign > 0, partner, rows)[sign != 0]
    w = weight[sign != 0]
    # a pair with both rows here appears twice (once from each row): keep it once
    _, first = np.unique(plus, return_index=True)
    first.sort()
    return rows, plus[first], minus[first], w[first]


def rollout_is_weights(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    correction: RolloutCorrection,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's ``rollout_is_weights`` for a batch, by mcgpo's
    :func:`~mcgpo.objectives.rollout_correction_weights`.

    The three tensors are per response token, nested (TransferQueue's layout) or padded
    ``[B, L]``; ``response_mask`` is the one the loss uses (rows not learned from are 0, so
    they are left out of the statistics); ``correction`` a
    :class:`~mcgpo.integrations.verl.config.RolloutCorrection`. Returns the weights in
    ``response_mask``'s layout and mcgpo's ``rollout_correction/*`` statistics.
    """
    from verl.workers.utils.padding import response_to_nested

    def padded(t: torch.Tensor) -> torch.Tensor:
        return t.to_padded_tensor(0) if t.is_nested else t

    mask = padded(response_mask)
    old, behaviour = padded(old_log_probs), padded(rollout_log_probs)
    width = mask.shape[-1]  # to_padded_tensor pads each to its own longest row
    old, behaviour = old[:, :width].float(), behaviour[:, :width].float()
    weights, stats = rollout_correction_weights(
        old, behaviour, mask.bool(), mode=correction.mode, level=correction.level,
        cap=correction.cap,
    )  # fmt: skip
    if response_mask.is_nested:
        return response_to_nested(weights, response_mask), stats
    return weights, stats


def _pair_term(model_output: Any, data: Any) -> tuple[torch.Tensor, dict[str, float], float | None]:
    """``(weighted pair loss, stats, data-parallel size or None)`` of one micro-batch; the
    size is None when the batch carries no global batch size (no global scaling)."""
    from verl.workers.utils.padding import no_padding_2_padding

    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    padded = data.select("response_mask", "old_log_probs").to_padded_tensor()
    mask = padded["response_mask"].to(torch.bool)
    d = response_log_ratio(log_prob, padded["old_log_probs"], mask)
    rows, plus, minus, weight = micro_batch_pairs(data)
    loss, stats = pair_loss(d, plus, minus, weight, rows)
    stats["pairs_correct"] = round(stats["pair_accuracy"] * stats["pairs"])
    global_rows = data["global_batch_size"] if "global_batch_size" in data else None  # noqa: SIM401
    dp_size = data["dp_size"] if "dp_size" in data else 1  # noqa: SIM401 (unwraps NonTensorData)
    if global_rows is None:
        return loss, stats, None
    if "mcgpo_mini_rows" in data:  # the mini-batch's learned rows: no padding or errored rows
        global_rows = int(data["mcgpo_mini_rows"].max())
    if not global_rows:  # nothing learned from in this mini-batch: no pair either
        return loss * 0.0, stats, float(dp_size)
    return loss * (len(rows) * dp_size / float(global_rows)), stats, float(dp_size)


def mcgpo_ppo_loss(
    config: Any, model_output: Any, data: Any, dp_group: Any = None, *, lambda_pair: float
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's ``ppo_loss`` + ``lambda_pair`` * mcgpo's pair loss on this micro-batch.

    Bind ``config`` and ``lambda_pair`` with :func:`functools.partial` (picklable) and
    install it with ``actor_rollout_wg.set_loss_fn``. Metrics: module docstring.
    """
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.losses import ppo_loss

    loss, metrics = ppo_loss(config, model_output, data, dp_group)
    if lambda_pair == 0:
        return loss, metrics
    pair, stats, dp = _pair_term(model_output, data)
    loss = loss + lambda_pair * pair
    total = AggregationType.SUM if dp is not None else AggregationType.MEAN
    metrics["actor/pair_loss"] = Metric(value=pair.detach(), aggregation=total)
    for key in ("pairs", "pairs_split", "pairs_correct"):
        count = float(stats[key]) * (dp or 1.0)
        metrics[f"actor/{key}"] = Metric(value=count, aggregation=AggregationType.SUM)
    return loss, metrics
