"""Properties of build_preferences, and a plain-loop version that must agree with it.

The loop version below is written straight from the rules in docs/algorithms/mcgpo.md,
trajectory by trajectory and pair by pair, sharing no code with the vectorised builder.
"""

from __future__ import annotations

import re
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st

import mcgpo
from mcgpo.bench.synthetic import synthetic_table
from mcgpo.preferences.confidence import beta_confidence
from mcgpo.steps import StepTable

TOL = 1e-12


def loop_preferences(
    table: StepTable,
    group_size: int = 8,
    fold_split: int | None = None,
    min_support: int = 1,
    epsilon: float = 0.25,
    kappa: float = 1.0,
    q_exact: float = 1.0,
    q_coarse: float = 0.5,
    max_per_fold: int | None = 2,
    evidence: str = "opposite_fold",
    weighting: str = "evidence",
    matching: str = "joint",
    coarse_actions: str = "coarse",
    support: str = "direct",
    blend: str = "first",
) -> list[tuple]:
    """(group, fold, plus row, minus row, weight, level), in the builder's output order."""
    split = group_size // 2 if fold_split is None else fold_split
    levels = ["exact"] if matching == "rubric_only" else ["exact", "coarse"]

    def act(i: int, level: str) -> str:
        # the coarse level drops instance numbers (" 1") and re-sorts ","-parts, as h_coarse
        text = str(table.action[i])
        if level == "exact" or coarse_actions == "exact":
            return text
        return ",".join(sorted(re.sub(r" [0-9]+", "", text).split(",")))

    def key(i: int, level: str) -> tuple:
        state = table.state[i] if level == "exact" else table.state_coarse[i]
        rubric = (table.progress[i], table.enabled[i])
        return {"joint": (state, *rubric), "state_only": (state,), "rubric_only": rubric}[matching]

    # trajectories: group -> {slot: (success, eligible rows)}; every row of a non-errored
    # trajectory, invalid ones included, is a visit of its state (successor support)
    trajs: dict[int, dict[int, tuple[float, list[int]]]] = {}
    every: dict[int, dict[int, list[int]]] = {}
    next_row: dict[tuple[int, int], int] = {}  # (traj, turn) -> row
    for i in range(len(table)):
        if table.errored[i]:
            continue
        g, s = int(table.group[i]), int(table.slot[i])
        eligible = trajs.setdefault(g, {}).setdefault(s, (float(table.success[i]), []))[1]
        if table.action_valid[i]:
            eligible.append(i)
        every.setdefault(g, {}).setdefault(s, []).append(i)
        next_row[int(table.traj[i]), int(table.turn[i])] = i

    def successor(i: int, level: str) -> tuple | None:
        # the key of the next turn of i's own trajectory; None after its last turn
        j = next_row.get((int(table.traj[i]), int(table.turn[i]) + 1))
        return None if j is None else key(j, level)

    def blended(found: list, r: int) -> tuple[float, int]:
        # (u, n) of r's action over the qualifying levels: u_0 + sum w (u_l - u_0) / sum w,
        # w = (n + 3) / (p (1 - p)), p = (k + 1) / (n + 2); n = the largest level's count
        ests = [(sum(h[r]) / len(h[r]), len(h[r])) for _, h in found]
        u0 = ests[0][0]
        ps = [(u * n + 1) / (n + 2) for u, n in ests]
        w = [(n + 3) / (p * (1 - p)) for p, (_, n) in zip(ps, ests)]
        shift = sum(wi * (u - u0) for wi, (u, _) in zip(w, ests))
        return u0 + shift / sum(w), max(n for _, n in ests)

    out = []
    for g in sorted(trajs):
        members = trajs[g]
        visited = {s: {lv: {key(i, lv) for i in every[g][s]} for lv in levels} for s in members}
        # first visits: slot -> level -> key -> row
        first: dict[int, dict[str, dict[tuple, int]]] = {}
        for s, (_, rows) in members.items():
            first[s] = {}
            for level in levels:
                seen: dict[tuple, int] = {}
                for i in sorted(rows, key=lambda r: table.turn[r]):
                    seen.setdefault(key(i, level), i)
                first[s][level] = seen
        leave_pair_out = evidence == "leave_pair_out"
        for fold in (-1,) if leave_pair_out else (0, 1):  # leave_pair_out: one pool, fold -1
            in_fold = sorted(s for s in members if leave_pair_out or (s >= split) == bool(fold))
            if evidence == "opposite_fold":
                judges = [s for s in members if (s >= split) != bool(fold)]
            elif evidence == "same_fold":
                judges = in_fold
            else:
                judges = list(members)
            comparisons = []  # (min turn, max turn, turn of lower slot, sa, sb, a, b, c, level)
            for sa, sb in combinations(in_fold, 2):
                if leave_pair_out:  # every sibling but the two candidates
                    judges = [s for s in members if s not in (sa, sb)]
                pairs = set()
                for level in levels:
                    for k, ra in first[sa][level].items():
                        rb = first[sb][level].get(k)
                        if rb is not None and act(ra, level) != act(rb, level):
                            pairs.add((ra, rb))
                for ra, rb in pairs:
                    found = []  # (level, evidence outcomes per row) of the qualifying levels
                    for level in levels:
                        k = key(ra, level)
                        if first[sa][level].get(k) != ra or first[sb][level].get(k) != rb:
                            continue  # the pair is not a candidate under this rule
                        if act(ra, level) == act(rb, level):
                            continue  # the same action under this rule
                        held = {}
                        for r in (ra, rb):
                            succ = successor(r, level) if support == "successor" else None
                            held[r] = [
                                members[j][0]
                                for j in judges
                                if (
                                    k in first[j][level]
                                    and act(first[j][level][k], level) == act(r, level)
                                )
                                or (succ is not None and succ in visited[j][level])
                            ]
                        if min(len(held[ra]), len(held[rb])) >= min_support:
                            found.append((level, held))
                            if blend == "first":
                                break
                    if not found:
                        continue  # no rule qualifies
                    level = found[0][0]
                    (u_a, n_a), (u_b, n_b) = blended(found, ra), blended(found, rb)
                    gap = u_a - u_b
                    if abs(gap) < epsilon - TOL or gap == 0:
                        continue
                    n = min(n_a, n_b)
                    q = q_exact if level == "exact" else q_coarse
                    c = abs(gap) * n / (n + kappa) * q if weighting == "evidence" else q
                    plus, minus = (ra, rb) if gap > 0 else (rb, ra)
                    if weighting == "beta":  # c's formula is tested on closed forms apart
                        (u_p, n_p), (u_m, n_m) = ((u_a, n_a), (u_b, n_b))[:: 1 if gap > 0 else -1]
                        got = beta_confidence(
                            np.array([u_p * n_p]), np.array([n_p]), np.array([u_m * n_m]),
                            np.array([n_m]), kappa,
                        )  # fmt: skip
                        c = float(got[0]) * q
                    ta, tb = int(table.turn[ra]), int(table.turn[rb])
                    comparisons.append(
                        (min(ta, tb), max(ta, tb), ta, sa, sb, plus, minus, c, level)
                    )
            # earliest comparison per sibling pair
            best: dict[tuple[int, int], tuple] = {}
            for comp in sorted(comparisons):
                best.setdefault((comp[3], comp[4]), comp)
            used: set[int] = set()
            kept = 0
            cap = max_per_fold if max_per_fold is None or not leave_pair_out else 2 * max_per_fold
            for comp in sorted(best.values(), key=lambda c: (c[0], c[1], c[3], c[4])):
                if cap is not None and kept >= cap:
                    break
                if comp[5] in used or comp[6] in used:
                    continue
                used.update((comp[5], comp[6]))
                kept += 1
                out.append((g, fold, comp[5], comp[6], round(comp[7], 12), comp[8]))
    return out


def as_list(prefs) -> list[tuple]:
    return [
        (int(g), int(f), int(p), int(m), round(float(w), 12), str(lv))
        for g, f, p, m, w, lv in zip(
            prefs.group, prefs.fold, prefs.plus, prefs.minus, prefs.weight, prefs.level
        )
    ]


# --------------------------------------------------------------------------- random groups
@st.composite
def tables(draw, max_groups: int = 3):
    """Small groups with few states / actions so that matches, revisits and ties are common."""
    n_groups = draw(st.integers(1, max_groups))
    rows, traj = [], 0
    for g in range(n_groups):
        slots = draw(st.lists(st.integers(0, 7), min_size=5, max_size=8, unique=True))
        for slot in slots:
            success = draw(st.sampled_from([0.0, 1.0]))
            errored = draw(st.booleans()) and draw(st.booleans()) and draw(st.booleans())
            length = draw(st.integers(1, 6))
            for turn in range(length):
                s = draw(st.integers(0, 2))
                rows.append(
                    {
                        "group": g * 5 + 1,
                        "traj": traj,
                        "slot": slot,
                        "turn": turn,
                        "reward": 0.0,
                        "done": turn == length - 1,
                        "success": success,
                        "score": success,
                        "action": draw(st.sampled_from(["x 1", "x 2", "y", "z 3"])),
                        "action_valid": draw(st.integers(0, 9)) > 0,
                        "anchor": f"s{s}",
                        "state": f"room {s}",
                        "state_coarse": f"room {s % 2}",
                        "progress": draw(st.sampled_from(["", "found"])),
                        "enabled": "take",
                        "errored": errored,
                    }
                )
            traj += 1
    return StepTable.from_records(rows)


OPTIONS = st.fixed_dictionaries(
    {
        "epsilon": st.sampled_from([0.0, 0.25, 0.5, 1.0]),
        "kappa": st.sampled_from([0.0, 1.0, 2.5]),
        "min_support": st.sampled_from([1, 2]),
        "max_per_fold": st.sampled_from([1, 2, None]),
        "evidence": st.sampled_from(["opposite_fold", "same_fold", "pooled", "leave_pair_out"]),
        "weighting": st.sampled_from(["evidence", "uniform", "beta"]),
        "matching": st.sampled_from(["joint", "state_only", "rubric_only"]),
        "coarse_actions": st.sampled_from(["coarse", "exact"]),
        "support": st.sampled_from(["direct", "successor"]),
        "blend": st.sampled_from(["first", "inverse_variance"]),
    }
)


@settings(max_examples=100, deadline=None)
@given(tables(), OPTIONS)
def test_loop_equals_vectorised(table, options):
    expected = loop_preferences(table, **options)
    target(float(len(expected)))  # steer generation towards groups that yield preferences
    assert as_list(mcgpo.build_preferences(table, **options)) == expected


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"max_per_fold": None, "epsilon": 0.0, "kappa": 0.0},
        {"evidence": "same_fold", "max_per_fold": None},
        {"evidence": "pooled", "weighting": "uniform", "min_support": 2},
        {"matching": "state_only", "max_per_fold": 1},
        {"matching": "rubric_only", "max_per_fold": None},
        {"coarse_actions": "exact", "kappa": 0.0, "q_coarse": 1.0},
        {"evidence": "leave_pair_out"},
        {"evidence": "leave_pair_out", "weighting": "beta", "max_per_fold": None},
        {"weighting": "beta", "kappa": 2.0},
        {"support": "successor"},
        {"blend": "inverse_variance", "coarse_actions": "exact"},
        {"support": "successor", "blend": "inverse_variance", "evidence": "leave_pair_out"},
        {"support": "successor", "blend": "inverse_variance", "weighting": "beta"},
    ],
)
def test_loop_equals_vectorised_on_synthetic_batches(seed, options):
    table = synthetic_table(4, 8, 20, p_invalid=0.2, seed=seed)
    expected = loop_preferences(table, **options)
    assert as_list(mcgpo.build_preferences(table, **options)) == expected


def test_synthetic_batches_exercise_every_rule():
    # the batches above are not vacuous: preferences at both levels and drops of every kind.
    # Every synthetic action is "go to cabinet <k>", one action once instance numbers go, so
    # coarse pairs need coarse_actions="exact" (the case added above); the default finds none.
    tables = [synthetic_table(4, 8, 20, seed=s) for s in range(4)]
    prefs = [mcgpo.build_preferences(t, coarse_actions="exact") for t in tables]
    total = {k: sum(p.stats[k] for p in prefs) for k in prefs[0].stats}
    assert total["exact"] > 0 and total["coarse"] > 0
    for reason in ("no_match", "no_support", "below_epsilon", "allocation"):
        assert total[f"dropped_{reason}"] > 0
    assert sum(mcgpo.build_preferences(t).stats["coarse"] for t in tables) == 0


@settings(max_examples=60, deadline=None)
@given(tables(), st.data())
def test_cross_fitting_own_fold_outcomes_never_change_labels(table, data):
    # Flip the outcome of some trajectories of one fold: that fold's preferences must not move.
    fold = data.draw(st.sampled_from([0, 1]))
    before = mcgpo.build_preferences(table)
    traj_ids = sorted(set(table.traj[(table.slot >= 4) == bool(fold)].tolist()))
    flip = data.draw(st.sets(st.sampled_from(traj_ids)) if traj_ids else st.just(set()))
    success = np.where(np.isin(table.traj, list(flip)), 1.0 - table.success, table.success)
    after = mcgpo.build_preferences(table.with_columns(success=success))
    assert [p for p in as_list(after) if p[1] == fold] == [
        p for p in as_list(before) if p[1] == fold
    ]


@settings(max_examples=60, deadline=None)
@given(tables(), st.randoms(use_true_random=False), OPTIONS)
def test_row_order_does_not_matter(table, rnd, options):
    perm = list(range(len(table)))
    rnd.shuffle(perm)
    shuffled = table.select(np.asarray(perm, dtype=np.int64))

    def content(t, prefs):  # identify rows by (traj, turn), not by position
        return [
            (int(t.traj[p]), int(t.turn[p]), int(t.traj[m]), int(t.turn[m]), round(w, 12), lv)
            for p, m, w, lv in zip(prefs.plus, prefs.minus, prefs.weight.tolist(), prefs.level)
        ]

    a = mcgpo.build_preferences(table, **options)
    b = mcgpo.build_preferences(shuffled, **options)
    assert content(table, a) == content(shuffled, b)
    assert a.stats == b.stats


@settings(max_examples=60, deadline=None)
@given(tables(), st.sampled_from([0.0, 1.0]), OPTIONS)
def test_uniform_outcomes_give_no_preferences(table, outcome, options):
    same = table.with_columns(success=np.full(len(table), outcome))
    prefs = mcgpo.build_preferences(same, **options)
    assert len(prefs) == 0
    assert (
        prefs.stats["dropped_below_epsilon"]
        == prefs.stats["candidate_pairs"] - (prefs.stats["dropped_no_support"])
    )


@settings(max_examples=60, deadline=None)
@given(tables(), OPTIONS)
def test_invariants_of_the_output(table, options):
    prefs = mcgpo.build_preferences(table, **options)
    used = np.concatenate([prefs.plus, prefs.minus])
    assert len(np.unique(used)) == len(used)  # rows used once
    assert np.all(table.group[prefs.plus] == table.group[prefs.minus])
    assert np.all(table.traj[prefs.plus] != table.traj[prefs.minus])
    assert np.all(table.action[prefs.plus] != table.action[prefs.minus])
    assert np.all(table.action_valid[used]) and not np.any(table.errored[used])
    fold_plus = (table.slot[prefs.plus] >= 4).astype(int)
    if options["evidence"] == "leave_pair_out":  # pairs may span the folds
        assert np.all(prefs.fold == -1)
    else:
        assert np.all(fold_plus == prefs.fold)
        assert np.all(fold_plus == (table.slot[prefs.minus] >= 4))
    assert np.all(prefs.gap >= options["epsilon"] - TOL) and np.all(prefs.gap > 0)
    assert np.all(prefs.support >= options["min_support"])
    if options["max_per_fold"] is not None:
        _, counts = np.unique(np.stack([prefs.group, prefs.fold]), axis=1, return_counts=True)
        pools = 1 if options["evidence"] == "leave_pair_out" else 2  # one pool: both budgets
        assert np.all(counts <= options["max_per_fold"] * (2 // pools))
    s = prefs.stats
    assert s["preferences"] == len(prefs)
    assert s["candidate_pairs"] == (
        s["dropped_no_support"] + s["dropped_below_epsilon"] + s["dropped_allocation"] + len(prefs)
    )
    assert s["exact"] + s["coarse"] == len(prefs)


@settings(max_examples=80, deadline=None)
@given(tables(), st.data())
def test_leave_pair_out_labels_ignore_the_pairs_own_outcomes(table, data):
    # Every candidate pair of every rule level: flipping the outcome of either of its two
    # trajectories leaves its evidence (support, u of both actions) unchanged.
    from mcgpo.preferences.matching import decisions, level_keys, level_pairs
    from mcgpo.preferences.options import PreferenceOptions

    opts = PreferenceOptions(evidence="leave_pair_out")
    dec = decisions(table, opts)
    for _, key, action in level_keys(table, dec, opts.matching):
        before = level_pairs(dec, key, action, opts.evidence)
        if len(before.a) == 0:
            continue
        p = data.draw(st.integers(0, len(before.a) - 1))
        own = [int(table.traj[dec.row[before.a[p]]]), int(table.traj[dec.row[before.b[p]]])]
        flip = data.draw(st.sets(st.sampled_from(own), min_size=1))
        flipped = np.where(np.isin(table.traj, list(flip)), 1.0 - table.success, table.success)
        dec2 = decisions(table.with_columns(success=flipped), opts)
        after = level_pairs(dec2, key, action, opts.evidence)
        assert (after.a[p], after.b[p]) == (before.a[p], before.b[p])
        for name in ("support_a", "support_b", "value_a", "value_b"):
            assert getattr(after, name)[p] == getattr(before, name)[p]
