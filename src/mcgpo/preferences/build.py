"""build_preferences: folds, matching, resolution, labels, weights and allocation.

Per group of N sibling rollouts (seed steps 1-4; docs/algorithms/mcgpo.md):

    folds     F0 = slots < N/2, F1 = the rest; each fold supplies candidates, the other labels
    match     g = (h(s), C, F); first eligible visit per (trajectory, g); a candidate pair is
              two first visits of g by trajectories of one fold with different actions
    resolve   exact rule, else coarse rule; a rule qualifies when both actions have
              |S(g, a)| >= m evidence trajectories; chosen before the gap is seen. The
              coarse rule reads actions without instance numbers (``coarse_actions``)
    label     Delta_u = u(g, a+) - u(g, a-) > 0, kept if |Delta_u| >= epsilon
    weight    c = |Delta_u| * n / (n + kappa) * q_level,  n = min(|S(g, a+)|, |S(g, a-)|)
    allocate  earliest comparison per sibling pair; <= max_per_fold per fold; rows used once

Departures from the seed (which is all that is known of the paper), and why:

* Rows of errored trajectories are skipped entirely (neither candidates nor evidence): their
  outcome says nothing about the actions.
* ``evidence="same_fold"`` labels a fold with its own trajectories, the two candidates
  included (the in-sample control); ``"pooled"`` uses all N trajectories.
* ``evidence="leave_pair_out"`` (ours, not the paper's): a candidate pair may join any two
  siblings, and is labelled by the other N - 2 (6 of 8 instead of 4); its label does not
  depend on the two candidates' outcomes. The group's candidates are one pool, capped at
  ``2 * max_per_fold`` (the two folds' budget).
* ``weighting="beta"`` (ours): c = 2 P(u+ > u-) - 1 under Beta posteriors with a prior at
  the context's held-out success rate (:func:`beta_confidence`), times q_level.
* ``support="successor"`` (ours): an action's evidence also counts the held-out trajectories
  that visited the state it leads to (:mod:`~mcgpo.preferences.successor`);
  ``blend="inverse_variance"`` (ours): the supported levels' values are blended by their
  precision instead of "first rule wins" (:mod:`~mcgpo.preferences.blending`).
* A gap of exactly 0 has no direction and is dropped even when ``epsilon = 0``; ``|Delta_u|``
  is compared with ``epsilon - 1e-12`` so that fractions such as 7/12 - 1/3 meet 0.25.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mcgpo.preferences.allocation import allocate
from mcgpo.preferences.blending import blend_levels
from mcgpo.preferences.confidence import beta_confidence
from mcgpo.preferences.matching import Decisions, decisions, level_keys, level_pairs
from mcgpo.preferences.options import PreferenceOptions
from mcgpo.preferences.successor import successor_support
from mcgpo.steps import StepTable

__all__ = ["Preferences", "beta_confidence", "build_preferences"]

_GAP_TOL = 1e-12


@dataclass(frozen=True, eq=False)
class Preferences:
    """Weighted preferences between decision rows. Arrays have shape ``[P]``.

    Ordered by group id, then fold, then allocation order (earliest first).
    """

    plus: np.ndarray  # int64   row index (in the table as passed) of the preferred decision
    minus: np.ndarray  # int64  row index of the dispreferred decision
    weight: np.ndarray  # float64  c = |Delta_u| * n/(n + kappa) * q_level
    level: np.ndarray  # object(str)  "exact" or "coarse": the rule that resolved the pair
    group: np.ndarray  # int64  group id of the pair (the table's value)
    fold: np.ndarray  # int64   candidate fold (0: slots < split, 1: the rest)
    gap: np.ndarray  # float64  Delta_u = u(g, a+) - u(g, a-) > 0
    support: np.ndarray  # int64  n = min(|S(g, a+)|, |S(g, a-)|)
    stats: dict[str, float]

    def __len__(self) -> int:
        return len(self.plus)


@dataclass(frozen=True)
class _Candidates:
    """Candidate pairs of every rule level, stacked (level 0 = exact first). Shape ``[C]``."""

    a: np.ndarray  # int64  decision (index into Decisions) of the lower-slot trajectory
    b: np.ndarray  # int64  decision of the higher-slot trajectory
    level: np.ndarray  # int64  index into level_names of the rule that matched the pair
    support_a: np.ndarray  # int64  |S(g, a_a)| under that rule
    support_b: np.ndarray  # int64  |S(g, a_b)|
    gap: np.ndarray  # float64  u(g, a_a) - u(g, a_b), either sign
    value_a: np.ndarray  # float64  u(g, a_a)
    value_b: np.ndarray  # float64  u(g, a_b)
    level_names: list[str]  # [L] "exact", "coarse"


def build_preferences(
    table: StepTable, options: PreferenceOptions | None = None, **kwargs: Any
) -> Preferences:
    """MCGPO matched-context preferences from the sibling rollouts in ``table``.

    Options: a :class:`PreferenceOptions` or its fields as keywords (defaults, reasons and
    checks there; meaning in docs/algorithms/mcgpo.md). Pure and deterministic: the set of
    preferences does not depend on row order.
    """
    if not isinstance(table, StepTable):
        raise TypeError(f"build_preferences expects a StepTable, got {type(table).__name__}")
    opts = options if options is not None else PreferenceOptions.from_kwargs(kwargs)
    dec = decisions(table, opts)
    cand = _evidence(table, dec, opts)
    resolved, n_candidates = _resolve(cand, len(dec.row), opts.min_support)
    labelled = _label(cand.gap, resolved, opts.epsilon)
    kept = labelled[_allocate(dec, cand, labelled, opts)]
    a_wins = cand.gap[kept] > 0
    plus = np.where(a_wins, cand.a[kept], cand.b[kept])
    minus = np.where(a_wins, cand.b[kept], cand.a[kept])
    support = np.minimum(cand.support_a[kept], cand.support_b[kept])
    level = np.array([cand.level_names[i] for i in cand.level[kept]], dtype=object)
    if opts.weighting == "beta":
        n_a, n_b = cand.support_a[kept], cand.support_b[kept]
        win_a, win_b = cand.value_a[kept] * n_a, cand.value_b[kept] * n_b
        win_p, n_p = np.where(a_wins, win_a, win_b), np.where(a_wins, n_a, n_b)
        win_m, n_m = np.where(a_wins, win_b, win_a), np.where(a_wins, n_b, n_a)
        weight = beta_confidence(win_p, n_p, win_m, n_m, opts.kappa) * _q_level(level, opts)
    else:
        weight = _weigh(np.abs(cand.gap[kept]), support, level, opts)
    in_pair = np.zeros(len(dec.row), dtype=bool)
    in_pair[cand.a] = in_pair[cand.b] = True
    prefs_group = table.group[dec.row[plus]]
    stats = _stats(
        table,
        prefs_group=prefs_group,
        level=level,
        weight=weight,
        gap=np.abs(cand.gap[kept]),
        rows_eligible=len(dec.row),
        rows_unmatched=int((~in_pair).sum()),
        candidates=n_candidates,
        no_support=n_candidates - len(resolved),
        below_epsilon=len(resolved) - len(labelled),
        allocation=len(labelled) - len(kept),
    )
    return Preferences(
        plus=dec.row[plus],
        minus=dec.row[minus],
        weight=weight.astype(np.float64),
        level=level,
        group=prefs_group,
        fold=_fold(dec, cand.a[kept], opts),
        gap=np.abs(cand.gap[kept]),
        support=support.astype(np.int64),
        stats=stats,
    )


def _evidence(table: StepTable, dec: Decisions, opts: PreferenceOptions) -> _Candidates:
    """Candidate pairs of every rule level with their evidence, stacked in level order; with
    ``blend="inverse_variance"`` each supported candidate carries its pair's blended values."""
    keys = level_keys(table, dec, opts.matching)
    parts = [level_pairs(dec, key, action, opts.evidence) for _, key, action in keys]
    if opts.support == "successor":
        parts = successor_support(table, dec, parts, [action for _, _, action in keys], opts)
    cand = _stack(parts, [name for name, _, _ in keys])
    if opts.blend == "first":
        return cand
    supported = (cand.support_a >= opts.min_support) & (cand.support_b >= opts.min_support)
    pair = cand.a * max(len(dec.row), 1) + cand.b  # the row-pair code of _resolve
    value_a, n_a = blend_levels(pair, cand.level, supported, cand.value_a, cand.support_a)
    value_b, n_b = blend_levels(pair, cand.level, supported, cand.value_b, cand.support_b)
    return replace(
        cand, value_a=value_a, value_b=value_b, support_a=n_a, support_b=n_b,
        gap=value_a - value_b,
    )  # fmt: skip


def _stack(parts: list, level_names: list[str]) -> _Candidates:
    return _Candidates(
        a=np.concatenate([p.a for p in parts]),
        b=np.concatenate([p.b for p in parts]),
        level=np.concatenate([np.full(len(p.a), i, dtype=np.int64) for i, p in enumerate(parts)]),
        support_a=np.concatenate([p.support_a for p in parts]),
        support_b=np.concatenate([p.support_b for p in parts]),
        gap=np.concatenate([p.value_a - p.value_b for p in parts]),
        value_a=np.concatenate([p.value_a for p in parts]),
        value_b=np.concatenate([p.value_b for p in parts]),
        level_names=level_names,
    )


def _resolve(cand: _Candidates, n_decisions: int, min_support: int) -> tuple[np.ndarray, int]:
    """Per row pair, the first level where both actions have ``min_support`` evidence.

    Returns the indices of the resolved candidates and the number of distinct row pairs;
    a pair unsupported at every level is dropped.
    """
    supported = (cand.support_a >= min_support) & (cand.support_b >= min_support)
    pair_id = cand.a * max(n_decisions, 1) + cand.b
    order = np.lexsort((cand.level, ~supported, pair_id))
    first_of_pair = np.ones(len(order), dtype=bool)
    first_of_pair[1:] = pair_id[order][1:] != pair_id[order][:-1]
    per_pair = order[first_of_pair]
    return per_pair[supported[per_pair]], len(per_pair)


def _label(gap: np.ndarray, resolved: np.ndarray, epsilon: float) -> np.ndarray:
    """The resolved candidates whose gap has a direction and |Delta_u| >= epsilon (the level
    is already fixed, so the gap cannot pick it)."""
    wide = (np.abs(gap[resolved]) >= epsilon - _GAP_TOL) & (gap[resolved] != 0)
    return resolved[wide]


def _fold(dec: Decisions, a: np.ndarray, opts: PreferenceOptions) -> np.ndarray:
    """The candidate fold of pairs (lower-slot decisions ``a``); -1 with leave_pair_out,
    whose pairs may join trajectories of both folds."""
    if opts.evidence == "leave_pair_out":
        return np.full(len(a), -1, dtype=np.int64)
    return dec.fold[a]


def _allocate(
    dec: Decisions, cand: _Candidates, labelled: np.ndarray, opts: PreferenceOptions
) -> np.ndarray:
    """Positions in ``labelled`` kept by earliest-per-sibling-pair, the cap and row-once.

    With leave_pair_out the group is one pool of candidates: the cap is ``2 x max_per_fold``
    per group, the budget of the two folds."""
    a, b = cand.a[labelled], cand.b[labelled]
    max_per_fold = opts.max_per_fold
    fold = dec.fold[a]
    if opts.evidence == "leave_pair_out":
        fold = np.zeros_like(fold)
        max_per_fold = None if max_per_fold is None else 2 * max_per_fold
    return allocate(
        dec.group[a],
        fold,
        dec.slot[a],
        dec.slot[b],
        dec.turn[a],
        dec.turn[b],
        a,
        b,
        max_per_fold,
    )


def _q_level(level: np.ndarray, opts: PreferenceOptions) -> np.ndarray:
    q_of_level = {"exact": opts.q_exact, "coarse": opts.q_coarse}
    return np.array([q_of_level[name] for name in level], dtype=np.float64)


def _weigh(
    gap: np.ndarray, support: np.ndarray, level: np.ndarray, opts: PreferenceOptions
) -> np.ndarray:
    """c = |Delta_u| * n / (n + kappa) * q_level ("evidence"), or q_level ("uniform")."""
    q_level = _q_level(level, opts)
    if opts.weighting == "evidence":
        return gap * support / (support + opts.kappa) * q_level
    return q_level


def _stats(
    table: StepTable,
    *,
    prefs_group: np.ndarray,
    level: np.ndarray,
    weight: np.ndarray,
    gap: np.ndarray,
    rows_eligible: int,
    rows_unmatched: int,
    candidates: int,
    no_support: int,
    below_epsilon: int,
    allocation: int,
) -> dict[str, float]:
    """Counts and rates; see docs/algorithms/mcgpo.md ("Reading the stats")."""
    n_groups = len(np.unique(table.group))
    n = len(weight)
    n_exact = int((level == "exact").sum())
    with_prefs = len(np.unique(prefs_group))
    return {
        "groups": float(n_groups),
        "preferences": float(n),
        "preferences_per_group": n / n_groups if n_groups else 0.0,
        "preferences_per_fold": n / (2 * n_groups) if n_groups else 0.0,
        "share_groups_without_preferences": (
            (n_groups - with_prefs) / n_groups if n_groups else 0.0
        ),
        "exact": float(n_exact),
        "coarse": float(n - n_exact),
        "rows_eligible": float(rows_eligible),
        "candidate_pairs": float(candidates),
        "dropped_no_match": float(rows_unmatched),
        "dropped_no_support": float(no_support),
        "dropped_below_epsilon": float(below_epsilon),
        "dropped_allocation": float(allocation),
        "mean_weight": float(weight.mean()) if n else 0.0,
        "mean_gap": float(gap.mean()) if n else 0.0,
    }
