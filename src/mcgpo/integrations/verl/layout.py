"""Where each row of a verl batch goes: preference pairs kept on one data-parallel rank and
spread over the rank's mini-batches like any other rows.

verl hands rank ``d`` the contiguous chunk ``d`` of the batch (``S = len(batch) / dp`` rows,
after its ``_balance_batch`` has reordered the rows so the chunks carry similar workloads);
with ``actor.shuffle=False`` each rank cuts its chunk into contiguous mini-batches of
``m = ppo_mini_batch_size * rollout.n / dp`` rows and each mini-batch into contiguous
micro-batches (fixed size, or token-balanced with ``force_group_size=2`` keeping rows
``2k, 2k+1`` together). The pair loss sees a pair only when its two rows share a micro-batch.
verl's balancing ignores pairs: on the recipe's batches it splits about ``1 - 1/dp`` of them
across ranks (docs/integrations/verl.md has the measured shares).

Two steps, both pure (numpy only), applied after verl's own balancing:

1. :func:`keep_pairs_together`: for each pair split across ranks, swap one of its rows with
   an unpaired row of the other rank, the one that keeps both ranks' workloads closest to the
   mean. Chunk sizes stay equal; only unpaired rows are ever moved a second time, so every
   pair is joined by one swap unless a rank has no unpaired row left (then it stays split and
   is counted).
2. :func:`spread_pairs`: inside a chunk, give each mini-batch an equal share of the chunk's
   pairs (``P // M`` or one more) on aligned positions ``2k, 2k+1`` spaced evenly through the
   mini-batch, and fill the rest with the unpaired rows in their previous order. Without this
   the pairs of a rank would cluster wherever verl's length order put them.

:func:`pair_layout` runs both and returns the new row order and what it did.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LayoutStats", "keep_pairs_together", "pair_layout", "spread_pairs"]


@dataclass(frozen=True)
class LayoutStats:
    """What :func:`pair_layout` did to one batch."""

    pairs: int  # pairs in the batch
    split_before: int  # pairs whose rows lay on two ranks after verl's balancing
    moved: int  # rows that changed rank
    split_after: int  # pairs still on two ranks (a rank had no unpaired row to swap)


def _check_partner(partner: np.ndarray) -> np.ndarray:
    partner = np.asarray(partner, dtype=np.int64).reshape(-1)
    n = len(partner)
    paired = np.flatnonzero(partner >= 0)
    if np.any(partner >= n) or np.any(partner < -1):
        raise ValueError(f"pair layout: partner ids must lie in [-1, {n}), got {partner.tolist()}")
    if np.any(partner[partner[paired]] != paired) or np.any(partner[paired] == paired):
        raise ValueError("pair layout: partner is not symmetric (row i -> j needs j -> i, i != j)")
    return partner


def keep_pairs_together(
    chunks: list[np.ndarray], partner: np.ndarray, workload: np.ndarray
) -> tuple[list[np.ndarray], int, int]:
    """``chunks`` (row ids per rank, equal sizes) with every split pair joined by a swap.

    ``partner[i]``: the row paired with row ``i``, -1 if none; ``workload[i]``: the row's
    cost in verl's balance (``calculate_workload`` of its length). Returns ``(chunks, rows
    moved, pairs still split)``; each chunk keeps its size and its rows' order, a swapped-in
    row taking the place of the row it replaced.
    """
    partner = _check_partner(partner)
    work = np.asarray(workload, dtype=np.float64).reshape(-1)
    rows = [np.array(c, dtype=np.int64) for c in chunks]
    n = sum(len(c) for c in rows)
    if n != len(partner) or len(work) != n:
        raise ValueError(
            f"pair layout: {n} rows in chunks, {len(partner)} partners, {len(work)} loads"
        )
    rank = np.empty(n, dtype=np.int64)
    slot = np.empty(n, dtype=np.int64)
    for r, c in enumerate(rows):
        rank[c], slot[c] = r, np.arange(len(c))
    if not np.array_equal(np.sort(np.concatenate(rows)), np.arange(n)):
        raise ValueError("pair layout: chunks must hold every row exactly once")
    load = np.array([work[c].sum() for c in rows])
    mean = load.mean()
    free = partner < 0
    start = rank.copy()
    still = 0
    firsts = np.flatnonzero((partner > np.arange(n)) & (rank != rank[np.maximum(partner, 0)]))
    for a in firsts:
        b = int(partner[a])
        best: tuple[float, int, int] | None = None  # (cost, row to move, row to swap with)
        for move, home in ((b, int(rank[a])), (int(a), int(rank[b]))):
            away = int(rank[move])
            cand = rows[home][free[rows[home]]]
            if len(cand) == 0:
                continue
            delta = work[move] - work[cand]  # home gains move, loses cand
            cost = np.abs(load[home] + delta - mean) + np.abs(load[away] - delta - mean)
            k = int(np.argmin(cost))
            if best is None or cost[k] < best[0]:
                best = (float(cost[k]), move, int(cand[k]))
        if best is None:
            still += 1
            continue
        _, move, other = best
        r_move, r_other = int(rank[move]), int(rank[other])
        s_move, s_other = int(slot[move]), int(slot[other])
        rows[r_move][s_move], rows[r_other][s_other] = other, move
        rank[move], rank[other] = r_other, r_move
        slot[move], slot[other] = s_other, s_move
        load[r_other] += work[move] - work[other]
        load[r_move] += work[other] - work[move]
    return rows, int(np.sum(rank != start)), still


def spread_pairs(chunk: np.ndarray, partner: np.ndarray, mini_rows: int) -> np.ndarray:
    """``chunk`` (one rank's rows, in order) with its pairs spread over its mini-batches.

    The chunk is cut into ``M = len(chunk) / mini_rows`` contiguous mini-batches. The pairs
    with both rows in the chunk are dealt out in order, mini-batch ``j`` taking ``P // M``
    of them plus one if ``j < P % M``, each on positions ``2k, 2k+1`` of the mini-batch with
    the ``p`` pair slots of a mini-batch at ``k = floor(i * (mini_rows / 2) / p)``; the other
    rows fill the remaining positions in their order in ``chunk``. ``mini_rows`` must divide
    the chunk and be even when the chunk holds a pair.
    """
    chunk = np.asarray(chunk, dtype=np.int64)
    partner = np.asarray(partner, dtype=np.int64)
    size = len(chunk)
    if mini_rows < 1 or size % mini_rows:
        raise ValueError(f"pair layout: {size} rows do not cut into mini-batches of {mini_rows}")
    inside = np.zeros(len(partner), dtype=bool)
    inside[chunk] = True
    firsts = [int(r) for r in chunk if partner[r] > r and inside[partner[r]]]
    if firsts and mini_rows % 2:
        raise ValueError(
            f"pair layout: mini-batches of {mini_rows} rows per rank are odd, so pairs cannot "
            "stay together; make ppo_mini_batch_size * rollout.n / dp even"
        )
    in_pair = set(firsts) | {int(partner[r]) for r in firsts}
    rest = [int(r) for r in chunk if int(r) not in in_pair]
    n_mini, half = size // mini_rows, mini_rows // 2
    out = np.empty(size, dtype=np.int64)
    taken, used = 0, 0
    for j in range(n_mini):
        p = len(firsts) // n_mini + (j < len(firsts) % n_mini)
        pair_slots = {i * half // p: firsts[taken + i] for i in range(p)}
        taken += p
        base = j * mini_rows
        for k in range(half):
            if k in pair_slots:
                a = pair_slots[k]
                out[base + 2 * k], out[base + 2 * k + 1] = a, partner[a]
            else:
                out[base + 2 * k], out[base + 2 * k + 1] = rest[used], rest[used + 1]
                used += 2
        if mini_rows % 2:  # no pairs here (checked above): the odd last row
            out[base + mini_rows - 1] = rest[used]
            used += 1
    return out


def pair_layout(
    partner: np.ndarray, workload: np.ndarray, parts: int, mini_rows: int
) -> tuple[np.ndarray, LayoutStats]:
    """The row order that keeps pairs on one rank and spreads them over mini-batches.

    The batch is in verl's balanced order: rank ``d`` holds rows ``[d*S, (d+1)*S)``.
    ``partner``/``workload`` are per row of that order; ``parts`` is the data-parallel size;
    ``mini_rows`` the rows of one mini-batch on one rank. Returns ``(order, stats)``: the
    batch reordered by ``order`` (``new[i] = old[order[i]]``) is what verl should dispatch.
    """
    partner = _check_partner(partner)
    n = len(partner)
    if parts < 1 or n % parts:
        raise ValueError(f"pair layout: {n} rows do not split into {parts} equal chunks")
    size = n // parts
    chunks = [np.arange(d * size, (d + 1) * size, dtype=np.int64) for d in range(parts)]
    rank = np.arange(n) // size
    paired = partner >= 0
    pairs = int(paired.sum()) // 2
    split_before = int(np.sum(paired & (rank != rank[np.maximum(partner, 0)]))) // 2
    joined, moved, still = keep_pairs_together(chunks, partner, workload)
    order = np.concatenate([spread_pairs(c, partner, mini_rows) for c in joined])
    return order, LayoutStats(pairs, split_before, moved, still)
