"""ProGPO (Fan & Liu): hand-derived golden values, a plain-loop twin, properties, bad input."""

from __future__ import annotations

import math
import re
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from walk_tables import walk_tables

from mcgpo import estimate
from mcgpo.advantages.progpo import progpo, progpo_potentials
from mcgpo.steps import StepTable

EPS = 1e-6


def walk(group, traj, slot, anchors, won, actions=None, coarse=None, invalid=()):
    """Rows of one trajectory visiting ``anchors``; 10 reward on the last row of a win."""
    last = len(anchors) - 1
    return [
        {
            "group": group,
            "traj": traj,
            "slot": slot,
            "turn": t,
            "reward": 10.0 if (won and t == last) else 0.0,
            "done": t == last,
            "success": float(won),
            "score": float(won),
            "action": actions[t] if actions else f"go from {a}",
            "action_valid": t not in invalid,
            "anchor": a,
            "next_anchor": "success" if (won and t == last) else "Z",
            "state_coarse": coarse[t] if coarse else "",
        }
        for t, a in enumerate(anchors)
    ]


def test_golden_step_with_peers():
    # gamma = 0.5.  A: S -> X, wins at X: R(A0) = 0.5 * 10 = 5, R(A1) = 10
    #               B: S -> X, fails:      R = 0, 0        C: S, fails: R = 0
    # peers at turn 0, prefix (S): {A0 5, B0 0, C0 0}, mean 5/3 -> +10/3, -5/3, -5/3
    # peers at turn 1, prefix (S, X): {A1 10, B1 0}, mean 5 -> +5, -5 (every row has peers)
    # A^E (mean_norm, once per trajectory): returns 10, 0, 0, mean 10/3 -> +20/3, -10/3, -10/3
    rows = walk(0, 0, 0, ["S", "X"], True) + walk(0, 1, 1, ["S", "X"], False)
    rows += walk(0, 2, 2, ["S"], False)
    table = StepTable.from_records(rows)
    adv, stats = progpo(table, gamma=0.5, mode="mean_norm")
    np.testing.assert_allclose(adv, [10, 35 / 3, -5, -25 / 3, -5])
    assert stats["peer_row_share"] == 1.0
    assert stats["credited_row_share"] == 0.0
    assert stats["peer_group_size_mean"] == pytest.approx((3 * 3 + 2 * 2) / 5)
    # with actions in the prefix, A1 ("go a") and B1 ("go b") have different prefixes
    rows[0]["action"], rows[2]["action"] = "go a", "go b"
    _, stats = progpo(StepTable.from_records(rows), gamma=0.5, prefix="states_actions")
    assert stats["peer_row_share"] == pytest.approx(3 / 5)


def singleton_case():
    # gamma = 0.5.  A: S -> X, wins at X;  B: S -> Y -> X, fails
    #   returns R: A0 = 5, A1 = 10;  B0 = B1 = B2 = 0
    #   prefixes: (S) {A0, B0} are peers; A1 (S,X), B1 (S,Y), B2 (S,Y,X) are alone
    rows = walk(0, 0, 0, ["S", "X"], True) + walk(0, 1, 1, ["S", "Y", "X"], False)
    return StepTable.from_records(rows)


def test_golden_singleton_credited_by_potentials():
    # depth 0 only (history=0, no expansion): Phi = mean return over the visits of a state
    #   Phi(S) = (5 + 0) / 2 = 2.5, Phi(X) = (10 + 0) / 2 = 5, Phi(Y) = 0
    # delta = r + 0.5 * Phi(next) - Phi(s), Phi after the last row = 0:
    #   A0: 0 + 2.5 - 2.5 = 0   A1: 10 + 0 - 5 = 5
    #   B0: 0 + 0 - 2.5 = -2.5  B1: 0 + 2.5 - 0 = 2.5 (Y -> X is good: X's potential pools
    #   A's win)  B2: 0 + 0 - 5 = -5
    # step term: peers at turn 0 {A0 5, B0 0} -> +2.5 / -2.5; the others get delta
    # A^E (mean_norm): returns 10 / 0 -> +5 / -5
    kw = {"gamma": 0.5, "history": 0, "expansion": "none"}
    pot = progpo_potentials(singleton_case(), **kw)
    np.testing.assert_allclose(pot.phi, [2.5, 5, 2.5, 0, 5])
    np.testing.assert_allclose(pot.phi_next, [5, 0, 0, 5, 0])
    adv, stats = progpo(singleton_case(), mode="mean_norm", **kw)
    np.testing.assert_allclose(adv, [7.5, 10, -7.5, -2.5, -10])
    assert stats["credited_row_share"] == pytest.approx(3 / 5)
    # step_weight = 0.5 halves the step term only
    adv, _ = progpo(singleton_case(), mode="mean_norm", step_weight=0.5, **kw)
    np.testing.assert_allclose(adv, [6.25, 7.5, -6.25, -3.75, -7.5])
    # mean_std_norm scales delta by its group std: delta = [0, 5, -2.5, 2.5, -5] has mean 0,
    # unbiased var 62.5 / 4 = 15.625; credit = delta / (3.952847 + eps)
    # (A^E under mean_std_norm: returns 10 / 0, mean 5, std sqrt(50) -> +-5 / (sqrt(50) + eps))
    adv, _ = progpo(singleton_case(), parts="potentials", **kw)
    episode = np.array([1, 1, -1, -1, -1]) * 10 / (math.sqrt(50) + EPS) / 2
    delta = np.array([0, 5, -2.5, 2.5, -5])
    np.testing.assert_allclose(adv - episode, delta / (math.sqrt(15.625) + EPS), rtol=1e-9)
    # parts="peers": the singletons get no step term, only A^E
    adv, _ = progpo(singleton_case(), parts="peers", mode="mean_norm", **kw)
    np.testing.assert_allclose(adv, [7.5, 5, -7.5, -5, -5])
    # credit_all adds delta on the peer rows too (A0 + 0, B0 - 2.5)
    adv, _ = progpo(singleton_case(), credit_all=True, mode="mean_norm", **kw)
    np.testing.assert_allclose(adv, [7.5, 10, -10, -2.5, -10])


def fusion_case(p="P", q="Q", x="X"):
    # gamma = 1, so every return is the outcome: A, C, D win (10), B fails (0)
    #   A: P -> X   B: P -> X   C: Q -> X   D: Q -> X   (rows: turn 0 at P/Q, turn 1 at X)
    rows = walk(0, 0, 0, [p, x], True, coarse=["room", ""])
    rows += walk(0, 1, 1, [p, x], False, coarse=["room", ""])
    rows += walk(0, 2, 2, [q, x], True, coarse=["room", ""])
    rows += walk(0, 3, 3, [q, x], True, coarse=["room", ""])
    return StepTable.from_records(rows)


def test_golden_fusion_weights():
    # var_floor 1, history 1, no expansion.  At X (turn 1):
    #   depth 0, X: {10, 0, 10, 10}: mean 7.5, var 75/3 = 25, v0 = (25 + 1) / 4 = 6.5
    #   depth 1, (P,X): {10, 0}: mean 5, var 50, v1 = 51 / 2 = 25.5
    #            (Q,X): {10, 10}: mean 10, var 0, v1 = 1 / 2 = 0.5
    #   A1, B1: w0 = 25.5 / (25.5 + 6.5) = 0.796875, w1 = 0.203125,
    #           Phi = 0.796875 * 7.5 + 0.203125 * 5 = 6.9921875
    #   C1, D1: w0 = 0.5 / 7 = 1/14, w1 = 13/14, Phi = (7.5 + 13 * 10) / 14 = 9.8214...
    #   turn 0 has depth 0 only: Phi(P) = 5, Phi(Q) = 10 (weight 1)
    kw = {"gamma": 1.0, "history": 1, "var_floor": 1.0, "expansion": "none"}
    pot = progpo_potentials(fusion_case(), **kw)
    assert pot.levels == ["depth0", "depth1"]
    np.testing.assert_allclose(pot.weights[0], [1, 0.796875, 1, 0.796875, 1, 1 / 14, 1, 1 / 14])
    np.testing.assert_allclose(pot.weights[1], [0, 0.203125, 0, 0.203125, 0, 13 / 14, 0, 13 / 14])
    phi_ab, phi_cd = 6.9921875, 137.5 / 14
    np.testing.assert_allclose(pot.phi, [5, phi_ab, 5, phi_ab, 10, phi_cd, 10, phi_cd])
    # "deepest": the deepest level with two or more visits: (P,X) -> 5, (Q,X) -> 10
    pot = progpo_potentials(fusion_case(), fusion="deepest", **kw)
    np.testing.assert_allclose(pot.phi, [5, 5, 5, 5, 10, 10, 10, 10])
    # semantic expansion: P and Q share state_coarse "room", so at turn 0 the class
    #   {10, 0, 10, 10} (mean 7.5, v = 26 / 4 = 6.5) joins depth 0:
    #   P: v0 = 25.5 -> w0 = 6.5 / 32, Phi = 0.203125 * 5 + 0.796875 * 7.5 = 6.9921875
    #   Q: v0 = 0.5  -> w0 = 13 / 14,   Phi = (13 * 10 + 7.5) / 14
    # X has an empty state_coarse: its class is X itself, which adds no visits: not used
    pot = progpo_potentials(fusion_case(), **{**kw, "expansion": "coarse"})
    assert pot.levels == ["depth0", "depth1", "semantic"]
    np.testing.assert_allclose(pot.phi, [phi_ab, phi_ab, phi_ab, phi_ab] + [phi_cd] * 4)
    np.testing.assert_allclose(pot.weights[2], [0.796875, 0, 0.796875, 0, 1 / 14, 0, 1 / 14, 0])
    # similarity expansion finds the same classes from the text: the two kitchen views differ
    # in one character of 55 (rapidfuzz ratio 100 * (1 - 2/110) = 98.2 >= 90, < 99); the
    # garden stays alone
    p = "You are in the kitchen. On the counter 1 you see a mug."
    q = p.replace("counter 1", "counter 2")
    table = fusion_case(p, q, "You are in the garden.")
    pot = progpo_potentials(table, **{**kw, "expansion": "similarity", "similarity": 0.9})
    np.testing.assert_allclose(pot.phi, [phi_ab, phi_ab, phi_ab, phi_ab] + [phi_cd] * 4)
    pot = progpo_potentials(table, **{**kw, "expansion": "similarity", "similarity": 0.99})
    np.testing.assert_allclose(pot.weights[2], 0.0)  # nothing merged: the level adds nothing


def test_golden_invalid_penalty():
    # singleton case with B1 invalid (penalty 0.1): the returns behind Phi are unchanged,
    # delta(B1) = 2.5 - 0.1 = 2.4; A^E(B1) = -5 - 0.1
    rows = walk(0, 0, 0, ["S", "X"], True) + walk(0, 1, 1, ["S", "Y", "X"], False, invalid=(1,))
    kw = {"gamma": 0.5, "history": 0, "expansion": "none", "mode": "mean_norm"}
    adv, _ = progpo(StepTable.from_records(rows), **kw)
    np.testing.assert_allclose(adv, [7.5, 10, -7.5, -2.5 - 0.1 - 0.1, -10])


def test_estimate_and_empty():
    adv, stats = estimate("progpo", singleton_case(), gamma=0.5, history=0, mode="mean_norm")
    assert adv.dtype == np.float32 and adv.shape == (5,)
    assert set(stats) >= {"peer_row_share", "credited_row_share", "fusion_weight_depth0"}
    adv, _ = progpo(StepTable.from_records([]))
    assert adv.shape == (0,)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"parts": "all"}, "option 'parts' must be one of 'both', 'peers', 'potentials'"),
        ({"fusion": "mean"}, "option 'fusion' must be one of 'inverse_variance', 'deepest'"),
        ({"expansion": "yes"}, "option 'expansion' must be one of 'none', 'coarse'"),
        ({"prefix": "actions"}, "option 'prefix' must be one of 'states', 'states_actions'"),
        ({"history": -1}, "option 'history' must be an integer in [0, 16], got -1"),
        ({"history": 1.5}, "option 'history' must be an integer in [0, 16], got 1.5"),
        ({"gamma": 0.0}, "option 'gamma' must be in (0, 1], got 0.0"),
        ({"step_weight": -1}, "option 'step_weight' must be a finite number >= 0, got -1"),
        ({"var_floor": 0}, "option 'var_floor' must be a finite number > 0"),
        ({"mode": "z"}, "option 'mode' must be one of"),
        ({"parts": "peers", "credit_all": True}, "option 'credit_all' needs parts='both'"),
    ],
)
def test_bad_options(options, message):
    with pytest.raises(ValueError, match="^" + re.escape(f"progpo: {message}")):
        progpo(singleton_case(), **options)


# ---------------------------------------------------------------- plain-loop twin


def loop_progpo(
    table, *, parts, prefix, history, fusion, expansion, gamma, step_weight, mode, credit_all
):
    """Row-by-row ProGPO with tuples and dicts (penalty 0.1, var_floor 0.01, trajectory-once A^E)."""
    penalty, floor = 0.1, 0.01
    rows = table.to_records()
    n = len(rows)
    trajs = defaultdict(dict)
    for i, r in enumerate(rows):
        trajs[r["traj"]][r["turn"]] = i
    ret = [0.0] * n
    for turns in trajs.values():
        running = 0.0
        for t in sorted(turns, reverse=True):
            running = rows[turns[t]]["reward"] + gamma * running
            ret[turns[t]] = running

    def history_of(i, depth=None):
        r = rows[i]
        turns = trajs[r["traj"]]
        start = 0 if depth is None else r["turn"] - depth
        key = []
        for t in range(start, r["turn"] + 1):
            if prefix == "states_actions" and depth is None and t > start:
                key.append(("a", rows[turns[t - 1]]["action"]))
            key.append(rows[turns[t]]["anchor"])
        return (r["group"], tuple(key))

    def stats(values, keys):
        by = defaultdict(list)
        for v, k in zip(values, keys):
            if k is not None:
                by[k].append(v)
        out = []
        for k in keys:
            vs = by.get(k, [])
            mean = sum(vs) / len(vs) if vs else 0.0
            var = sum((v - mean) ** 2 for v in vs) / (len(vs) - 1) if len(vs) > 1 else None
            out.append((mean, var, len(vs)))
        return out

    def scaled(x, mean, var, count):
        if mode == "mean_norm":
            return x - mean
        return (x - mean) / ((math.sqrt(var) if count > 1 else 1.0 - EPS) + EPS)

    y = [ret[i] - penalty * (not r["action_valid"]) for i, r in enumerate(rows)]
    pk = [history_of(i) for i in range(n)]
    a_peer = [scaled(y[i], m, v, c) if c > 1 else 0.0 for i, (m, v, c) in enumerate(stats(y, pk))]
    has_peers = [c > 1 for _, _, c in stats(y, pk)]

    group_var = [v or 0.0 for _, v, _ in stats(ret, [r["group"] for r in rows])]
    levels = [
        stats(ret, [history_of(i, k) if rows[i]["turn"] >= k else None for i in range(n)])
        for k in range(history + 1)
    ]
    if expansion == "coarse":
        keys = [
            (r["group"], "c:" + r["state_coarse"] if r["state_coarse"] else "a:" + r["anchor"])
            for r in rows
        ]
        sem = stats(ret, keys)
        levels.append([s if s[2] > d[2] else (0.0, None, 0) for s, d in zip(sem, levels[0])])
    phi = []
    for i in range(n):
        present = [lv[i] for lv in levels if lv[i][2] > 0]
        if fusion == "inverse_variance":
            w = [c / ((v if c > 1 else group_var[i]) + floor) for _, v, c in present]
            phi.append(sum(wi * m for wi, (m, _, _) in zip(w, present)) / sum(w))
        else:
            depths = [lv[i] for lv in levels[: history + 1]][::-1] + [
                lv[i] for lv in levels[history + 1 :]
            ]
            pick = next((m for m, _, c in depths if c >= 2), levels[0][i][0])
            phi.append(pick)
    delta = []
    for i, r in enumerate(rows):
        nxt = trajs[r["traj"]].get(r["turn"] + 1)
        phi_next = phi[nxt] if nxt is not None else 0.0
        delta.append(r["reward"] - penalty * (not r["action_valid"]) + gamma * phi_next - phi[i])
    dstats = stats(delta, [r["group"] for r in rows])
    credit = [
        d / ((math.sqrt(v) + EPS) if c > 1 else 1.0) if mode == "mean_std_norm" else d
        for d, (_, v, c) in zip(delta, dstats)
    ]
    out = []
    returns = {t: sum(rows[i]["reward"] for i in turns.values()) for t, turns in trajs.items()}
    for i, r in enumerate(rows):
        if parts == "peers":
            step = a_peer[i]
        elif parts == "potentials":
            step = credit[i]
        else:
            step = a_peer[i] + credit[i] if credit_all else a_peer[i] if has_peers[i] else credit[i]
        peers = [returns[t] for t, turns in trajs.items() if rows[turns[0]]["group"] == r["group"]]
        if len(peers) == 1:
            m, s = 0.0, 1.0 - EPS
        else:
            m = sum(peers) / len(peers)
            s = math.sqrt(sum((p - m) ** 2 for p in peers) / (len(peers) - 1))
        a_e = (returns[r["traj"]] - m) / (s + EPS if mode == "mean_std_norm" else 1.0)
        out.append(a_e - penalty * (not r["action_valid"]) + step_weight * step)
    return np.array(out)


OPTIONS = st.fixed_dictionaries(
    {
        "parts": st.sampled_from(["both", "peers", "potentials"]),
        "prefix": st.sampled_from(["states", "states_actions"]),
        "history": st.integers(0, 3),
        "fusion": st.sampled_from(["inverse_variance", "deepest"]),
        "expansion": st.sampled_from(["none", "coarse"]),
        "gamma": st.sampled_from([0.95, 0.5, 1.0]),
        "step_weight": st.sampled_from([1.0, 0.5]),
        "mode": st.sampled_from(["mean_norm", "mean_std_norm"]),
        "credit_all": st.booleans(),
    }
)


@settings(max_examples=80, deadline=None)
@given(walk_tables(), OPTIONS)
def test_loop_twin_agrees(table, o):
    if o["parts"] != "both":
        o = {**o, "credit_all": False}
    adv, _ = progpo(table, **o)
    np.testing.assert_allclose(adv, loop_progpo(table, **o), rtol=1e-7, atol=1e-7)


@settings(max_examples=50, deadline=None)
@given(
    walk_tables(),
    st.randoms(use_true_random=False),
    st.sampled_from(["none", "coarse", "similarity"]),
)
def test_row_permutation_invariance(table, rnd, expansion):
    perm = np.arange(len(table))
    rnd.shuffle(perm)
    adv, stats = progpo(table, expansion=expansion, prefix="states_actions")
    adv_p, stats_p = progpo(table.select(perm), expansion=expansion, prefix="states_actions")
    np.testing.assert_allclose(adv_p, adv[perm], rtol=1e-9, atol=1e-9)
    assert stats == pytest.approx(stats_p)


@settings(max_examples=50, deadline=None)
@given(walk_tables(success=True, min_traj=2), st.sampled_from(["both", "potentials"]))
def test_all_success_groups_without_discount_give_zero(table, parts):
    # gamma = 1, all win, no penalty: every return is 10, so peers see no spread, every
    # potential is 10 and delta = r + Phi(next) - Phi(s) = 0 on every row; A^E = 0 too
    adv, _ = progpo(table, gamma=1.0, invalid_penalty=0.0, parts=parts)
    np.testing.assert_allclose(adv, 0.0, atol=1e-6)  # float noise / (0 + eps) stays tiny
