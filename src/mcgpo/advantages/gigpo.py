"""GiGPO: group-in-group advantages, an episode term plus an anchor-state step term.

Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training", arXiv 2505.10978;
reference code: verl-agent ``gigpo/core_gigpo.py``. With S_r the row's episode score (the
trajectory return minus the row's invalid-action penalty) and R_t the discounted step return:

    A^E(r) = (S_r - mean_g S) / F_norm                               (Eq. 3)
    R_t    = sum_{k>=t} gamma^(k-t) r_k  - invalid_penalty * [a_t invalid]   (Eq. 5)
    G^S(s) = {(i, t) in the task group : s_t^(i) = s}                (Eq. 6)
    A^S(r) = (R_t - mean_{G^S} R) / F_norm(G^S),   0 for a singleton (Eq. 7)
    A      = episode_advantage_w * A^E + step_advantage_w * A^S      (Eq. 8)

F_norm = std + eps (``mode="mean_std_norm"``, "GiGPO w/ std") or 1 (``"mean_norm"``,
"w/o std"); the std is the unbiased sample std, as in the reference.

Where this departs from the paper / reference code, and why (docs/algorithms/gigpo.md):

1. Episode statistics are taken once per trajectory by default (``cross_steps=False``, the
   paper's Eq. 3); ``cross_steps=True`` gives the reference code's statistics over step rows.
2. Similarity grouping is row-order independent: the distinct anchors of a task group are
   clustered greedily in sorted string order (the code clusters rows in batch order), and the
   measure is the normalised LCS (Indel) similarity 2*LCS/(|a|+|b|) - the paper's "longest
   matching subsequence" - rather than difflib's Ratcliff-Obershelp ratio, which is never
   larger and depends on difflib's junk heuristic.
3. Float noise follows the one rule of :mod:`mcgpo.grouping` (a deviation below 1e-9 of the
   group's largest |R| is exactly 0), so a group whose members all have the same return gives
   exactly 0 whatever the row order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import Indel

from mcgpo.advantages.groups import (
    MODES,
    codes,
    cross_steps_option,
    discounted_returns,
    episode_advantage,
    eps_option,
    gamma_option,
    penalty_option,
)
from mcgpo.grouping import normalise, representative_rows
from mcgpo.options import Options, option
from mcgpo.steps import StepTable

__all__ = [
    "SIMILARITY_DEFAULT",
    "GigpoOptions",
    "anchor_groups",
    "check_step_options",
    "gigpo",
    "similarity_clusters",
    "step_returns",
]

SIMILARITY_DEFAULT = 0.95  # reference code's ``similarity_thresh``


@dataclass(frozen=True)
class GigpoOptions(Options):
    """Options of :func:`gigpo` (docs/algorithms/gigpo.md)."""

    OWNER = "gigpo"
    LABEL = "{owner}: {name}"

    mode: str = option("mean_norm", "F_norm = 1 (the paper's main rows); mean_std_norm = w/ std")
    gamma: float = gamma_option()
    step_advantage_w: float = option(
        1.0, "weight of A^S in Eq. 8; the reference code's name and value"
    )
    episode_advantage_w: float = option(1.0, "weight of A^E in Eq. 8; 0 leaves the step term")
    cross_steps: bool = cross_steps_option()
    invalid_penalty: float = penalty_option()
    similarity: float | bool | None = option(
        None, "None: exact anchor groups; a threshold in (0, 1) merges similar anchors"
    )
    eps: float = eps_option()

    def __post_init__(self) -> None:
        check_step_options(self)
        self.number("step_advantage_w")
        self.number("episode_advantage_w")
        self.flag("cross_steps")
        self.number("eps", low=0.0, low_open=True)
        if self.similarity is not None and not isinstance(self.similarity, bool):
            want = "None (exact anchors) or a threshold in (0, 1)"
            self.number("similarity", low=0.0, high=1.0, low_open=True, high_open=True, want=want)

    @property
    def threshold(self) -> float | None:
        """The similarity threshold in use; None for exact anchor groups (True = 0.95)."""
        if self.similarity is None or self.similarity is False:
            return None
        return SIMILARITY_DEFAULT if self.similarity is True else float(self.similarity)


def check_step_options(opts: Options) -> None:
    """Check ``mode``, ``gamma`` and ``invalid_penalty``, the options of the step-level
    estimators (GiGPO, HGPO); one-line ValueError naming the option."""
    opts.choice("mode", MODES, want="one of " + ", ".join(MODES))
    opts.number("gamma", low=0.0, high=1.0, want="a number in [0, 1]")
    opts.number("invalid_penalty")


def gigpo(
    table: StepTable, options: GigpoOptions | None = None, **kwargs: Any
) -> tuple[np.ndarray, dict[str, float]]:
    """GiGPO advantage per row (Eq. 8) and step-group statistics.

    Options: :class:`GigpoOptions` (``similarity``: see :func:`similarity_clusters`).
    """
    o = options if options is not None else GigpoOptions.from_kwargs(kwargs)
    if len(table) == 0:
        return np.zeros(0), _step_group_stats(np.zeros(0, dtype=np.int64))
    a_episode = episode_advantage(
        table, mode=o.mode, cross_steps=o.cross_steps, invalid_penalty=o.invalid_penalty, eps=o.eps
    )  # Eq. 3
    returns = step_returns(table, o.gamma, o.invalid_penalty)  # Eq. 5
    step_group = anchor_groups(table, o.threshold)  # Eq. 6
    a_step = normalise(returns, step_group, mode=o.mode, eps=o.eps)  # Eq. 7, singletons 0
    adv = o.episode_advantage_w * a_episode + o.step_advantage_w * a_step  # Eq. 8
    stats = _step_group_stats(step_group)
    stats["episode_adv_abs_mean"] = float(np.abs(a_episode).mean())
    stats["step_adv_abs_mean"] = float(np.abs(a_step).mean())
    return adv, stats


# ---------------------------------------------------------------------- building blocks
def step_returns(table: StepTable, gamma: float, invalid_penalty: float) -> np.ndarray:
    """Discounted return of each row (Eq. 5) minus the invalid penalty of that row.

    The penalty is subtracted after discounting and is not itself discounted backward
    (verl-agent ``apply_invalid_action_penalty`` acts on the step rewards it is given).
    """
    return discounted_returns(table, gamma) - invalid_penalty * (~table.action_valid)


def anchor_groups(table: StepTable, similarity: float | None = None) -> np.ndarray:
    """Step-group code per row (Eq. 6): same task group and same (or similar) anchor.

    All trajectories and all turns of a task group take part, so a state revisited inside one
    trajectory adds one member per visit. Codes depend only on the values, never on row order.
    """
    g = codes(table.group)
    if similarity is None:
        return codes(g, table.anchor)
    pair = codes(g, table.anchor)  # one code per distinct (group, anchor)
    head = representative_rows(pair)
    anchors = table.anchor[head]
    order = np.lexsort((anchors.astype(str), g[head]))  # by group, then anchor string
    pair_group = g[head][order]
    cluster = np.empty(len(head), dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, pair_group[1:] != pair_group[:-1]])
    stops = np.r_[starts[1:], len(order)]
    offset = 0
    for start, stop in zip(starts, stops):
        labels = similarity_clusters(list(anchors[order[start:stop]]), similarity)
        cluster[order[start:stop]] = labels + offset
        offset += int(labels.max()) + 1
    return cluster[pair]


def similarity_clusters(anchors: list[str], threshold: float) -> np.ndarray:
    """Greedy clusters of distinct, sorted anchors: label per anchor, clusters numbered 0...

    Each anchor joins the earliest-created cluster whose representative (its first member)
    has similarity >= ``threshold``, else it opens a new cluster. Similarity is
    2 * LCS(a, b) / (|a| + |b|) (1 for two empty strings), the normalised Indel similarity.
    Each anchor is compared with the representatives only, so the cost grows with
    anchors x clusters.
    """
    labels = np.empty(len(anchors), dtype=np.int64)
    reps: list[str] = []
    rep_len = np.empty(len(anchors), dtype=np.int64)
    for i, anchor in enumerate(anchors):
        n = len(reps)
        if n:
            total = rep_len[:n] + len(anchor)
            # distances beyond the loosest pair's limit reject anyway: let rapidfuzz stop early
            cutoff = int((1.0 - threshold) * int(total.max())) + 1
            dist = process.cdist(
                [anchor], reps, scorer=Indel.distance, score_cutoff=cutoff, workers=1
            )[0].astype(np.int64)
            sim = np.where(total > 0, (total - dist) / np.maximum(total, 1), 1.0)
            hit = np.flatnonzero(sim >= threshold)
            if len(hit):
                labels[i] = hit[0]
                continue
        labels[i] = n
        reps.append(anchor)
        rep_len[n] = len(anchor)
    return labels


# ---------------------------------------------------------------------- stats
def _step_group_stats(step_group: np.ndarray) -> dict[str, float]:
    """How the step groups read: counts over groups, shares over groups and over rows."""
    sizes = np.bincount(step_group)
    if len(sizes) == 0:
        return {
            "step_groups": 0.0,
            "step_group_size_mean": 0.0,
            "step_singleton_share": 0.0,
            "step_singleton_rows": 0.0,
        }
    return {
        "step_groups": float(len(sizes)),  # number of anchor-state groups
        "step_group_size_mean": float(sizes.mean()),  # rows per step group
        "step_singleton_share": float(np.mean(sizes == 1)),  # share of step groups of size 1
        "step_singleton_rows": float(np.mean(sizes[step_group] == 1)),  # share of rows, A^S = 0
    }
