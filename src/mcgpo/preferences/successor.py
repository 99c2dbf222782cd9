"""Successor-state support (``support="successor"``; ours, not the paper's).

docs/algorithms/mcgpo.md detail 12b. The environments are deterministic, so the state an
action leads to is the context of the next turn of the trajectory that took it. At rule
level l, the evidence for the action x of a candidate decision at context g is

    E_l(x) = { j in the evidence set : j's first visit of g took x  (the direct evidence)
                                       or j was in succ_l(x) at any turn }

with succ_l(x) the level-l context key of the turn after x in x's own trajectory (the
candidate's own next row; none after a trajectory's last turn, where only the direct
evidence is left). A trajectory counts once however it qualifies, so u_l(x) is the mean
outcome of |E_l(x)| distinct trajectories. "Was in" counts every row of a non-errored
trajectory, its invalid turns included: being in a state does not depend on what was then
said. The evidence set is the mode's (opposite fold, same fold, pooled, or all but the
pair's two trajectories), so the held-out property of the mode is kept.

Trajectories are indexed by (group, slot), unique in a valid StepTable, so each level needs
two dense ``[keys, N]`` tables: "visited" and "action of the first eligible visit".
"""

from __future__ import annotations

import numpy as np

from mcgpo.grouping import value_codes
from mcgpo.preferences.matching import Decisions, LevelPairs, context_keys
from mcgpo.preferences.options import PreferenceOptions
from mcgpo.steps import StepTable

__all__ = ["successor_support"]


def successor_support(
    table: StepTable,
    dec: Decisions,
    parts: list[LevelPairs],
    actions: list[np.ndarray],
    opts: PreferenceOptions,
) -> list[LevelPairs]:
    """The candidate pairs of every rule level (``parts``, with ``actions`` their levels'
    action codes per decision), their evidence recounted over E_l(x): same pairs, new
    support and values."""
    rows = np.flatnonzero(~table.errored)  # sorted, so dec.row (a subset) is found by search
    keys = context_keys(table, rows, opts.matching)
    at = np.searchsorted(rows, dec.row)  # position of each decision among ``rows``
    slot = table.slot[rows]
    group = value_codes(table.group[rows])
    n = opts.group_size
    outcome = np.zeros((int(group.max(initial=-1)) + 1, n))
    outcome[group, slot] = table.success[rows]
    # the next turn of the same trajectory (turns are contiguous): its row among ``rows``
    order = np.lexsort((table.turn[rows], table.traj[rows]))
    follows = table.traj[rows][order][1:] == table.traj[rows][order][:-1]
    after = np.full(len(rows), -1, dtype=np.int64)
    after[order[:-1][follows]] = order[1:][follows]
    out = []
    for part, key, action in zip(parts, keys, actions):
        n_keys = int(key.max(initial=-1)) + 1
        visited = np.zeros((n_keys + 1, n), dtype=bool)  # last row: "no successor"
        visited[key, slot] = True
        first = _first_action(key[at], action, dec, n_keys, n)
        succ = np.where(after[at] >= 0, key[np.maximum(after[at], 0)], n_keys)
        mask = _evidence_mask(dec, part, opts)
        counts = []
        for x in (part.a, part.b):
            held = ((first[key[at][x]] == action[x][:, None]) | visited[succ[x]]) & mask
            counts.append((held.sum(1), (held * outcome[group[at][x]]).sum(1)))
        (cnt_a, win_a), (cnt_b, win_b) = counts
        out.append(
            LevelPairs(
                a=part.a,
                b=part.b,
                support_a=cnt_a.astype(np.int64),
                support_b=cnt_b.astype(np.int64),
                value_a=win_a / np.maximum(cnt_a, 1),
                value_b=win_b / np.maximum(cnt_b, 1),
            )
        )
    return out


def _first_action(
    key: np.ndarray, action: np.ndarray, dec: Decisions, n_keys: int, n: int
) -> np.ndarray:
    """``[keys, N]``: the action code of each trajectory's first eligible visit of each key
    (-1 where it has none), ``key`` and ``action`` per decision."""
    order = np.lexsort((dec.turn, key, dec.traj))
    head = np.ones(len(order), dtype=bool)
    head[1:] = (dec.traj[order][1:] != dec.traj[order][:-1]) | (key[order][1:] != key[order][:-1])
    visits = order[head]
    first = np.full((n_keys, n), -1, dtype=np.int64)
    first[key[visits], dec.slot[visits]] = action[visits]
    return first


def _evidence_mask(dec: Decisions, part: LevelPairs, opts: PreferenceOptions) -> np.ndarray:
    """``[P, N]``: the slots whose trajectories may label each pair under ``opts.evidence``."""
    slot_fold = np.arange(opts.group_size) >= opts.split
    fold = dec.fold[part.a][:, None].astype(bool)
    if opts.evidence == "opposite_fold":
        return slot_fold[None, :] != fold
    if opts.evidence == "same_fold":
        return slot_fold[None, :] == fold
    mask = np.ones((len(part.a), opts.group_size), dtype=bool)
    if opts.evidence == "leave_pair_out":  # every trajectory but the pair's two
        every = np.arange(len(part.a))
        mask[every, dec.slot[part.a]] = False
        mask[every, dec.slot[part.b]] = False
    return mask
