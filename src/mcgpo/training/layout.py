"""The layout of one update: which rows form each optimiser step and micro-batch, and, with
W > 1 processes, which rank runs which micro-batches (docs in :mod:`mcgpo.training.update`,
items 3, 4 and 7).

* :func:`plan_mini_batches`: whole task groups packed into mini-batches (one AdamW step each).
* :func:`plan_layout`: inside each mini-batch, rows by length cut into micro-batches that
  keep pair partners together (:func:`mcgpo.objectives.plan_micro_batches`).
* :func:`batch_outline`, :func:`deal`, :func:`fetch_rows`, :func:`same_pass_count`: the
  ranks gather the whole batch's outline (row lengths, advantages, pairs, groups: no
  tokens), plan the single process's layout of it, deal each step's micro-batches out
  (:func:`owners`, the LPT rule the warm start's steps use too) and fetch the token rows of
  their share from the ranks that hold them; :func:`plan_rank_share` puts these together
  for one rank.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from mcgpo.objectives import plan_micro_batches
from mcgpo.rollout.tokens import TokenBatch
from mcgpo.training.config import TrainConfig
from mcgpo.training.distributed import World, exchange_objects, gather_objects, sharded

__all__ = [
    "Layout",
    "Outline",
    "PairBatch",
    "batch_outline",
    "deal",
    "fetch_rows",
    "layout_of",
    "owners",
    "pairs_inside",
    "plan_layout",
    "plan_mini_batches",
    "plan_rank_share",
    "same_pass_count",
]


@dataclass(frozen=True)
class PairBatch:
    """Preference pairs over the rows of a batch (empty for algorithms without pairs)."""

    plus: np.ndarray  # [P] int64 row index of the preferred decision
    minus: np.ndarray  # [P] int64 row index of the dispreferred decision
    weight: np.ndarray  # [P] float64 c of each pair

    @classmethod
    def empty(cls) -> PairBatch:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z, np.zeros(0))


def pairs_inside(rows: np.ndarray, pairs: PairBatch) -> PairBatch:
    """The pairs with both rows in ``rows``, re-indexed to positions in ``rows``."""
    if len(pairs.plus) == 0 or len(rows) == 0:  # no rows: a step of other ranks' groups only
        return PairBatch.empty()
    where = np.full(int(max(rows.max(), pairs.plus.max(), pairs.minus.max())) + 1, -1)
    where[rows] = np.arange(len(rows))
    a, b = where[pairs.plus], where[pairs.minus]
    keep = (a >= 0) & (b >= 0)
    return PairBatch(a[keep], b[keep], pairs.weight[keep])


def plan_mini_batches(n_rows: int, size: int, groups: np.ndarray | None = None) -> list[np.ndarray]:
    """Row ids of each optimiser step: whole task groups, packed to at most ``size`` rows.

    ``groups``: ``[n_rows]`` group id of each row (the StepTable's ``group`` column); None
    makes every row its own group. Groups are taken in order of their first row; a group
    joins the current mini-batch while that keeps it at most ``size`` rows, otherwise it
    starts the next one (a group larger than ``size`` is a mini-batch of its own, never cut).
    Each mini-batch lists its rows in row order. ``size <= 0`` or ``size >= n_rows``: one
    mini-batch. The layout does not look at preference pairs, so every algorithm gets the
    same mini-batches; a pair lies inside one group and therefore inside one mini-batch.
    """
    if groups is None:
        groups = np.arange(n_rows)
    groups = np.asarray(groups).reshape(-1)
    if groups.shape != (n_rows,):
        raise ValueError(f"groups has shape {groups.shape}, expected ({n_rows},)")
    if size <= 0 or size >= n_rows:
        return [np.arange(n_rows, dtype=np.int64)]
    _, first, member = np.unique(groups, return_index=True, return_inverse=True)
    counts = np.bincount(member)
    step_of_group = np.empty(len(first), dtype=np.int64)
    step, rows = 0, 0
    for g in np.argsort(first, kind="stable"):
        if rows and rows + counts[g] > size:
            step, rows = step + 1, 0
        step_of_group[g] = step
        rows += counts[g]
    step_of_row = step_of_group[member]
    return [np.flatnonzero(step_of_row == k) for k in range(step + 1)]


@dataclass(frozen=True)
class Layout:
    """The rows of every micro-batch of every optimiser step, planned once per update."""

    steps: list[list[np.ndarray]]  # [mini-batch][micro-batch] -> batch row ids
    rows: list[int]  # rows of each mini-batch, over all ranks
    tokens: list[int]  # response tokens of each mini-batch, over all ranks
    split_mini: int  # pairs whose two rows lie in different mini-batches
    split_micro: int  # pairs inside one mini-batch whose rows lie in different micro-batches
    widest: int  # token slots (rows x padded length) of the largest micro-batch


def plan_layout(
    batch: TokenBatch, cfg: TrainConfig, pairs: PairBatch, groups: np.ndarray | None
) -> Layout:
    """Mini-batches by task group; inside each, rows by length cut into micro-batches."""
    lengths = batch.attention_mask.sum(1).cpu().numpy()
    responses = batch.response_mask.sum(1).cpu().numpy()
    return layout_of(lengths, responses, cfg, pairs, groups)


def layout_of(
    lengths: np.ndarray,
    responses: np.ndarray,
    cfg: TrainConfig,
    pairs: PairBatch,
    groups: np.ndarray | None,
) -> Layout:
    """:func:`plan_layout` from each row's real-token and response-token counts alone."""
    n = len(lengths)
    minis = plan_mini_batches(n, cfg.mini_batch_size, groups)
    step_of_row = np.empty(n, dtype=np.int64)
    for k, mini in enumerate(minis):
        step_of_row[mini] = k
    split_mini = int(np.sum(step_of_row[pairs.plus] != step_of_row[pairs.minus]))
    steps, split_micro = [], 0
    for mini in minis:
        by_length = mini[np.argsort(lengths[mini], kind="stable")]  # less padding
        inside = pairs_inside(by_length, pairs)
        if len(mini) == 0:
            micros, split = [], 0
        elif 0 < cfg.micro_batch_size < len(mini):
            plan = plan_micro_batches(len(mini), cfg.micro_batch_size, inside.plus, inside.minus)
            micros, split = list(plan.batches), plan.split_pairs
        else:
            micros, split = [np.arange(len(mini))], 0
        steps.append([by_length[m] for m in micros])
        split_micro += split
    widest = max(
        (len(rows) * int(lengths[rows].max()) for micros in steps for rows in micros), default=0
    )
    rows = [len(mini) for mini in minis]
    tokens = [int(responses[mini].sum()) for mini in minis]
    return Layout(steps, rows, tokens, split_mini, split_micro, widest)


@dataclass(frozen=True)
class Outline:
    """The whole batch as every rank sees it when planning the update: everything the
    layout needs, no tokens. Rows and groups are numbered as in the single process (the
    ranks hold contiguous blocks of whole groups, laid end to end in rank order)."""

    lengths: np.ndarray  # [n] int64 real tokens of each row
    responses: np.ndarray  # [n] int64 response tokens of each row
    advantages: np.ndarray  # [n]
    pairs: PairBatch  # in whole-batch row ids
    groups: np.ndarray  # [n] int64 whole-batch group ids
    starts: np.ndarray  # [W + 1] int64: rank r holds rows starts[r] .. starts[r + 1] - 1


def batch_outline(
    batch: TokenBatch,
    advantages: np.ndarray,
    pairs: PairBatch,
    groups: np.ndarray | None,
    world: World,
) -> Outline:
    """Every rank's rows laid end to end in rank order, with row and group ids shifted past
    the earlier ranks'. One gather of small arrays per update (a few numbers per row); the
    token rows stay where they are until :func:`fetch_rows` moves the ones another rank
    runs."""
    if groups is None:
        groups = np.arange(len(batch))
    mine = (
        batch.attention_mask.sum(1).cpu().numpy().astype(np.int64),
        batch.response_mask.sum(1).cpu().numpy().astype(np.int64),
        np.asarray(advantages),
        pairs,
        np.asarray(groups).reshape(-1),
    )
    parts = gather_objects(mine, world)
    starts = np.cumsum([0] + [len(p[0]) for p in parts]).astype(np.int64)
    group_ids = np.cumsum([0] + [int(p[4].max()) + 1 if len(p[4]) else 0 for p in parts])
    return Outline(
        lengths=np.concatenate([p[0] for p in parts]),
        responses=np.concatenate([p[1] for p in parts]),
        advantages=np.concatenate([p[2] for p in parts]).astype(advantages.dtype, copy=False),
        pairs=PairBatch(
            np.concatenate([p[3].plus + r for p, r in zip(parts, starts)]).astype(np.int64),
            np.concatenate([p[3].minus + r for p, r in zip(parts, starts)]).astype(np.int64),
            np.concatenate([p[3].weight for p in parts]),
        ),
        groups=np.concatenate([p[4] + g for p, g in zip(parts, group_ids)]),
        starts=starts,
    )


def fetch_rows(
    batch: TokenBatch, wanted: list[np.ndarray], starts: np.ndarray, world: World
) -> TokenBatch:
    """The token rows this rank runs, from the ranks that hold them.

    ``batch``: this rank's own rows (whole-batch ids ``starts[rank] ..``); ``wanted[r]``:
    the sorted whole-batch row ids rank r runs (every rank computes every rank's share).
    Each rank sends every other rank only the rows it wants (:func:`exchange_objects`), so
    a rank receives its share of the batch, not the whole batch. Returns the rows of
    ``wanted[world.rank]`` in that order (the blocks are in rank order)."""
    lo, hi = int(starts[world.rank]), int(starts[world.rank + 1])
    cpu = batch.to("cpu")
    outgoing = [cpu.select(w[(w >= lo) & (w < hi)] - lo) for w in wanted]
    return TokenBatch.concatenate(exchange_objects(outgoing, world))


def owners(costs: list[int] | np.ndarray, ranks: int) -> np.ndarray:
    """The rank of each job (e.g. micro-batch) when the jobs go, largest cost first, to the
    rank with the least cost so far (ties: the lower rank; equal costs keep their order):
    the LPT rule. Every rank computes the same assignment from the same costs."""
    load, owner = np.zeros(ranks), np.empty(len(costs), dtype=np.int64)
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):  # stable: ties keep order
        owner[i] = int(np.argmin(load))
        load[owner[i]] += costs[i]
    return owner


def deal(layout: Layout, lengths: np.ndarray, ranks: int) -> list[tuple[Layout, np.ndarray]]:
    """Every rank's micro-batches of every step of the whole batch's layout, and its rows
    (``lengths``: real tokens of each row of the whole batch); entry r is rank r's.

    In each step the micro-batches go, largest first (rows x padded length), to the rank
    with the least work so far in that step (ties: the lower rank), and keep their order;
    every rank computes the same assignment, once for all ranks. Each entry is the layout
    with that rank's micro-batches as positions in its rows (the whole batch's
    ``select(rows)``), the normalisers of the whole steps unchanged, the layout-wide pair
    counts on rank 0 only (the metrics merge sums them over the ranks), and the rows in
    batch order.
    """
    owner = [
        owners([len(rows) * int(lengths[rows].max()) for rows in micros], ranks)
        for micros in layout.steps
    ]
    shares = []
    for rank in range(ranks):
        steps = [
            [rows for rows, r in zip(micros, who) if r == rank]
            for micros, who in zip(layout.steps, owner)
        ]
        rows = np.sort(np.concatenate([r for micros in steps for r in micros] or [np.zeros(0)]))
        rows = rows.astype(np.int64)
        where = np.full(len(lengths), -1, dtype=np.int64)
        where[rows] = np.arange(len(rows))
        first = rank == 0
        local = dataclasses.replace(
            layout,
            steps=[[where[r] for r in micros] for micros in steps],
            split_mini=layout.split_mini if first else 0,
            split_micro=layout.split_micro if first else 0,
        )
        shares.append((local, rows))
    return shares


def same_pass_count(layout: Layout, shares: list[Layout]) -> Layout:
    """FSDP2: every forward and backward all-gathers parameters (a collective), so each
    rank makes as many passes in a step as the rank with the most micro-batches in it
    (``shares``: every rank's layout, from :func:`deal`); the extra passes are empty row
    sets (a zero-loss pass, see :func:`~mcgpo.training.distributed.zero_backward`)."""
    most = np.max([[len(micros) for micros in share.steps] for share in shares], axis=0)
    empty = np.zeros(0, dtype=np.int64)
    steps = [micros + [empty] * (int(m) - len(micros)) for micros, m in zip(layout.steps, most)]
    return dataclasses.replace(layout, steps=steps)


def plan_rank_share(
    model: Any,
    batch: TokenBatch,
    advantages: np.ndarray,
    pairs: PairBatch,
    groups: np.ndarray | None,
    cfg: TrainConfig,
    world: World,
) -> tuple[TokenBatch, np.ndarray, PairBatch, Layout, int] | None:
    """The single process's layout of the whole batch and this rank's part of it: its rows,
    advantages and pairs (renumbered), the layout of its micro-batches, and the pairs it
    reports as given (all on rank 0, none elsewhere). None for an empty batch."""
    if world.size == 1:
        if len(batch) == 0:
            return None
        return batch, advantages, pairs, plan_layout(batch, cfg, pairs, groups), len(pairs.plus)
    # every rank plans the single process's layout of the whole batch from its outline ...
    whole = batch_outline(batch, advantages, pairs, groups, world)
    if len(whole.lengths) == 0:
        return None
    layout = layout_of(whole.lengths, whole.responses, cfg, whole.pairs, whole.groups)
    given = len(whole.pairs.plus) if world.main else 0
    # ... and runs its share of the micro-batches of every step, fetching their rows
    shares = deal(layout, whole.lengths, world.size)
    layout, mine = shares[world.rank]
    batch = fetch_rows(batch, [rows for _, rows in shares], whole.starts, world)
    advantages, pairs = whole.advantages[mine], pairs_inside(mine, whole.pairs)
    if sharded(model):
        layout = same_pass_count(layout, [share for share, _ in shares])
    return batch, advantages, pairs, layout, given
