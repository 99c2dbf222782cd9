"""The micro-batch planner: rows of a mini-batch cut into micro-batches, pair partners
kept together, so that the pair loss of every micro-batch sees both rows of its pairs
(:func:`mcgpo.objectives.pair_loss`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["MicroBatchPlan", "plan_micro_batches"]


@dataclass(frozen=True)
class MicroBatchPlan:
    """Rows of a mini-batch laid into micro-batches, partners together."""

    batches: list[np.ndarray]  # each [<= micro_batch_size] int64 row ids of one micro-batch
    split_pairs: int  # pairs whose rows ended in different micro-batches


def plan_micro_batches(
    n_rows: int, micro_batch_size: int, plus: np.ndarray, minus: np.ndarray
) -> MicroBatchPlan:
    """Cut rows ``0..n_rows-1`` into micro-batches of ``micro_batch_size`` keeping partners.

    ``plus`` / ``minus``: ``[P]`` row ids (in ``0..n_rows-1``) of the pairs; a row may belong
    to one pair at most (:func:`mcgpo.build_preferences` guarantees it). Deterministic
    layout: pairs in order of their smaller row id, each partner next to the other, then the
    unpaired rows in increasing order. When a batch has one free place and the next unit is
    a pair, the first remaining unpaired row fills it; if none is left, the pair starts a new
    batch and that batch stays one short. Pairs are split only when
    ``micro_batch_size == 1``. ``split_pairs`` counts the split pairs.
    """
    plus = np.asarray(plus, dtype=np.int64).reshape(-1)
    minus = np.asarray(minus, dtype=np.int64).reshape(-1)
    if micro_batch_size < 1:
        raise ValueError(
            f"plan_micro_batches: micro_batch_size must be >= 1, got {micro_batch_size}"
        )
    if len(plus) != len(minus):
        raise ValueError("plan_micro_batches: plus and minus differ in length")
    rows = np.concatenate([plus, minus])
    if len(rows) and (rows.min() < 0 or rows.max() >= n_rows):
        raise ValueError(f"plan_micro_batches: a pair row lies outside 0..{n_rows - 1}")
    if np.any(plus == minus):
        raise ValueError("plan_micro_batches: a pair joins a row with itself")
    if len(np.unique(rows)) != len(rows):
        raise ValueError("plan_micro_batches: a row belongs to two pairs")
    first = np.minimum(plus, minus)
    order = np.argsort(first, kind="stable")
    pairs = [(int(first[i]), int(np.maximum(plus, minus)[i])) for i in order]
    paired = np.zeros(n_rows, dtype=bool)
    paired[rows] = True
    singles = np.flatnonzero(~paired).tolist()
    batches: list[list[int]] = [[]]
    s = 0
    for a, b in pairs:
        if micro_batch_size - len(batches[-1]) == 1:  # one place left: a pair cannot fit
            if s < len(singles):
                batches[-1].append(singles[s])
                s += 1
            batches.append([])  # full now, or one short when no unpaired row is left
        batches[-1].append(a)
        if len(batches[-1]) == micro_batch_size:
            batches.append([])
        batches[-1].append(b)
        if len(batches[-1]) == micro_batch_size:
            batches.append([])
    for row in singles[s:]:
        batches[-1].append(row)
        if len(batches[-1]) == micro_batch_size:
            batches.append([])
    out = [np.asarray(batch, dtype=np.int64) for batch in batches if batch]
    where = np.empty(n_rows, dtype=np.int64)
    for i, batch in enumerate(out):
        where[batch] = i
    split = int(np.sum(where[plus] != where[minus])) if len(plus) else 0
    return MicroBatchPlan(batches=out, split_pairs=split)
