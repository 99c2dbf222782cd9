"""GraphGPO: graph-based step credit from shortest distances to success (arXiv 2605.26684).

Per task group the rollouts are merged into one directed multigraph: nodes are anchor states
(identical strings merged), every row adds one edge ``anchor -> next_anchor``, and the last
row of a successful trajectory points to a per-group success sink instead. With unit edge
costs, ``d(s)`` is the shortest number of steps from ``s`` to the sink (reverse breadth-first
search). Then, for a row ``s --a--> s'``:

    R^G = r_succ * omega^(d(s') + c)        paper Eq. 4 with c = 1 ("paper")
    R^G = r_succ * omega^d(s')              reference code (c = 0, "code", default)
    R^G = r_succ * omega^(d(s') - d(s) + 1) the code's normalize_distance variant (option)
    R^G -= invalid_penalty  on rows whose action was invalid
    R^G += progress_coef * (P(s') - P(s))   rubric progress increment (option, default 0)
    A^G = (R^G - mean) / (std + eps)        over rows leaving the same anchor (GiGPO Eq. 7)
    A   = beta_G * A^G + beta_E * A^E       A^E: the GiGPO episode term (Eq. 3)

Where this departs from the paper, and why (details in docs/algorithms/graphgpo.md):

* Default convention "code": 10 * omega^d(s') is what the published recipe trains with; it
  differs from Eq. 4 by the constant factor omega, which cancels under ``mean_std_norm``
  (up to eps) but not under ``mean_norm``.
* Unreachable states get ``d = max finite d in the group + 1`` (paper and code agree).
* Groups without a success: as in the reference code every node gets ``d = 1``, so all graph
  returns are equal except for the invalid penalty and A^G ranks valid against invalid
  actions at a shared state. It is *not* zero; ``zero_all_fail=True`` zeroes it (the Relax
  reproduction's choice).
* No string is special: the sink is a separate node, so an observation that happens to read
  "success" is an ordinary state.
* The episode term takes statistics once per trajectory by default (``cross_steps=False``);
  the reference code counts every step row (``cross_steps=True``).
* ``progress_coef`` is ours, for the GraphGPO + shaping control (:mod:`mcgpo.shaping`): the
  rubric progress increment P = ``progress_value`` enters the step credit A^G, not only the
  episode return.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mcgpo.advantages.groups import (
    MODES,
    codes,
    cross_steps_option,
    episode_advantage,
    eps_option,
    normalise,
    penalty_option,
)
from mcgpo.options import Options, option
from mcgpo.steps import StepTable

__all__ = [
    "CONVENTIONS",
    "GraphDistances",
    "GraphgpoOptions",
    "graph_distances",
    "graph_returns",
    "graphgpo",
]

CONVENTIONS = ("code", "paper")


@dataclass(frozen=True)
class GraphgpoOptions(Options):
    """Options of :func:`graphgpo` and :func:`graph_returns` (docs/algorithms/graphgpo.md)."""

    OWNER = "graphgpo"

    omega: float = option(0.10, "distance discount; the ALFWorld script's (0.20 for WebShop)")
    convention: str = option("code", "R^G = r_succ omega^d(s') as the published code trains")
    mode: str = option("mean_std_norm", "F_norm = std + eps, as in the published recipe")
    step_advantage_w: float = option(1.0, "beta_G, the weight of A^G")
    episode_advantage_w: float = option(1.0, "beta_E, the weight of A^E; 0 drops it")
    invalid_penalty: float = penalty_option()
    cross_steps: bool = cross_steps_option()
    success_reward: float = option(10.0, "r_succ: the environments' success reward")
    zero_all_fail: bool = option(False, "keep A^G in all-fail groups, as the reference code does")
    eps: float = eps_option()
    normalize_distance: bool = option(
        False, "off as in every published script; on: R^G = r_succ omega^(d(s') - d(s) + 1)"
    )
    progress_coef: float = option(
        0.0, "R^G += coef (P(s') - P(s)) before A^G; 0: none (graphgpo_shaping sets it)"
    )

    def __post_init__(self) -> None:
        self.number("omega", low=0, high=1, low_open=True, high_open=True)
        self.choice("convention", CONVENTIONS, want="'code' or 'paper'")
        self.choice("mode", MODES)
        self.number("step_advantage_w")
        self.number("episode_advantage_w")
        self.number("success_reward", low=0, low_open=True)
        self.number("invalid_penalty", low=0)
        self.flag("cross_steps")
        self.flag("zero_all_fail")
        self.number("eps", low=0, low_open=True)
        self.flag("normalize_distance")
        self.number("progress_coef", low=0)


class GraphDistances:
    """Shortest distances to the success sink, per row. All arrays have shape ``[R]``."""

    __slots__ = ("d_next", "d_source", "group_has_success", "node_next", "node_source", "stats")

    def __init__(
        self,
        d_source: np.ndarray,  # [R] float64  d(s) of the row's anchor
        d_next: np.ndarray,  # [R] float64  d(s') of the state the row leads to (0 at the sink)
        node_source: np.ndarray,  # [R] int64  node id of the anchor
        node_next: np.ndarray,  # [R] int64  node id of the next state (sinks included)
        group_has_success: np.ndarray,  # [R] bool  the row's group holds a success
        stats: dict[str, float],
    ) -> None:
        self.d_source, self.d_next = d_source, d_next
        self.node_source, self.node_next = node_source, node_next
        self.group_has_success, self.stats = group_has_success, stats


def graph_distances(table: StepTable) -> GraphDistances:
    """Build each group's state graph and run one reverse BFS from all success sinks."""
    n = len(table)
    g = codes(table.group) if n else np.zeros(0, dtype=np.int64)
    n_groups = int(g.max(initial=-1)) + 1
    t = codes(table.traj) if n else np.zeros(0, dtype=np.int64)
    last_turn = np.zeros(int(t.max(initial=-1)) + 1, dtype=np.int64)
    np.maximum.at(last_turn, t, table.turn)
    to_sink = (table.turn == last_turn[t]) & (table.success == 1)
    # node ids over (group, text): anchors plus the next states that are not the sink
    texts = np.concatenate([table.anchor, table.next_anchor[~to_sink]])
    text_group = np.concatenate([g, g[~to_sink]])
    node = codes(text_group, texts) if n else np.zeros(0, dtype=np.int64)
    n_nodes = int(node.max(initial=-1)) + 1
    src = node[:n]
    dst = np.empty(n, dtype=np.int64)
    dst[~to_sink] = node[n:]
    dst[to_sink] = n_nodes + g[to_sink]  # sink of group g has id n_nodes + g
    node_group = np.empty(n_nodes + n_groups, dtype=np.int64)
    node_group[node] = text_group
    node_group[n_nodes:] = np.arange(n_groups)

    # reverse breadth-first search, one frontier per distance, all groups at once
    dist = np.full(n_nodes + n_groups, np.inf)
    sinks = np.unique(dst[to_sink])
    dist[sinks] = 0.0
    frontier = np.zeros(len(dist), dtype=bool)
    frontier[sinks] = True
    level = 0
    while frontier.any():
        level += 1
        hit = frontier[dst] & np.isinf(dist[src])
        new = np.unique(src[hit])
        dist[new] = level
        frontier[:] = False
        frontier[new] = True
    reachable = np.isfinite(dist)
    # unreachable: max finite distance of the group + 1; a group without success -> all 1
    far = np.zeros(n_groups)
    np.maximum.at(far, node_group[reachable], dist[reachable])
    dist = np.where(reachable, dist, far[node_group] + 1.0)

    has_success = np.zeros(n_groups, dtype=bool)
    has_success[g[to_sink]] = True
    edge_src = np.unique(src * (n_nodes + n_groups) + dst) // (n_nodes + n_groups)
    out_degree = np.bincount(edge_src, minlength=n_nodes)  # distinct successors per node
    n_edges = int(out_degree.sum())
    stats = {
        "groups": float(n_groups),
        "groups_without_success": float(n_groups - has_success.sum()),
        "nodes": float(n_nodes),
        "edges": float(n_edges),
        "nodes_per_group": n_nodes / n_groups if n_groups else 0.0,
        "edges_per_group": n_edges / n_groups if n_groups else 0.0,
        "branching_row_share": float(np.mean(out_degree[src] > 1)) if n else 0.0,
        "reachable_node_share": float(np.mean(reachable[:n_nodes])) if n_nodes else 0.0,
        "max_distance": float(level - 1) if len(sinks) else 0.0,
    }
    return GraphDistances(dist[src], dist[dst], src, dst, has_success[g], stats)


def graph_returns(
    table: StepTable,
    options: GraphgpoOptions | None = None,
    *,
    distances: GraphDistances | None = None,
    **kwargs: Any,
) -> np.ndarray:
    """Per-row graph return R^G (paper Eq. 4 / the code's variants) minus the invalid
    penalty, plus the rubric progress increment when ``progress_coef`` > 0.

    Reads ``omega``, ``convention``, ``normalize_distance``, ``success_reward``,
    ``invalid_penalty`` and ``progress_coef``. With ``normalize_distance`` the exponent is
    the reference code's ``d(s') - d(s) + 1`` whatever the convention (it already holds
    Eq. 4's c(s, a) = 1): 0 on an edge of a shortest path, the steps lost otherwise.
    """
    o = options if options is not None else GraphgpoOptions.from_kwargs(kwargs)
    dist = graph_distances(table) if distances is None else distances
    if o.normalize_distance:
        exponent = dist.d_next - dist.d_source + 1.0
    else:
        exponent = dist.d_next + (1.0 if o.convention == "paper" else 0.0)  # c(s, a) = 1
    r_graph = o.success_reward * o.omega**exponent - o.invalid_penalty * (~table.action_valid)
    if o.progress_coef:
        r_graph = r_graph + o.progress_coef * (table.next_progress_value - table.progress_value)
    return r_graph


def graphgpo(
    table: StepTable, options: GraphgpoOptions | None = None, **kwargs: Any
) -> tuple[np.ndarray, dict[str, float]]:
    """GraphGPO advantage A = beta_G * A^G + beta_E * A^E, one value per row.

    Options: :class:`GraphgpoOptions` (``omega`` 0.10 ALFWorld, 0.20 WebShop in the
    published scripts; ``convention`` "code" = 10 * omega^d(s'), "paper" = Eq. 4;
    ``normalize_distance`` = the code's 10 * omega^(d(s') - d(s) + 1); ``progress_coef``
    adds the rubric progress increment to R^G before the step normalisation).
    """
    o = options if options is not None else GraphgpoOptions.from_kwargs(kwargs)
    if len(table) == 0:
        return np.zeros(0), {"groups": 0.0}
    dist = graph_distances(table)
    r_graph = graph_returns(table, o, distances=dist)
    # A^G: rows leaving the same anchor of the same group (GiGPO Eq. 6-7); singleton -> 0.
    # The source node id is exactly the code of (group, anchor).
    source_group = dist.node_source
    a_graph = normalise(r_graph, source_group, mode=o.mode, singleton="zero", eps=o.eps)
    if o.zero_all_fail:
        a_graph = np.where(dist.group_has_success, a_graph, 0.0)
    a_episode = episode_advantage(
        table, mode=o.mode, cross_steps=o.cross_steps, invalid_penalty=o.invalid_penalty, eps=o.eps
    )
    adv = o.step_advantage_w * a_graph + o.episode_advantage_w * a_episode
    stats = dict(dist.stats)
    stats["graph_return_mean"] = float(r_graph.mean())
    stats["graph_adv_nonzero_share"] = float(np.mean(np.abs(a_graph) > 1e-8))
    stats["source_singleton_share"] = float(np.mean(np.bincount(source_group)[source_group] == 1))
    return adv, stats
