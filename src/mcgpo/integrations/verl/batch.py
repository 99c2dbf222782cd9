"""verl batch <-> mcgpo: the StepTable of a batch of step outputs, and what goes back.

One verl row is one agent turn (the ``mcgpo_env`` agent loop returns one output per
environment step), and its ``extra_fields`` hold that turn's StepTable fields
(:data:`STEP_FIELDS`): ``group`` is verl's prompt ``uid`` and ``traj`` is
``"{uid}_{session_id}"`` (uuid strings, which :class:`~mcgpo.steps.StepTable` maps to dense
integers). Rows are numbered by their position in the batch as fetched.

What goes back per row (tensors of shape ``[B]`` unless nested):

``advantages``        nested like ``response_mask``: the row's advantage on each response token
                      (0 for rows of errored trajectories)
``returns``           the same values (verl's critic-free estimators do the same)
``response_mask`` / ``loss_mask``  zeroed for rows not learned from (errored trajectories,
                      verl's synthetic padding rows)
``mcgpo_row``         int64, the row's position in the batch (its id in the pair fields)
``mcgpo_partner``     int64, the batch position of the row it is paired with, -1 if none
``mcgpo_sign``        int64, +1 the row is the preferred decision, -1 dispreferred, 0 unpaired
``mcgpo_weight``      float32, the pair's weight c (0 if unpaired)

A row belongs to one pair at most (:func:`mcgpo.build_preferences` guarantees it), so the
pairs travel with the rows through every reorder and split verl makes; which rows verl puts
on which rank and mini-batch is :mod:`mcgpo.integrations.verl.layout`'s job, on the pairs of
:func:`layout_partner`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from mcgpo.preferences import build_preferences
from mcgpo.steps import FIELDS, StepTable
from mcgpo.training.algorithms import ALGORITHMS, Credit, assign_credit
from mcgpo.training.config import AlgoConfig

__all__ = [
    "FAILURE_COUNTS",
    "STEP_FIELDS",
    "BatchCredit",
    "batch_credit",
    "credit_fields",
    "failure_counts",
    "first_error",
    "layout_partner",
    "mini_batch_learned_rows",
    "step_table",
    "take",
]

STEP_FIELDS = tuple(name for name in FIELDS if name not in ("group_label", "traj_label"))
# the agent loop's per-trajectory failure counts (agent_loop.FAILURE_FIELDS), nonzero only on
# a trajectory's last output, so their sums over a batch's rows are its failure counts
FAILURE_COUNTS = ("env_timeouts", "env_crashes", "env_errors")


def _extra_fields(batch: Any) -> list[Mapping[str, Any]]:
    """The per-row ``extra_fields`` dicts of a TensorDict, DataProto or list of dicts."""
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        return list(batch)
    non_tensor = getattr(batch, "non_tensor_batch", None)
    if non_tensor is not None:  # DataProto
        return list(non_tensor["extra_fields"])
    return list(batch["extra_fields"])  # TensorDict: a NonTensorStack of dicts


def failure_counts(batch: Any, padding: Sequence[bool] | None = None) -> dict[str, int]:
    """Environment timeouts, crashes and errors over a batch's non-padding rows."""
    fields = _extra_fields(batch)
    pad = [False] * len(fields) if padding is None else list(padding)
    return {
        name: sum(int(f.get(name, 0) or 0) for f, p in zip(fields, pad, strict=True) if not p)
        for name in FAILURE_COUNTS
    }


def first_error(batch: Any, padding: Sequence[bool] | None = None) -> str:
    """The first environment error message (``env_error``) over a batch's non-padding rows,
    "" if none."""
    fields = _extra_fields(batch)
    pad = [False] * len(fields) if padding is None else list(padding)
    for f, p in zip(fields, pad, strict=True):
        if not p and f.get("env_error"):
            return str(f["env_error"])
    return ""


def step_table(batch: Any, rows: Sequence[int] | None = None) -> StepTable:
    """The StepTable of a batch of ``mcgpo_env`` step outputs, row i = batch row ``rows[i]``.

    ``batch``: a TensorDict fetched from TransferQueue, a DataProto, or the list of
    ``extra_fields`` dicts; ``rows``: the batch rows to take (default all). Keys of
    ``extra_fields`` that are not StepTable fields (verl's own, such as
    ``reward_extra_info``) are ignored.
    """
    fields = _extra_fields(batch)
    picked = fields if rows is None else [fields[int(i)] for i in rows]
    return StepTable.from_records([{k: r[k] for k in STEP_FIELDS if k in r} for r in picked])


class BatchCredit(NamedTuple):
    """Per-row results of :func:`batch_credit`, in batch order."""

    table: StepTable  # the non-padding rows (``rows``), errored ones included
    rows: np.ndarray  # [T] int64, the batch position of each table row
    learn: np.ndarray  # [B] bool, the rows given to mcgpo (not errored, not padding)
    advantages: np.ndarray  # [B] float32, 0 on rows not learned from
    partner: np.ndarray  # [B] int64, -1 if unpaired
    sign: np.ndarray  # [B] int64, +1 / -1 / 0
    weight: np.ndarray  # [B] float32
    credit: Credit  # what mcgpo computed on the learnable rows (rows in its numbering)


def batch_credit(
    batch: Any, algo: AlgoConfig, padding: Sequence[bool] | None = None
) -> BatchCredit:
    """Advantages (and MCGPO pairs) of every batch row: mcgpo's ``assign_credit`` on the
    learnable rows, mapped back to batch positions. ``algo`` is resolved
    (:func:`mcgpo.integrations.verl.config.plugin_config`).

    ``padding``: per row, True for verl's synthetic padding rows (``is_padding`` in the
    batch tags, ``trainer/ppo/padding_utils.py``). They copy the first row's
    ``extra_fields``, so they would repeat one of its steps (a StepTableError); they are
    left out of the table and get advantage 0 and no pair.
    """
    n = len(_extra_fields(batch))
    pad = np.zeros(n, dtype=bool) if padding is None else np.asarray(padding, dtype=bool)
    if pad.shape != (n,):
        raise ValueError(f"batch_credit: padding has {pad.size} flags for {n} rows")
    rows = np.flatnonzero(~pad)
    table = step_table(batch, rows)
    keep = rows[~table.errored]
    credit = assign_credit(table.select(np.flatnonzero(~table.errored)), algo)
    learn = np.zeros(n, dtype=bool)
    learn[keep] = True
    adv = np.zeros(n, dtype=np.float32)
    adv[keep] = credit.advantages
    partner = np.full(n, -1, dtype=np.int64)
    sign = np.zeros(n, dtype=np.int64)
    weight = np.zeros(n, dtype=np.float32)
    plus, minus = keep[credit.plus], keep[credit.minus]
    partner[plus], partner[minus] = minus, plus
    sign[plus], sign[minus] = 1, -1
    weight[plus] = weight[minus] = credit.weight
    return BatchCredit(table, rows, learn, adv, partner, sign, weight, credit)


def credit_fields(result: BatchCredit, response_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The fields written back to the batch (module docstring); ``response_mask`` nested."""
    from verl.workers.utils.padding import response_to_nested

    padded_mask = response_mask.to_padded_tensor(0) if response_mask.is_nested else response_mask
    learn = torch.as_tensor(result.learn)[:, None]
    mask = padded_mask * learn.to(padded_mask.dtype)
    adv = torch.as_tensor(result.advantages)[:, None] * mask.float()
    nested_adv = response_to_nested(adv, response_mask)
    nested_mask = response_to_nested(mask, response_mask)
    return {
        "advantages": nested_adv,
        "returns": response_to_nested(adv.clone(), response_mask),
        "response_mask": nested_mask,
        "loss_mask": response_to_nested(mask.clone(), response_mask),
        "mcgpo_row": torch.arange(len(result.learn), dtype=torch.int64),
        "mcgpo_partner": torch.as_tensor(result.partner),
        "mcgpo_sign": torch.as_tensor(result.sign),
        "mcgpo_weight": torch.as_tensor(result.weight),
    }


def mini_batch_learned_rows(learn: np.ndarray, dp_size: int, rows_per_rank: int) -> np.ndarray:
    """Per row, the learned rows (not errored, not padding) of its mini-batch over all ranks.

    verl gives rank ``d`` rows ``[d*S, (d+1)*S)`` (``S = B / dp_size``) and each rank cuts
    its rows into mini-batches of ``rows_per_rank`` in order, so mini-batch ``j`` is local
    chunk ``j`` of every rank. This is the row count mcgpo's own trainer normalises the pair
    loss by (``|B_b| / |mini-batch|``: its mini-batches hold no padding or errored rows).
    """
    learn = np.asarray(learn, dtype=bool)
    size = len(learn) // dp_size
    chunk = (np.arange(len(learn)) % size) // rows_per_rank
    counts = np.bincount(chunk, weights=learn.astype(np.float64), minlength=int(chunk.max()) + 1)
    return counts[chunk].astype(np.int64)


def layout_partner(result: BatchCredit, algo: AlgoConfig, group_size: int) -> np.ndarray:
    """``[B]`` the row each row is laid out beside (-1 if none): the batch's MCGPO pairs.

    For MCGPO these are the pairs of the loss. For every other algorithm they are the pairs
    :func:`mcgpo.build_preferences` finds in the same rows with its default options, so that
    GraphGPO, GRPO and MCGPO (any ``lambda_pair``, default pair options) give verl the same
    row layout, hence the same mini-batches: the comparison differs only in the method.
    """
    if ALGORITHMS[algo.name].pairs:
        return result.partner
    partner = np.full(len(result.learn), -1, dtype=np.int64)
    learn = result.rows[~result.table.errored]
    if len(learn) == 0:
        return partner
    prefs = build_preferences(result.table.select(np.flatnonzero(~result.table.errored)),
                              group_size=group_size)  # fmt: skip
    plus, minus = learn[np.asarray(prefs.plus)], learn[np.asarray(prefs.minus)]
    partner[plus], partner[minus] = minus, plus
    return partner


def take(result: BatchCredit, order: Sequence[int]) -> BatchCredit:
    """``result`` for the batch reordered by ``order`` (new row i = old row ``order[i]``):
    per-row arrays permuted, partners renumbered; the table keeps its rows (``rows`` maps
    them to their new positions)."""
    order = np.asarray(order, dtype=np.int64)
    n = len(result.learn)
    if not np.array_equal(np.sort(order), np.arange(n)):
        raise ValueError(f"take: order is not a permutation of the batch's {n} rows")
    new_pos = np.empty(n, dtype=np.int64)
    new_pos[order] = np.arange(n)
    partner = result.partner[order]
    partner = np.where(partner >= 0, new_pos[np.maximum(partner, 0)], -1)
    return result._replace(
        rows=new_pos[result.rows], learn=result.learn[order],
        advantages=result.advantages[order], partner=partner, sign=result.sign[order],
        weight=result.weight[order],
    )  # fmt: skip
