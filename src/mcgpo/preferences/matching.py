"""Context keys, first visits, fold evidence and candidate pairs (MCGPO steps 1-2).

Everything here works on the *decision rows*: rows of non-errored trajectories whose action
was valid (the "eligible" visits). Each rule level has its own action codes: the exact level
compares the texts, the coarse level (by default) the texts without instance numbers.
Integer codes are ranks of the sorted distinct values (:mod:`mcgpo.grouping`), so no result
depends on row order. Shapes: ``[E]`` = one entry per decision row, ``[P]`` = one entry per
candidate pair of one rule level.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mcgpo.envs.alfworld_keys import coarse
from mcgpo.grouping import combine_codes, value_codes
from mcgpo.preferences.options import PreferenceOptions
from mcgpo.steps import StepTable

__all__ = [
    "Decisions",
    "LevelPairs",
    "context_keys",
    "decisions",
    "level_keys",
    "level_pairs",
]


@dataclass(frozen=True)
class Decisions:
    """The eligible decision rows of a table. All arrays have shape ``[E]``."""

    row: np.ndarray  # int64   index of the row in the table as passed
    group: np.ndarray  # int64  rank of the group id
    fold: np.ndarray  # int64   0 (slot < split) or 1
    slot: np.ndarray  # int64   slot of the trajectory inside its group
    turn: np.ndarray  # int64   turn index of the decision
    traj: np.ndarray  # int64   rank of the trajectory id
    action: np.ndarray  # int64 rank code of the action text
    action_coarse: np.ndarray  # int64  action code at the coarse level (= action if "exact")
    success: np.ndarray  # float64  trajectory outcome y in {0, 1}


def decisions(table: StepTable, opts: PreferenceOptions) -> Decisions:
    """Eligible rows: valid action, trajectory not errored. Checks every slot < group_size."""
    bad = np.flatnonzero(table.slot >= opts.group_size)
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"build_preferences: row {i}: field 'slot' = {table.slot[i]} is not below "
            f"group_size {opts.group_size} (group {table.group[i]}); set group_size to the "
            "number of rollouts per group"
        )
    row = np.flatnonzero(table.action_valid & ~table.errored)
    slot = table.slot[row]
    action = value_codes(table.action[row])
    return Decisions(
        row=row,
        group=value_codes(table.group[row]),
        fold=(slot >= opts.split).astype(np.int64),
        slot=slot,
        turn=table.turn[row],
        traj=value_codes(table.traj[row]),
        action=action,
        action_coarse=coarse_action_codes(table.action[row], opts.coarse_actions, action),
        success=table.success[row],
    )


def coarse_action_codes(texts: np.ndarray, mode: str, exact: np.ndarray) -> np.ndarray:
    """Action codes at the coarse level: with ``mode`` "coarse" the text loses its instance
    numbers by the envs' state_coarse rule (``"take mug 1 from countertop 2"`` -> ``"take mug
    from countertop"``, :func:`mcgpo.envs.alfworld_keys.coarse`); "exact" keeps ``exact``."""
    if mode == "exact" or len(texts) == 0:
        return exact
    distinct = sorted(set(texts.tolist()))  # exact[i] is the rank of texts[i] here
    coarse_rank = value_codes(np.array([coarse(str(text)) for text in distinct], dtype=object))
    return coarse_rank[exact]


def context_keys(table: StepTable, rows: np.ndarray, matching: str) -> list[np.ndarray]:
    """Context-key codes of ``rows`` (``[len(rows)]`` each) for every rule level, in the
    order they are tried.

    joint: exact g = (h(s), C, F), coarse g = (h_coarse(s), C, F); state_only drops C and F;
    rubric_only keys on (C, F) alone, where both rules coincide, so only one level is built.
    Every key includes the group: contexts are only matched among siblings. Two rows share
    a code iff their key fields are equal, whichever ``rows`` are passed.
    """
    group = value_codes(table.group[rows])
    rubric = [value_codes(table.progress[rows]), value_codes(table.enabled[rows])]
    if matching == "rubric_only":
        return [combine_codes(group, *rubric)]
    extra = rubric if matching == "joint" else []
    exact = combine_codes(group, value_codes(table.state[rows]), *extra)
    coarse_key = combine_codes(group, value_codes(table.state_coarse[rows]), *extra)
    return [exact, coarse_key]


def level_keys(
    table: StepTable, dec: Decisions, matching: str
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(level name, context-key code, action code) per decision row for each rule level, in
    the order they are tried (keys: :func:`context_keys`). The exact level compares action
    texts as they are, the coarse level ``dec.action_coarse``.
    """
    keys = context_keys(table, dec.row, matching)
    if matching == "rubric_only":
        return [("exact", keys[0], dec.action)]
    return [("exact", keys[0], dec.action), ("coarse", keys[1], dec.action_coarse)]


@dataclass(frozen=True)
class LevelPairs:
    """Candidate pairs under one rule level, with their evidence. Arrays have shape ``[P]``.

    ``a`` is the row of the lower slot, ``b`` the other; both index :class:`Decisions`.
    """

    a: np.ndarray  # int64    decision of the lower-slot trajectory
    b: np.ndarray  # int64    decision of the higher-slot trajectory
    support_a: np.ndarray  # int64  |S(g, a_a)|: evidence trajectories for a's action
    support_b: np.ndarray  # int64  |S(g, a_b)|
    value_a: np.ndarray  # float64  u(g, a_a): mean success over S(g, a_a) (0 if empty)
    value_b: np.ndarray  # float64  u(g, a_b)


def level_pairs(dec: Decisions, key: np.ndarray, action: np.ndarray, evidence: str) -> LevelPairs:
    """First visits, evidence tables and candidate pairs for one context key; ``action`` is
    the level's action code per decision (two rows take "different actions" when it differs,
    and the evidence for an action counts the visits with its code)."""
    # first-visit rule: per (trajectory, key) keep the eligible row with the smallest turn
    order = np.lexsort((dec.turn, key, dec.traj))
    head = np.ones(len(order), dtype=bool)
    head[1:] = (dec.traj[order][1:] != dec.traj[order][:-1]) | (key[order][1:] != key[order][:-1])
    visits = order[head]  # one decision per (trajectory, key)

    # evidence: per (key, action, fold) count of first visits and their successes
    k, act, fold = key[visits], action[visits], dec.fold[visits]
    key_action = combine_codes(k, act)  # one code per (key, action) of a first visit
    n_key_action = int(key_action.max(initial=-1)) + 1
    key_action_fold = key_action * 2 + fold
    count = np.bincount(key_action_fold, minlength=2 * n_key_action).reshape(n_key_action, 2)
    wins = np.bincount(
        key_action_fold, weights=dec.success[visits], minlength=2 * n_key_action
    ).reshape(n_key_action, 2)

    # candidate pairs: two first visits of one key by trajectories of the same fold that took
    # different actions (leave_pair_out: of any two trajectories of the group). Sorted by
    # (key, fold, slot), bucket members are consecutive, so pairs are found by comparing each
    # position with the ones d places further on.
    bucket = np.zeros_like(fold) if evidence == "leave_pair_out" else fold
    by_bucket = np.lexsort((dec.slot[visits], bucket, k))
    first, second = [], []
    for d in range(1, len(by_bucket)):
        i, j = by_bucket[:-d], by_bucket[d:]
        same = (k[i] == k[j]) & (bucket[i] == bucket[j])
        if not same.any():
            break
        keep = same & (act[i] != act[j])
        first.append(i[keep])
        second.append(j[keep])
    low = np.concatenate(first) if first else np.zeros(0, dtype=np.int64)  # lower slot
    high = np.concatenate(second) if second else np.zeros(0, dtype=np.int64)  # higher slot

    f, cell_low, cell_high = fold[low], key_action[low], key_action[high]
    if evidence == "leave_pair_out":  # every trajectory of the group but the pair's two
        # a's cell holds a's own first visit and not b's (b took another action at this
        # level, and a trajectory has one first visit per key), and vice versa
        y = dec.success[visits]
        cnt_a, win_a = count[cell_low].sum(1) - 1, wins[cell_low].sum(1) - y[low]
        cnt_b, win_b = count[cell_high].sum(1) - 1, wins[cell_high].sum(1) - y[high]
    elif evidence == "opposite_fold":  # cross-fitted: the other fold labels this one
        cnt, win = count[:, ::-1], wins[:, ::-1]
        cnt_a, win_a = cnt[cell_low, f], win[cell_low, f]
        cnt_b, win_b = cnt[cell_high, f], win[cell_high, f]
    elif evidence == "same_fold":  # in-sample control: the candidates' own fold
        cnt_a, win_a = count[cell_low, f], wins[cell_low, f]
        cnt_b, win_b = count[cell_high, f], wins[cell_high, f]
    else:  # pooled: every trajectory of the group
        cnt_a, win_a = count[cell_low].sum(1), wins[cell_low].sum(1)
        cnt_b, win_b = count[cell_high].sum(1), wins[cell_high].sum(1)
    return LevelPairs(
        a=visits[low],
        b=visits[high],
        support_a=cnt_a,
        support_b=cnt_b,
        value_a=win_a / np.maximum(cnt_a, 1),
        value_b=win_b / np.maximum(cnt_b, 1),
    )
