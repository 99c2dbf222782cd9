"""GraphGPO: hand-derived golden values, a plain-loop twin, properties and bad input."""

from __future__ import annotations

import math
import re
from collections import defaultdict, deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from walk_tables import walk_tables

from mcgpo import estimate
from mcgpo.advantages.graphgpo import graph_distances, graph_returns, graphgpo
from mcgpo.steps import StepTable

EPS = 1e-6


def walk(group, traj, slot, anchors, last_next, won, invalid=()):
    """Rows s_0 -> s_1 -> ... -> s_T -> last_next of one trajectory (10 reward on a win)."""
    nexts = [*anchors[1:], last_next]
    return [
        {
            "group": group,
            "traj": traj,
            "slot": slot,
            "turn": t,
            "reward": 10.0 if (won and t == len(anchors) - 1) else 0.0,
            "done": t == len(anchors) - 1,
            "success": float(won),
            "score": float(won),
            "action": f"go {nexts[t]}",
            "action_valid": t not in invalid,
            "anchor": a,
            "next_anchor": nexts[t],
        }
        for t, a in enumerate(anchors)
    ]


def two_paths(invalid_b=()):
    # A wins: S -> X -> Y -> sink (its last next_anchor text is arbitrary and must be ignored)
    # B fails: S -> Q -> X -> "success" (a plain text; only the success flag makes a sink)
    rows = walk(0, 0, 0, ["S", "X", "Y"], "the task is done", True)
    rows += walk(0, 1, 1, ["S", "Q", "X"], "success", False, invalid_b)
    return StepTable.from_records(rows)


def test_distances_run_through_another_trajectory():
    # reverse BFS from the sink: d(Y)=1, d(X)=2, d(S)=3 (S->X), d(Q)=3 (Q->X->Y->sink runs
    # through A's states X and Y), "success" text: unreachable -> max finite 3 + 1 = 4
    d = graph_distances(two_paths())
    np.testing.assert_array_equal(d.d_source, [3, 2, 1, 3, 3, 2])
    np.testing.assert_array_equal(d.d_next, [2, 1, 0, 3, 2, 4])
    assert d.stats["nodes"] == 5  # S X Y Q "success"; the sink is not counted
    assert d.stats["reachable_node_share"] == pytest.approx(4 / 5)
    assert d.stats["groups_without_success"] == 0
    # sources with more than one distinct successor: S (X, Q) and X (Y, "success"): 4 rows
    assert d.stats["branching_row_share"] == pytest.approx(4 / 6)


def test_golden_code_convention_mean_norm():
    # code convention R^G = 10 * w^d(s'), w = 0.5; rows A0..A2, B0..B2 (d_next from above):
    #   A0 10*.5^2 = 2.5   A1 10*.5 = 5   A2 10*1 = 10
    #   B0 10*.5^3 = 1.25  B1 10*.5^2 = 2.5   B2 10*.5^4 = 0.625
    np.testing.assert_allclose(
        graph_returns(two_paths(), omega=0.5), [2.5, 5, 10, 1.25, 2.5, 0.625]
    )
    # A^G groups by source: S {A0 2.5, B0 1.25} mean 1.875 -> +0.625 / -0.625
    #   X {A1 5, B2 0.625} mean 2.8125 -> +2.1875 / -2.1875;  Y {A2}, Q {B1}: singletons -> 0
    # A^E (trajectory-once, mean_norm): returns 10 / 0, mean 5 -> A rows +5, B rows -5
    adv, _ = graphgpo(two_paths(), omega=0.5, mode="mean_norm")
    np.testing.assert_allclose(adv, [5.625, 7.1875, 5, -5.625, -5, -7.1875])
    # beta_G = 2, beta_E = 0: twice A^G alone
    adv, _ = graphgpo(
        two_paths(), omega=0.5, mode="mean_norm", step_advantage_w=2.0, episode_advantage_w=0.0
    )
    np.testing.assert_allclose(adv, [1.25, 4.375, 0, -1.25, 0, -4.375])


def test_golden_paper_convention():
    # paper Eq. 4: R^G = 10 * w^(d(s') + 1) = w * (code value): every A^G halves under
    # mean_norm (S +-0.3125, X +-1.09375) ...
    kw = {"omega": 0.5, "mode": "mean_norm", "episode_advantage_w": 0.0}
    adv, _ = graphgpo(two_paths(), convention="paper", **kw)
    np.testing.assert_allclose(adv, [0.3125, 1.09375, 0, -0.3125, 0, -1.09375])
    # ... and under mean_std_norm a two-member group gives +-(d/2)/(|d|/sqrt 2 + eps) for
    # both conventions: +-1/sqrt(2) up to eps
    kw["mode"] = "mean_std_norm"
    code, _ = graphgpo(two_paths(), convention="code", **kw)
    paper, _ = graphgpo(two_paths(), convention="paper", **kw)
    h = 1 / math.sqrt(2)
    np.testing.assert_allclose(code, [h, h, 0, -h, 0, -h], atol=1e-5)
    np.testing.assert_allclose(paper, code, atol=1e-5)


def test_golden_normalize_distance():
    # the reference code's variant R^G = 10 * w^(d(s') - d(s) + 1), w = 0.5; with
    # d_source [3, 2, 1, 3, 3, 2] and d_next [2, 1, 0, 3, 2, 4] (test above) the exponents are
    #   A0 2-3+1 = 0   A1 1-2+1 = 0   A2 0-1+1 = 0    (A walks a shortest path: full 10 each)
    #   B0 3-3+1 = 1   B1 2-3+1 = 0   B2 4-2+1 = 3    (B0 loses a step, B2 leaves the graph)
    # R^G = [10, 10, 10, 5, 10, 1.25]
    r = graph_returns(two_paths(), omega=0.5, normalize_distance=True)
    np.testing.assert_allclose(r, [10, 10, 10, 5, 10, 1.25])
    # A^G: S {A0 10, B0 5} mean 7.5 -> +-2.5; X {A1 10, B2 1.25} mean 5.625 -> +-4.375;
    # Y, Q singletons -> 0.  A^E (mean_norm): +-5.
    adv, _ = graphgpo(two_paths(), omega=0.5, mode="mean_norm", normalize_distance=True)
    np.testing.assert_allclose(adv, [7.5, 9.375, 5, -7.5, -5, -9.375])
    # the exponent already holds Eq. 4's +1: the paper convention gives the same returns
    paper = graph_returns(two_paths(), omega=0.5, normalize_distance=True, convention="paper")
    np.testing.assert_array_equal(paper, r)
    # the invalid penalty is deducted afterwards, as without normalisation: B2 invalid
    # (its edge is unchanged, exponent 3) -> 1.25 - 0.1 = 1.15
    r = graph_returns(two_paths(invalid_b=(2,)), omega=0.5, normalize_distance=True)
    np.testing.assert_allclose(r, [10, 10, 10, 5, 10, 1.15])


def test_normalize_distance_in_all_fail_groups_equals_the_default():
    # no success: every node has d = 1, so d(s') - d(s) + 1 = 1 = d(s') and both variants
    # give 10 * w minus the penalty (the reference code's all-fail behaviour, detail 5)
    on, _ = graphgpo(all_fail(), omega=0.5, mode="mean_norm", normalize_distance=True)
    off, _ = graphgpo(all_fail(), omega=0.5, mode="mean_norm")
    np.testing.assert_array_equal(on, off)


def test_normalize_distance_of_unreachable_states():
    # E wins S -> G -> sink; F fails S -> U -> W (U, W never reach the sink).
    # d(G) = 1, d(S) = 2; unreachable U, W: max finite 2 + 1 = 3.
    #   E0 S->G: 1-2+1 = 0 -> 10;  E1 G->sink: 0-1+1 = 0 -> 10
    #   F0 S->U: 3-2+1 = 2 -> 10 * 0.25 = 2.5 (reachable to unreachable: at least 2)
    #   F1 U->W: 3-3+1 = 1 -> 5 (unreachable to unreachable: exponent 1)
    rows = walk(0, 0, 0, ["S", "G"], "done", True) + walk(0, 1, 1, ["S", "U"], "W", False)
    table = StepTable.from_records(rows)
    r = graph_returns(table, omega=0.5, normalize_distance=True)
    np.testing.assert_allclose(r, [10, 10, 2.5, 5])


def with_progress(table, anchors):
    """progress_value / next_progress_value from a text -> progress map (the sink: 1.0)."""
    before = [anchors[a] for a in table.anchor]
    after = [anchors.get(a, 1.0) for a in table.next_anchor]
    return table.with_columns(
        progress_value=np.asarray(before, dtype=np.float64),
        next_progress_value=np.asarray(after, dtype=np.float64),
    )


def test_golden_progress_coef_enters_the_step_credit():
    # two_paths with P(S) = 0, P(X) = 0.5, P(Y) = 0.75, P(Q) = 0.25, P("success" text) = 0,
    # the sink's next progress 1.0 (A's "the task is done" maps to 1.0 below).
    # coef 2: bonus = 2 * (P(s') - P(s)):
    #   A0 S->X 1.0   A1 X->Y 0.5   A2 Y->sink 0.5   B0 S->Q 0.5   B1 Q->X 0.5   B2 X->"success" -1.0
    # R^G (code, w = 0.5) = [2.5, 5, 10, 1.25, 2.5, 0.625] + bonus
    #                     = [3.5, 5.5, 10.5, 1.75, 3.0, -0.375]
    progress = {"S": 0.0, "X": 0.5, "Y": 0.75, "Q": 0.25, "success": 0.0}
    table = with_progress(two_paths(), progress)
    r = graph_returns(table, omega=0.5, progress_coef=2.0)
    np.testing.assert_allclose(r, [3.5, 5.5, 10.5, 1.75, 3.0, -0.375])
    # A^G: S {3.5, 1.75} mean 2.625 -> +-0.875 (was +-0.625); X {5.5, -0.375} mean 2.5625
    #   -> +-2.9375 (was +-2.1875); singletons 0. A^E reads the rewards (unshaped): +-5.
    adv, _ = graphgpo(table, omega=0.5, mode="mean_norm", progress_coef=2.0)
    np.testing.assert_allclose(adv, [5.875, 7.9375, 5, -5.875, -5, -7.9375])
    # coef 0 (the default) ignores the progress columns: plain GraphGPO, bit for bit
    plain, _ = graphgpo(two_paths(), omega=0.5, mode="mean_norm")
    np.testing.assert_array_equal(graphgpo(table, omega=0.5, mode="mean_norm")[0], plain)


def test_golden_invalid_action():
    # B2 invalid: R^G = 0.625 - 0.1 = 0.525; X {5, 0.525} mean 2.7625 -> +-2.2375.
    # A^E: B2's score is 0 - 0.1, mean 5 (trajectory returns 10, 0) -> -5.1
    adv, _ = graphgpo(two_paths(invalid_b=(2,)), omega=0.5, mode="mean_norm")
    np.testing.assert_allclose(adv, [5.625, 7.2375, 5, -5.625, -5, -7.3375])


def all_fail():
    # C: S -> T -> U (C1 invalid);  D: S -> T -> V (D0 invalid); nobody wins
    rows = walk(5, 10, 0, ["S", "T"], "U", False, invalid=(1,))
    rows += walk(5, 11, 1, ["S", "T"], "V", False, invalid=(0,))
    return StepTable.from_records(rows)


def test_all_fail_group_follows_the_reference_code():
    # no success: every node gets d = 1, so R^G = 10 * 0.5 = 5 minus 0.1 on invalid rows:
    #   C0 5, C1 4.9, D0 4.9, D1 5.  S {C0 5, D0 4.9} -> +-0.05;  T {C1 4.9, D1 5} -> -+0.05
    # A^E (mean_norm): returns all 0 -> only the penalty: C1, D0 get -0.1
    d = graph_distances(all_fail())
    np.testing.assert_array_equal(d.d_next, [1, 1, 1, 1])
    assert d.stats["groups_without_success"] == 1
    adv, _ = graphgpo(all_fail(), omega=0.5, mode="mean_norm")
    np.testing.assert_allclose(adv, [0.05, -0.05 - 0.1, -0.05 - 0.1, 0.05])
    # the A^G part is not zero in all-fail groups ... unless zero_all_fail (Relax's choice)
    adv, _ = graphgpo(all_fail(), omega=0.5, mode="mean_norm", zero_all_fail=True)
    np.testing.assert_allclose(adv, [0, -0.1, -0.1, 0])


def test_estimate_registry_and_stats():
    adv, stats = estimate("graphgpo", two_paths(), omega=0.5, mode="mean_norm")
    assert adv.dtype == np.float32
    np.testing.assert_allclose(adv, [5.625, 7.1875, 5, -5.625, -5, -7.1875], rtol=1e-6)
    assert stats["source_singleton_share"] == pytest.approx(2 / 6)  # Y and Q
    assert stats["max_distance"] == 3
    adv, _ = graphgpo(StepTable.from_records([]))
    assert adv.shape == (0,)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"convention": "eq4"}, "option 'convention' must be 'code' or 'paper', got 'eq4'"),
        ({"omega": 1.0}, "option 'omega' must be in (0, 1), got 1.0"),
        ({"omega": 0}, "option 'omega' must be in (0, 1), got 0"),
        ({"mode": "std"}, "option 'mode' must be one of"),
        ({"invalid_penalty": -1.0}, "option 'invalid_penalty' must be a finite number >= 0"),
        ({"step_advantage_w": math.nan}, "option 'step_advantage_w' must be a finite number"),
        ({"normalize_distance": 1}, "option 'normalize_distance' must be true or false, got 1"),
        ({"progress_coef": -1.0}, "option 'progress_coef' must be a finite number >= 0"),
        ({"progress_coef": math.inf}, "option 'progress_coef' must be a finite number >= 0"),
    ],
)
def test_bad_options(options, message):
    with pytest.raises(ValueError, match="^" + re.escape(f"graphgpo: {message}")):
        graphgpo(two_paths(), **options)


# ---------------------------------------------------------------- plain-loop twin


def loop_graphgpo(
    table, omega, convention, mode, w_g, w_e, penalty, cross_steps, normalize=False, coef=0.0
):
    """Row-by-row GraphGPO with dict adjacency and a deque BFS per group (the reference)."""
    rows = table.to_records()
    by_traj = defaultdict(list)
    for i, r in enumerate(rows):
        by_traj[r["traj"]].append(i)
    sink = object()
    nxt = {}
    for idx in by_traj.values():
        last = max(idx, key=lambda i: rows[i]["turn"])
        for i in idx:
            won = i == last and rows[i]["success"] == 1
            nxt[i] = sink if won else rows[i]["next_anchor"]
    dist_of = {}
    for g in {r["group"] for r in rows}:
        members = [i for i, r in enumerate(rows) if r["group"] == g]
        rev = defaultdict(set)
        nodes = set()
        for i in members:
            rev[nxt[i]].add(rows[i]["anchor"])
            nodes |= {rows[i]["anchor"], nxt[i]}
        d = {}
        if sink in nodes:
            d[sink] = 0
            queue = deque([sink])
            while queue:
                u = queue.popleft()
                for v in rev[u]:
                    if v not in d:
                        d[v] = d[u] + 1
                        queue.append(v)
        far = max(d.values(), default=0) + 1
        dist_of[g] = {v: d.get(v, far) for v in nodes}
    ret = []
    for i, r in enumerate(rows):
        d = dist_of[r["group"]]
        if normalize:
            k = d[nxt[i]] - d[r["anchor"]] + 1
        else:
            k = d[nxt[i]] + (1 if convention == "paper" else 0)
        bonus = coef * (r["next_progress_value"] - r["progress_value"])
        ret.append(10 * omega**k - penalty * (not r["action_valid"]) + bonus)

    def norm(values, keys, singleton_raw):
        out = []
        for i in range(len(values)):
            peers = [values[j] for j in range(len(values)) if keys[j] == keys[i]]
            if len(peers) == 1:
                out.append(values[i] if singleton_raw else 0.0)
                continue
            mean = sum(peers) / len(peers)
            std = math.sqrt(sum((p - mean) ** 2 for p in peers) / (len(peers) - 1))
            out.append((values[i] - mean) / (std + EPS if mode == "mean_std_norm" else 1))
        return out

    a_g = norm(ret, [(r["group"], r["anchor"]) for r in rows], False)
    returns = {t: sum(rows[i]["reward"] for i in idx) for t, idx in by_traj.items()}
    scores = [returns[r["traj"]] - penalty * (not r["action_valid"]) for r in rows]
    a_e = []
    for i, r in enumerate(rows):
        if cross_steps:
            peers = [scores[j] for j in range(len(rows)) if rows[j]["group"] == r["group"]]
        else:
            peers = [
                returns[t] for t, idx in by_traj.items() if rows[idx[0]]["group"] == r["group"]
            ]
        if len(peers) == 1:
            mean, std = 0.0, 1.0 - EPS
        else:
            mean = sum(peers) / len(peers)
            std = math.sqrt(sum((p - mean) ** 2 for p in peers) / (len(peers) - 1))
        if cross_steps:  # per-row scores S_r inside the statistics
            a_e.append((scores[i] - mean) / (std + EPS if mode == "mean_std_norm" else 1))
        else:  # trajectory returns inside, the row's penalty deducted afterwards
            centred = (returns[r["traj"]] - mean) / (std + EPS if mode == "mean_std_norm" else 1)
            a_e.append(centred - penalty * (not r["action_valid"]))
    return np.array([w_g * x + w_e * y for x, y in zip(a_g, a_e)])


OPTIONS = st.fixed_dictionaries(
    {
        "omega": st.sampled_from([0.1, 0.2, 0.5, 0.9]),
        "convention": st.sampled_from(["code", "paper"]),
        "mode": st.sampled_from(["mean_norm", "mean_std_norm"]),
        "w_g": st.sampled_from([1.0, 0.5]),
        "w_e": st.sampled_from([1.0, 0.0]),
        "penalty": st.sampled_from([0.1, 0.0]),
        "cross_steps": st.booleans(),
        "normalize": st.booleans(),
        "coef": st.sampled_from([0.0, 1.5]),
    }
)


@settings(max_examples=80, deadline=None)
@given(walk_tables(), OPTIONS)
def test_loop_twin_agrees(table, o):
    # rubric progress of "room k" = k / 4 (the sink's next progress 1.0)
    table = with_progress(table, {f"room {k}": k / 4 for k in range(5)})
    adv, _ = graphgpo(
        table,
        omega=o["omega"],
        convention=o["convention"],
        mode=o["mode"],
        step_advantage_w=o["w_g"],
        episode_advantage_w=o["w_e"],
        invalid_penalty=o["penalty"],
        cross_steps=o["cross_steps"],
        normalize_distance=o["normalize"],
        progress_coef=o["coef"],
    )
    np.testing.assert_allclose(adv, loop_graphgpo(table, **o), rtol=1e-7, atol=1e-7)


@settings(max_examples=60, deadline=None)
@given(walk_tables(), st.randoms(use_true_random=False))
def test_row_permutation_invariance(table, rnd):
    perm = np.arange(len(table))
    rnd.shuffle(perm)
    adv, stats = graphgpo(table)
    adv_p, stats_p = graphgpo(table.select(perm))
    np.testing.assert_allclose(adv_p, adv[perm], rtol=1e-9, atol=1e-9)
    assert stats == pytest.approx(stats_p)


@settings(max_examples=60, deadline=None)
@given(walk_tables(success=True, min_traj=2))
def test_all_success_groups(table):
    # every trajectory ends in the sink, so every node reaches it: no unreachable states, the
    # winning rows get the full 10, and with no penalty A^E = 0 (two or more trajectories
    # per group; a lone trajectory keeps its raw score) leaves A = A^G
    d = graph_distances(table)
    assert d.stats["reachable_node_share"] == 1.0
    assert d.stats["groups_without_success"] == 0
    assert np.all(d.d_source >= 1) and np.all(d.d_source <= d.d_next + 1)
    r = graph_returns(table, omega=0.2, invalid_penalty=0.0)
    np.testing.assert_allclose(r[table.done], 10.0)
    adv, _ = graphgpo(table, omega=0.2, invalid_penalty=0.0, episode_advantage_w=0.0)
    full, _ = graphgpo(table, omega=0.2, invalid_penalty=0.0)
    np.testing.assert_allclose(full, adv, atol=1e-9)
