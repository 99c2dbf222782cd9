"""Inverse-variance blending of the rule levels (``blend="inverse_variance"``; ours).

docs/algorithms/mcgpo.md detail 12b. By default the first rule level with support labels a
pair ("first rule wins"). Blended, every level at which the pair is a supported candidate
gives each of its two actions an estimate u_l = k_l / n_l (k_l successes among n_l evidence
trajectories), and the action's value is their precision-weighted mean

    u = sum_l w_l u_l / sum_l w_l,    w_l = 1 / v_l,
    v_l = p_l (1 - p_l) / (n_l + 3),  p_l = (k_l + 1) / (n_l + 2),

v_l being the variance of the Beta(k_l + 1, n_l - k_l + 1) posterior of a success rate
under a uniform prior: finite for n_l = 1 and for u_l in {0, 1}, where the plug-in
u_l (1 - u_l) / n_l would be 0 and give one level infinite weight. This is the fusion of
ProGPO (Fan & Liu, arXiv 2607.04242: inverse-variance fusion across history depths) applied
to HGPO's nested contexts (arXiv 2602.22817), here the exact and the coarse key. The levels'
evidence sets overlap (a coarse context contains the exact one), so the weights rank the
levels by precision rather than give the variance of u. With one supported level u = u_l
exactly. The pair keeps the first supported level as its level (and q_level); the support
of an action is max_l n_l, the largest of its evidence sets (distinct trajectories: at
least that many).
"""

from __future__ import annotations

import numpy as np

__all__ = ["blend_levels", "inverse_variance_weight"]


def inverse_variance_weight(value: np.ndarray, n: np.ndarray) -> np.ndarray:
    """1 / v for estimates ``value`` = k / n of ``n`` outcomes (n >= 1): see the module."""
    value, n = np.asarray(value, float), np.asarray(n, float)
    p = (value * n + 1) / (n + 2)
    return (n + 3) / (p * (1 - p))


def blend_levels(
    pair: np.ndarray,  # [C] int64  row-pair code of each candidate (levels of one pair share it)
    level: np.ndarray,  # [C] int64  rule level of the candidate (0 = exact, tried first)
    supported: np.ndarray,  # [C] bool  both actions have min_support evidence at this level
    value: np.ndarray,  # [C] float64  u_l of one of the pair's two actions
    n: np.ndarray,  # [C] int64  n_l: its evidence trajectories
) -> tuple[np.ndarray, np.ndarray]:
    """(value, n) of every candidate with its pair's supported levels blended into it;
    unsupported candidates keep theirs. Written around the first supported level's value
    u_0, u = u_0 + sum_l w_l (u_l - u_0) / sum_l w_l, so one level, or levels that agree,
    give u_0 exactly."""
    value, n = value.astype(np.float64), n.astype(np.int64)
    if len(pair) == 0:
        return value, n
    codes, pair_code = np.unique(pair, return_inverse=True)
    sup = np.flatnonzero(supported)
    order = sup[np.lexsort((level[sup], pair_code[sup]))]
    head = np.ones(len(order), dtype=bool)
    head[1:] = pair_code[order][1:] != pair_code[order][:-1]
    base = np.zeros(len(codes))
    base[pair_code[order[head]]] = value[order[head]]
    w = inverse_variance_weight(value[sup], n[sup])
    at = pair_code[sup]
    total = np.bincount(at, weights=w, minlength=len(codes))
    shift = np.bincount(at, weights=w * (value[sup] - base[at]), minlength=len(codes))
    most = np.zeros(len(codes), dtype=np.int64)
    np.maximum.at(most, at, n[sup])
    out_value, out_n = value.copy(), n.copy()
    out_value[sup] = base[at] + shift[at] / total[at]
    out_n[sup] = most[at]
    return out_value, out_n
