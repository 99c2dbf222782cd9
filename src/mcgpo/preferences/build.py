"""build_preferences: folds, matching, resolution, labels, weights and allocation.

Per group of N sibling rollouts (seed steps 1-4; docs/algorithms/mcgpo.md):

    folds     F0 = slots < N/2, F1 = the rest; each fold supplies candidates, the other labels
    match     g = (h(s), C, F); first eligible visit per (trajectory, g); a candidate pair is
              two first visits of g by trajectories of one fold with different actions
    resolve   exact rule, else coarse rule; a rule qualifies when both actions have
              |S(g, a)| >= m evidence trajectories; chosen before the gap is seen
    label     Delta_u = u(g, a+) - u(g, a-) > 0, kept if |Delta_u| >= epsilon
    weight    c = |Delta_u| * n / (n + kappa) * q_level,  n = min(|S(g, a+)|, |S(g, a-)|)
    allocate  earliest comparison per sibling pair; <= max_per_fold per fold; rows used once

Departures from the seed (which is all that is known of the paper), and why:

* Rows of errored trajectories are skipped entirely (neither candidates nor evidence): their
  outcome says nothing about the actions.
* ``evidence="same_fold"`` labels a fold with its own trajectories, the two candidates
  included (the in-sample control); ``"pooled"`` uses all N trajectories.
* A gap of exactly 0 has no direction and is dropped even when ``epsilon = 0``; ``|Delta_u|``
  is compared with ``epsilon - 1e-12`` so that fractions such as 7/12 - 1/3 meet 0.25.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mcgpo.preferences.allocation import allocate
from mcgpo.preferences.matching import decisions, level_keys, level_pairs
from mcgpo.preferences.options import PreferenceOptions
from mcgpo.steps import StepTable

__all__ = ["Preferences", "build_preferences"]

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


def build_preferences(table: StepTable, **options: Any) -> Preferences:
    """MCGPO matched-context preferences from the sibling rollouts in ``table``.

    Options (keyword-only; defaults and meaning in :class:`PreferenceOptions` and
    docs/algorithms/mcgpo.md): ``group_size=8, fold_split=None (N/2), min_support=1,
    epsilon=0.25, kappa=0.0, q_exact=1.0, q_coarse=1.0, max_per_fold=2,
    evidence="opposite_fold" | "same_fold" | "pooled", weighting="evidence" | "uniform",
    matching="joint" | "state_only" | "rubric_only"``.

    Pure and deterministic: the set of preferences does not depend on row order.
    """
    if not isinstance(table, StepTable):
        raise TypeError(f"build_preferences expects a StepTable, got {type(table).__name__}")
    opts = PreferenceOptions.from_kwargs(options)
    dec = decisions(table, opts)
    n_dec = len(dec.row)
    q_level = {"exact": opts.q_exact, "coarse": opts.q_coarse}

    # match: candidate pairs of every level, stacked (level 0 = exact is tried first)
    keys = level_keys(table, dec, opts.matching)
    level_names = [name for name, _ in keys]
    parts = [level_pairs(dec, key, opts.evidence) for _, key in keys]
    a = np.concatenate([p.a for p in parts])
    b = np.concatenate([p.b for p in parts])
    lvl = np.concatenate([np.full(len(p.a), i, dtype=np.int64) for i, p in enumerate(parts)])
    sup_a = np.concatenate([p.support_a for p in parts])
    sup_b = np.concatenate([p.support_b for p in parts])
    gap = np.concatenate([p.value_a - p.value_b for p in parts])
    supported = (sup_a >= opts.min_support) & (sup_b >= opts.min_support)

    # resolve: per row pair, the first supported level; unsupported at every level -> drop
    pair_id = a * max(n_dec, 1) + b
    order = np.lexsort((lvl, ~supported, pair_id))
    head = np.ones(len(order), dtype=bool)
    head[1:] = pair_id[order][1:] != pair_id[order][:-1]
    chosen = order[head]
    n_candidates = len(chosen)
    chosen = chosen[supported[chosen]]
    n_no_support = n_candidates - len(chosen)

    # label: orientation by the gap; |Delta_u| >= epsilon (the level is already fixed)
    big = (np.abs(gap[chosen]) >= opts.epsilon - _GAP_TOL) & (gap[chosen] != 0)
    n_below = int((~big).sum())
    q = chosen[big]

    # allocate: earliest per sibling pair, cap per fold, rows once
    kept = q[
        allocate(
            dec.group[a[q]],
            dec.fold[a[q]],
            dec.slot[a[q]],
            dec.slot[b[q]],
            dec.turn[a[q]],
            dec.turn[b[q]],
            a[q],
            b[q],
            opts.max_per_fold,
        )
    ]
    a_wins = gap[kept] > 0
    plus = np.where(a_wins, a[kept], b[kept])
    minus = np.where(a_wins, b[kept], a[kept])
    n_min = np.minimum(sup_a[kept], sup_b[kept])
    level = np.array([level_names[i] for i in lvl[kept]], dtype=object)
    q_factor = np.array([q_level[name] for name in level], dtype=np.float64)
    if opts.weighting == "evidence":
        weight = np.abs(gap[kept]) * n_min / (n_min + opts.kappa) * q_factor
    else:
        weight = q_factor
    in_pair = np.zeros(n_dec, dtype=bool)
    in_pair[a] = in_pair[b] = True

    prefs_group = table.group[dec.row[plus]]
    stats = _stats(
        table,
        prefs_group=prefs_group,
        level=level,
        weight=weight,
        gap=np.abs(gap[kept]),
        rows_eligible=n_dec,
        rows_unmatched=int((~in_pair).sum()),
        candidates=n_candidates,
        no_support=n_no_support,
        below_epsilon=n_below,
        allocation=len(q) - len(kept),
    )
    return Preferences(
        plus=dec.row[plus],
        minus=dec.row[minus],
        weight=weight.astype(np.float64),
        level=level,
        group=prefs_group,
        fold=dec.fold[a[kept]],
        gap=np.abs(gap[kept]),
        support=n_min.astype(np.int64),
        stats=stats,
    )


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
