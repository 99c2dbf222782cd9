"""HGPO: hierarchy-of-groups step advantages over k-step histories.

"Hierarchy-of-Groups Policy Optimization", arXiv 2602.22817 (ICLR 2026); reference code:
verl-agent ``recipe/hgpo/core_hgpo.py``. With R_t the discounted step return minus the row's
invalid-action penalty (as in GiGPO Eq. 5):

    C_k(s_t)    = (s_{t-k}, ..., s_t),   k = 0..K, defined when t >= k    (k-context)
    G_k^H(s_t)  = {(j, n) in the task group : C_k(s_n^(j)) = C_k(s_t)}     (G_0 ⊇ G_1 ⊇ ...)
    A_k^H(s_t)  = (R_t - mean_{G_k} R) / (popstd_{G_k} R + eps)  or  R_t - mean_{G_k} R
    A^H(s_t)    = sum_{k kept} w_k A_k^H,  w_k = (k+1)^alpha / sum_{l kept} (l+1)^alpha

A level is *kept* for a row when its group has >= 2 members and A_k^H != 0 (singleton and
zero-advantage groups are skipped); a row with nothing kept gets 0. The std is the population
std (``unbiased=False``), as in the reference code.

Where this departs from the paper / reference code, and why (docs/algorithms/hgpo.md):

1. ``weights="paper"`` (default) uses w_k ∝ (k+1)^alpha with k = 0 for the 0-context group.
   The reference code counts states including the current one, so its 0-context group gets
   2^alpha, the 1-context 3^alpha, ...: ``weights="code"``.
2. ``base_group=True`` adds the trajectory-level advantage as one more item of weight 1 (the
   code's optional base group; the paper has none). Its statistics follow ``cross_steps``
   (default False = once per trajectory; True = the code's statistics over step rows).
3. The code divides by sum(w) + eps; here the weights are normalised exactly (the eps only
   guarded an empty sum, handled explicitly).
4. "Zero advantage" is decided after the float-noise rule of :mod:`mcgpo.grouping`
   (deviations below 1e-9 of the group's largest |R| are exactly 0), so constant groups are
   always skipped, whatever the row order; in float32 the code would skip them only when
   rounding happens to give 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mcgpo.advantages.gigpo import check_step_options, step_returns
from mcgpo.advantages.groups import (
    codes,
    cross_steps_option,
    episode_advantage,
    eps_option,
    gamma_option,
    penalty_option,
)
from mcgpo.grouping import normalise
from mcgpo.options import Options, option
from mcgpo.steps import StepTable

__all__ = ["WEIGHTS", "HgpoOptions", "context_groups", "hgpo", "level_weights"]

WEIGHTS = ("paper", "code")


@dataclass(frozen=True)
class HgpoOptions(Options):
    """Options of :func:`hgpo` (docs/algorithms/hgpo.md)."""

    OWNER = "hgpo"
    LABEL = "{owner}: {name}"

    history: int = option(2, "K: deepest k-context level, the recipe's ALFWorld setting")
    alpha: float = option(1.0, "w_k ~ (k+1)^alpha: deeper, more specific contexts weigh more")
    weights: str = option("paper", "w_k as the paper writes it; code = (k+2)^alpha")
    mode: str = option(
        "mean_std_norm", "(R - mean) / (popstd + eps): the recipe's ALFWorld scripts"
    )
    gamma: float = gamma_option()
    invalid_penalty: float = penalty_option()
    base_group: bool = option(False, "no trajectory-level item, as in the paper")
    cross_steps: bool = cross_steps_option()
    eps: float = eps_option()

    def __post_init__(self) -> None:
        check_step_options(self)
        self.integer("history", low=0)
        self.number("alpha")
        self.choice("weights", WEIGHTS, want="one of " + ", ".join(WEIGHTS))
        self.flag("base_group")
        self.flag("cross_steps")
        self.number("eps", low=0, low_open=True)


def hgpo(
    table: StepTable, options: HgpoOptions | None = None, **kwargs: Any
) -> tuple[np.ndarray, dict[str, float]]:
    """HGPO advantage per row and per-level statistics (K = ``history``)."""
    o = options if options is not None else HgpoOptions.from_kwargs(kwargs)
    history = o.history
    n = len(table)
    levels = int(history) + 1
    item_adv = np.zeros((levels + 1, n))  # row k <= K: A_k^H; last row: base term
    item_w = np.zeros(levels + 1)
    item_w[:levels] = level_weights(history, o.alpha, o.weights)
    item_w[levels] = 1.0  # base group: weight 1 (code: k = 0, (0 + 1)^alpha)
    stats: dict[str, float] = {}
    if n:
        returns = step_returns(table, o.gamma, o.invalid_penalty)
        for k, (has, code) in enumerate(context_groups(table, history)):
            item_adv[k, has] = normalise(returns[has], code, mode=o.mode, unbiased=False, eps=o.eps)
            sizes = np.bincount(code)
            stats[f"k{k}_groups"] = float(len(sizes))
            stats[f"k{k}_group_size_mean"] = float(sizes.mean()) if len(sizes) else 0.0
            stats[f"k{k}_kept_share"] = float(np.mean(item_adv[k] != 0))
        if o.base_group:
            item_adv[levels] = episode_advantage(
                table,
                mode=o.mode,
                cross_steps=o.cross_steps,
                invalid_penalty=o.invalid_penalty,
                eps=o.eps,
            )
            stats["base_kept_share"] = float(np.mean(item_adv[levels] != 0))
    kept = item_adv != 0  # singleton groups gave 0, as did zero-advantage members
    w = np.where(kept, item_w[:, None], 0.0)
    total = w.sum(axis=0)
    adv = np.where(total > 0, (w * item_adv).sum(axis=0) / np.where(total > 0, total, 1.0), 0.0)
    stats["no_item_share"] = float(np.mean(total == 0)) if n else 0.0
    return adv, stats


def level_weights(history: int, alpha: float, weights: str) -> np.ndarray:
    """Unnormalised weight of each level k = 0..K: (k+1)^alpha ("paper") or (k+2)^alpha ("code")."""
    k = np.arange(int(history) + 1, dtype=np.float64)
    shift = 1.0 if weights == "paper" else 2.0
    return (k + shift) ** float(alpha)


def context_groups(table: StepTable, history: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each k = 0..K: (rows that have a k-context [R] bool, their group codes).

    The k-context key of row t is (task group, s_{t-k}, ..., s_t) over the anchors of its own
    trajectory; it is built level by level as (key_{k-1}, s_{t-k}), so G_k nests in G_{k-1}.
    Codes are compact (0..G_k-1) and depend only on values.
    """
    anchor = codes(table.anchor)
    traj = codes(table.traj)
    by_turn = np.full((int(traj.max()) + 1, int(table.turn.max()) + 1), -1, dtype=np.int64)
    by_turn[traj, table.turn] = anchor  # anchor code of trajectory i at turn t
    key = codes(table.group, anchor)  # k = 0: GiGPO's anchor groups
    has = np.ones(len(table), dtype=bool)
    out = [(has, key)]
    for k in range(1, int(history) + 1):
        deeper = table.turn >= k
        earlier = by_turn[traj[deeper], table.turn[deeper] - k]  # s_{t-k}
        full_key = np.full(len(table), -1, dtype=np.int64)
        full_key[has] = key
        key = codes(full_key[deeper], earlier)
        has = deeper
        out.append((has, key))
    return out
