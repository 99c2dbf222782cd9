"""ProGPO (Fan & Liu): exact-prefix peers plus potential-based transition credit.

"Progress- and Reliability-Oriented Group Policy Optimization for Agentic RL",
arXiv 2607.04242. Only the abstract is public; its equations are not. This is a
reconstruction of what the abstract states, every choice an option (docs/algorithms/progpo.md):

1. Exact-prefix peers: rows of one group whose whole history s_0..s_t is identical compare
   their step returns y_t = R_t - penalty (R_t = sum_k gamma^(k-t) r_k, GiGPO Eq. 5):
       A^peer = (y - mean_P y) / (std_P y + eps)       over the peer group P, |P| >= 2
2. State potentials from rollout returns at history depths k = 0..K (context s_{t-k}..s_t),
   plus a "semantic" level that merges states by ``state_coarse`` or by text similarity:
       Phi_l(s) = mean R over the level-l visits,  v_l = (s_l^2 + floor) / n_l
       Phi(s)   = sum_l Phi_l / v_l  /  sum_l 1 / v_l            (inverse-variance fusion)
3. Transition credit (potential-based TD error), scaled by the group's std of delta:
       delta_t = (r_t - penalty) + gamma * Phi(s_{t+1}) - Phi(s_t),   Phi(after the end) = 0
   The success reward r_T carries the win, so this equals gamma * Phi(s') - Phi(s) with the
   success sink's potential r_succ / gamma; after a failed last row Phi = 0.
4. A = A^E + step_weight * A^step, A^step = A^peer where the row has peers, else the credit
   (``credit_all``: A^peer + credit everywhere). A^E is the GiGPO episode term (Eq. 3).

Departures from the abstract's wording are guesses where it says nothing; the docs list them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mcgpo.advantages.groups import (
    MODES,
    cross_steps_option,
    discounted_returns,
    episode_advantage,
    eps_option,
    gamma_option,
    penalty_option,
)
from mcgpo.grouping import codes, combine_codes, group_stats, normalise
from mcgpo.options import Options, option
from mcgpo.steps import StepTable

__all__ = ["ProgpoOptions", "ProgpoPotentials", "progpo", "progpo_potentials"]

PARTS = ("both", "peers", "potentials")
PREFIXES = ("states", "states_actions")
FUSIONS = ("inverse_variance", "deepest")
EXPANSIONS = ("none", "coarse", "similarity")


@dataclass(frozen=True)
class ProgpoOptions(Options):
    """Options of :func:`progpo` and :func:`progpo_potentials` (docs/algorithms/progpo.md)."""

    OWNER = "progpo"

    parts: str = option("both", "peers where a row has them, transition credit elsewhere")
    prefix: str = option("states", "peers share the states s_0..s_t (the abstract's prefix)")
    history: int = option(2, "K: potentials at depths 0..K, verl-agent's history length")
    fusion: str = option("inverse_variance", "fuse the depths by precision, not just the deepest")
    expansion: str = option("coarse", "semantic level from state_coarse: no text heuristics")
    similarity: float = option(0.9, "threshold of expansion='similarity', GiGPO's paper threshold")
    var_floor: float = option(0.01, "tau^2: a level whose visits agree still gets finite weight")
    gamma: float = gamma_option()
    step_weight: float = option(1.0, "weight of A^step next to A^E: both count alike")
    mode: str = option("mean_std_norm", "F_norm = std + eps, as GiGPO w/ std")
    invalid_penalty: float = penalty_option()
    cross_steps: bool = cross_steps_option()
    credit_all: bool = option(False, "credit only rows without peers (parts='both')")
    eps: float = eps_option()

    def __post_init__(self) -> None:
        for name, allowed in (
            ("parts", PARTS),
            ("prefix", PREFIXES),
            ("fusion", FUSIONS),
            ("expansion", EXPANSIONS),
            ("mode", MODES),
        ):
            self.choice(name, allowed)
        self.integer("history", low=0, high=16)
        self.number("gamma", low=0, high=1, low_open=True)
        self.number("similarity", low=0, high=1, low_open=True)
        self.number("step_weight", low=0)
        self.number("invalid_penalty", low=0)
        floor = "a finite number > 0 (it keeps inverse variances finite)"
        self.number("var_floor", low=0, low_open=True, want=floor)
        self.flag("cross_steps")
        self.flag("credit_all")
        self.number("eps", low=0, low_open=True)
        if self.credit_all and self.parts != "both":
            raise ValueError("progpo: option 'credit_all' needs parts='both'")


class ProgpoPotentials:
    """Fused state potentials per row, and what went into them. Arrays have shape ``[R]``."""

    __slots__ = ("levels", "phi", "phi_next", "weights")

    def __init__(self, phi: np.ndarray, phi_next: np.ndarray, weights: np.ndarray, levels: list):
        self.phi = phi  # [R] float64  Phi(s_t) of the row's state in its own context
        self.phi_next = phi_next  # [R] float64  Phi(s_{t+1}), 0 after the last row
        self.weights = weights  # [L, R] float64  fusion weight of each level (rows sum to 1)
        self.levels = levels  # [L] str  "depth0", "depth1", ..., "semantic"


def progpo_potentials(
    table: StepTable, options: ProgpoOptions | None = None, **kwargs: Any
) -> ProgpoPotentials:
    """Phi per row: depth-k context means of the step return, fused across depths (item 2).

    Reads ``gamma``, ``history``, ``fusion``, ``expansion``, ``similarity``, ``var_floor``.
    """
    o = options if options is not None else ProgpoOptions.from_kwargs(kwargs)
    returns = discounted_returns(table, o.gamma)  # penalty-free: the penalty is not a reward
    return _fused_potentials(table, _Layout(table), returns, o)


def _fused_potentials(
    table: StepTable, layout: _Layout, returns: np.ndarray, o: ProgpoOptions
) -> ProgpoPotentials:
    history, fusion, expansion = o.history, o.fusion, o.expansion
    g, anchor = layout.group, layout.anchor
    keys, levels = [anchor], ["depth0"]
    for k in range(1, history + 1):  # context s_{t-k} .. s_t, only where t >= k
        lag = layout.lagged(k)
        key = np.full(len(table), -1, dtype=np.int64)
        has = lag >= 0
        key[has] = combine_codes(keys[-1][has], anchor[lag[has]])
        keys.append(key)
        levels.append(f"depth{k}")
    if expansion != "none":
        keys.append(_semantic_classes(table, layout, expansion, o.similarity))
        levels.append("semantic")

    _, group_std, group_n = group_stats(returns, g)
    prior_var = np.where(group_n > 1, group_std**2, 0.0)  # a lone visit: the group's spread
    means, variances, counts = [], [], []
    for key in keys:
        has = key >= 0
        mean, std, n = np.zeros(len(table)), np.zeros(len(table)), np.zeros(len(table))
        if has.any():
            m, s, c = group_stats(returns[has], codes(key[has]))
            mean[has], std[has], n[has] = m, s, c
        var = np.where(n > 1, std**2, prior_var) + o.var_floor
        means.append(mean)
        variances.append(np.where(has, var / np.maximum(n, 1), np.inf))
        counts.append(n)
    if expansion != "none":  # the semantic level counts only where it adds visits
        variances[-1] = np.where(counts[-1] > counts[0], variances[-1], np.inf)
    mean_l, var_l, n_l = np.stack(means), np.stack(variances), np.stack(counts)

    if fusion == "inverse_variance":
        weights = 1.0 / var_l  # 0 where a level is absent (v = inf)
    else:  # deepest level with two or more visits; semantic next; else the lone visit
        order = [*range(history, -1, -1), *([history + 1] if expansion != "none" else [])]
        weights = np.zeros_like(var_l)
        chosen = np.zeros(len(table), dtype=bool)
        for level in order:
            pick = ~chosen & np.isfinite(var_l[level]) & (n_l[level] >= 2)
            weights[level, pick], chosen = 1.0, chosen | pick
        weights[0, ~chosen] = 1.0
    weights = weights / weights.sum(axis=0, keepdims=True)
    phi = (weights * mean_l).sum(axis=0)
    nxt = layout.following()
    phi_next = np.where(nxt >= 0, phi[np.maximum(nxt, 0)], 0.0)
    return ProgpoPotentials(phi, phi_next, weights, levels)


def progpo(
    table: StepTable, options: ProgpoOptions | None = None, **kwargs: Any
) -> tuple[np.ndarray, dict[str, float]]:
    """ProGPO advantage A = A^E + step_weight * A^step (module docstring, items 1-4)."""
    o = options if options is not None else ProgpoOptions.from_kwargs(kwargs)
    parts, mode, eps, gamma = o.parts, o.mode, o.eps, o.gamma
    n = len(table)
    if n == 0:
        return np.zeros(0), {"groups": 0.0}
    invalid = o.invalid_penalty * (~table.action_valid)
    layout = _Layout(table)
    g = layout.group
    # 1. exact-prefix peers: prefix ids built turn by turn, P_t = (P_{t-1}, [a_{t-1}], s_t)
    peers = _prefix_codes(table, layout, with_actions=o.prefix == "states_actions")
    peer_n = np.bincount(peers)[peers]
    returns = discounted_returns(table, gamma)
    y = returns - invalid
    a_peer = normalise(y, peers, mode=mode, singleton="zero", eps=eps)
    # 2-3. transition credit from fused potentials, scaled by the group's std of delta
    use_credit = parts != "peers"
    credit = np.zeros(n)
    if use_credit:
        pot = _fused_potentials(table, layout, returns, o)
        delta = table.reward - invalid + gamma * pot.phi_next - pot.phi
        credit = delta
        if mode == "mean_std_norm":
            _, std, count = group_stats(delta, g)
            credit = delta / np.where(count > 1, std + eps, 1.0)
    # 4. combine
    has_peers = peer_n >= 2
    if parts == "peers":
        a_step = a_peer
    elif parts == "potentials":
        a_step = credit
    else:
        a_step = a_peer + credit if o.credit_all else np.where(has_peers, a_peer, credit)
    a_episode = episode_advantage(
        table, mode=mode, cross_steps=o.cross_steps, invalid_penalty=o.invalid_penalty, eps=eps
    )
    stats = {
        "groups": float(g.max() + 1),
        "peer_row_share": float(has_peers.mean()),
        "peer_group_size_mean": float(peer_n[has_peers].mean()) if has_peers.any() else 0.0,
    }
    credited = np.zeros(n, dtype=bool) if parts == "peers" else ~has_peers
    if parts == "potentials" or o.credit_all:
        credited[:] = True
    stats["credited_row_share"] = float(credited.mean())
    if use_credit:
        stats["potential_mean"] = float(pot.phi.mean())
        stats["credit_abs_mean"] = float(np.abs(credit).mean())
        for name, w in zip(pot.levels, pot.weights):
            stats[f"fusion_weight_{name}"] = float(w.mean())
    return a_episode + o.step_weight * a_step, stats


class _Layout:
    """Rows laid out as a [trajectory, turn] matrix of row indices (-1 where absent), plus
    the group and (group, anchor) codes every part needs."""

    def __init__(self, table: StepTable) -> None:
        self.group, self.anchor = codes(table.group), codes(table.group, table.anchor)
        self.traj, self.turn = codes(table.traj), table.turn
        self.matrix = np.full((int(self.traj.max()) + 1, int(self.turn.max()) + 2), -1)
        self.matrix[self.traj, self.turn] = np.arange(len(table))

    def lagged(self, k: int) -> np.ndarray:
        """Row index of turn t - k of the same trajectory, -1 where t < k."""
        return np.where(self.turn >= k, self.matrix[self.traj, np.maximum(self.turn - k, 0)], -1)

    def following(self) -> np.ndarray:
        """Row index of turn t + 1 of the same trajectory, -1 after the last row."""
        return self.matrix[self.traj, self.turn + 1]


def _prefix_codes(table: StepTable, layout: _Layout, *, with_actions: bool) -> np.ndarray:
    """Id of the whole prefix s_0 (a_0) s_1 ... s_t per row; equal ids <=> equal prefixes."""
    anchor = layout.anchor
    action = codes(table.action) if with_actions else None
    out = np.zeros(len(table), dtype=np.int64)
    first = table.turn == 0
    out[first] = anchor[first]
    offset = int(anchor.max()) + 1
    for t in range(1, int(table.turn.max()) + 1):
        rows = np.flatnonzero(table.turn == t)
        prev = layout.matrix[layout.traj[rows], t - 1]
        head = out[prev]
        if action is not None:
            head = combine_codes(head, action[prev])
        new = combine_codes(head, anchor[rows])
        out[rows] = new + offset
        offset += int(new.max()) + 1
    return out


def _semantic_classes(
    table: StepTable, layout: _Layout, expansion: str, similarity: float
) -> np.ndarray:
    """Expanded state class per row: ``state_coarse`` (own anchor when empty) or text clusters."""
    g = layout.group
    if expansion == "coarse":
        coarse = codes(table.state_coarse)
        own = layout.anchor + int(coarse.max()) + 1  # an empty summary: the anchor's own class
        return combine_codes(g, np.where(table.state_coarse == "", own, coarse))
    from rapidfuzz import fuzz

    cluster = {}  # (group, anchor) -> representative; greedy in sorted order: order-free
    for group in np.unique(g):
        reps: list[str] = []
        for text in sorted(set(table.anchor[g == group])):
            rep = next((r for r in reps if fuzz.ratio(text, r) >= 100 * similarity), None)
            if rep is None:
                reps.append(text)
            cluster[group, text] = rep if rep is not None else text
    reps_col = np.array([cluster[k] for k in zip(g.tolist(), table.anchor)], dtype=object)
    return codes(g, reps_col)
