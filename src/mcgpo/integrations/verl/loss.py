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
``G = global_batch_size`` (the rows of the mini-batch over all ranks), which is mcgpo's own
``|B_b| / |mini-batch|`` weighting (:mod:`mcgpo.objectives`). Without a global batch size
(one rank, no global info) the weight is 1.

Pairs with one row outside the micro-batch are left out and counted (``actor/pairs_split``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mcgpo.objectives import pair_loss, response_log_ratio

__all__ = ["LOSS_NAME", "mcgpo_ppo_loss", "micro_batch_pairs"]

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


def _pair_term(model_output: Any, data: Any) -> tuple[torch.Tensor, dict[str, float]]:
    from verl.workers.utils.padding import no_padding_2_padding

    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    padded = data.select("response_mask", "old_log_probs").to_padded_tensor()
    mask = padded["response_mask"].to(torch.bool)
    d = response_log_ratio(log_prob, padded["old_log_probs"], mask)
    rows, plus, minus, weight = micro_batch_pairs(data)
    loss, stats = pair_loss(d, plus, minus, weight, rows)
    global_rows = data["global_batch_size"] if "global_batch_size" in data else None  # noqa: SIM401
    dp_size = data["dp_size"] if "dp_size" in data else 1  # noqa: SIM401 (unwraps NonTensorData)
    if global_rows:
        loss = loss * (len(rows) * dp_size / float(global_rows))
    return loss, stats


def mcgpo_ppo_loss(
    config: Any, model_output: Any, data: Any, dp_group: Any = None, *, lambda_pair: float
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's ``ppo_loss`` + ``lambda_pair`` * mcgpo's pair loss on this micro-batch.

    Bind ``config`` and ``lambda_pair`` with :func:`functools.partial` (picklable) and
    install it with ``actor_rollout_wg.set_loss_fn``.
    """
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.losses import ppo_loss

    loss, metrics = ppo_loss(config, model_output, data, dp_group)
    if lambda_pair == 0:
        return loss, metrics
    pair, stats = _pair_term(model_output, data)
    loss = loss + lambda_pair * pair
    metrics["actor/pair_loss"] = Metric(value=pair.detach(), aggregation=AggregationType.MEAN)
    for key in ("pairs", "pairs_split"):
        metrics[f"actor/{key}"] = Metric(value=stats[key], aggregation=AggregationType.SUM)
    metrics["actor/pair_accuracy"] = Metric(
        value=stats["pair_accuracy"], aggregation=AggregationType.MEAN
    )
    return loss, metrics
