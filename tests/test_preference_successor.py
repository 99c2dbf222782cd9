"""Successor-state support and inverse-variance blending of the rule levels (ours, not the
paper's; docs/algorithms/mcgpo.md detail 12b): hand-built groups with the expected values
derived in comments, the held-out property of each evidence mode, and reductions to the
defaults. The loop reference that the vectorised code must equal on random tables is
``loop_preferences`` in tests/test_preferences_properties.py (options ``support``, ``blend``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mcgpo
from mcgpo.preferences.blending import inverse_variance_weight
from mcgpo.preferences.build import _evidence
from mcgpo.preferences.matching import decisions
from mcgpo.preferences.options import PreferenceOptions
from mcgpo.steps import StepTable
from test_preferences_properties import as_list, tables


def group(trajectories: list[tuple[int, float, list[tuple[str, str, bool]]]]) -> StepTable:
    """One group; per trajectory (slot, success, [(state, action, valid) per turn]). The
    coarse state drops a trailing instance number ("room 1" -> "room")."""
    rows = []
    for traj, (slot, success, turns) in enumerate(trajectories):
        for turn, (state, action, valid) in enumerate(turns):
            rows.append({
                "group": 0, "traj": traj, "slot": slot, "turn": turn, "reward": 0.0,
                "done": turn == len(turns) - 1, "success": success, "score": success,
                "action": action, "action_valid": valid, "anchor": state, "state": state,
                "state_coarse": state.split(" ")[0], "progress": "", "enabled": "",
            })  # fmt: skip
    return StepTable.from_records(rows)


# rows 0-11: slot 0 (turns 0, 1), slot 1, slot 4, slot 5, slot 6, slot 7
SUCCESSOR_GROUP = [
    (0, 1.0, [("room", "a", True), ("A", "stop", True)]),  # a leads to A
    (1, 0.0, [("room", "b", True), ("B", "stop", True)]),  # b leads to B
    (4, 1.0, [("room", "a", True), ("A", "stop", True)]),
    (5, 0.0, [("room", "c", True), ("A", "stop", True)]),  # c also leads to A
    (6, 0.0, [("room", "d", True), ("B", "stop", True)]),  # d also leads to B
    (7, 0.0, [("room", "d", True), ("B", "stop", False)]),  # an invalid turn still visits B
]


def test_successor_support_counts_the_trajectories_that_reached_the_next_state():
    # Direct evidence (the default): fold 0's pair (slot 0 "a", slot 1 "b") at "room" has
    # a: slot 4 (1/1) but no fold-1 trajectory took b: unsupported; fold 1's actions c and d
    # were taken by no fold-0 trajectory: unsupported. The coarse key is the same ("room").
    # No preference.
    # Successor support, fold 0's pair (0, 1), evidence = fold 1 (slots 4-7):
    #   a: took a at room {4} or was in A (a's successor, row 1's state) {4, 5} -> 1/2
    #   b: took b {} or was in B {6, 7} (slot 7's turn at B is invalid: a visit all the
    #      same) -> 0/2; gap 1/2, n = 2, c = 1/2 * 2/(2 + 1) * q_exact = 1/3; row 0 > row 2
    # fold 1's pairs at room, evidence = fold 0 (slot 0 in A, slot 1 in B):
    #   a (slot 4) -> A: {0} -> 1/1; c (slot 5) -> A: {0} -> 1/1; d (slots 6, 7) -> B: {1}
    #   -> 0/1. (4, 5): gap 0, dropped; (4, 6), (4, 7), (5, 6), (5, 7): gap 1, n = 1,
    #   c = 1 * 1/2. Allocation walks them by slots: (4, 6) kept, (4, 7) and (5, 6) reuse a
    #   row, (5, 7) kept. Rows: slot 4 = 4, slot 5 = 6, slot 6 = 8, slot 7 = 10.
    # The turn-1 rows (A and B) all take "stop": no pair there.
    table = group(SUCCESSOR_GROUP)
    assert len(mcgpo.build_preferences(table)) == 0
    prefs = mcgpo.build_preferences(table, support="successor")
    assert list(zip(prefs.plus.tolist(), prefs.minus.tolist())) == [(0, 2), (4, 8), (6, 10)]
    np.testing.assert_allclose(prefs.gap, [0.5, 1.0, 1.0])
    np.testing.assert_allclose(prefs.weight, [1 / 3, 0.5, 0.5])
    assert prefs.support.tolist() == [2, 1, 1] and prefs.fold.tolist() == [0, 1, 1]
    assert prefs.stats["dropped_below_epsilon"] == 1  # (4, 5)


def test_successor_support_of_a_last_turn_is_the_direct_evidence():
    # One-turn trajectories: no decision has a next turn, so the evidence is the direct one
    # and the preferences are the default's. Slots 0 "a" (y 1), 1 "b" (y 0) in fold 0;
    # fold 1: 4 "a" (1), 5 "b" (0): each fold's pair is labelled a = 1/1, b = 0/1 by the
    # other fold: gap 1, n = 1, c = 1/2.
    table = group([(0, 1.0, [("room", "a", True)]), (1, 0.0, [("room", "b", True)]),
                   (4, 1.0, [("room", "a", True)]), (5, 0.0, [("room", "b", True)])])  # fmt: skip
    direct = mcgpo.build_preferences(table)
    successor = mcgpo.build_preferences(table, support="successor")
    assert as_list(successor) == as_list(direct) and len(direct) == 2
    np.testing.assert_allclose(successor.weight, [0.5, 0.5])


# w = 1/v, v = p (1 - p) / (n + 3), p = (k + 1) / (n + 2):
#   u = 1, n = 1: p = 2/3, v = (2/3)(1/3)/4 = 1/18 -> 18;  u = 0, n = 1: p = 1/3 -> 18
#   u = 1/2, n = 2: p = 2/4, v = (1/4)/5 = 1/20 -> 20;  u = 1, n = 4: p = 5/6,
#   v = (5/6)(1/6)/7 = 5/252 -> 50.4
@pytest.mark.parametrize(
    ("u", "n", "expected"), [(1.0, 1, 18.0), (0.0, 1, 18.0), (0.5, 2, 20.0), (1.0, 4, 50.4)]
)
def test_inverse_variance_weight_closed_forms(u, n, expected):
    assert inverse_variance_weight(np.array([u]), np.array([n]))[0] == pytest.approx(expected)


# rows: slot 0 (0), 1 (1), 4 (2), 5 (3), 6 (4), 7 (5); "room 1" and "room 2" share the
# coarse state "room"
BLEND_GROUP = [
    (0, 1.0, [("room 1", "a", True)]),
    (1, 0.0, [("room 1", "b", True)]),
    (4, 1.0, [("room 1", "a", True)]),
    (5, 0.0, [("room 1", "b", True)]),
    (6, 0.0, [("room 2", "a", True)]),
    (7, 1.0, [("room 2", "b", True)]),
]


def test_inverse_variance_blends_the_exact_and_the_coarse_estimate():
    # fold 0's pair (0 "a", 1 "b"), evidence = fold 1:
    #   exact "room 1": a {4} 1/1, b {5} 0/1;  coarse "room": a {4, 6} 1/2, b {5, 7} 1/2
    #   first rule wins: exact, gap 1, n = 1, c = 1 * 1/2 = 1/2
    #   blended (weights above): a = 1 + 20 (1/2 - 1) / (18 + 20) = 14/19,
    #   b = 0 + 20 (1/2 - 0) / 38 = 5/19; gap 9/19; n = min(max(1, 2), max(1, 2)) = 2;
    #   level stays "exact" (q = 1): c = 9/19 * 2/3 = 6/19
    # fold 1, evidence = fold 0 (both at "room 1", so exact and coarse agree: a 1/1, b 0/1):
    #   (4 "a", 5 "b") exact: gap 1, c = 1/2; (6 "a", 7 "b") only coarse (no fold-0 visit
    #   of "room 2"): gap 1, c = 1 * 1/2 * q_coarse = 1/4; the coarse cross pairs (4, 7),
    #   (5, 6) reuse rows. The same under both rules (one level, or levels that agree).
    table = group(BLEND_GROUP)
    first = mcgpo.build_preferences(table)
    blended = mcgpo.build_preferences(table, blend="inverse_variance")
    for prefs in (first, blended):
        assert list(zip(prefs.plus.tolist(), prefs.minus.tolist())) == [(0, 1), (2, 3), (4, 5)]
        assert prefs.level.tolist() == ["exact", "exact", "coarse"]
    np.testing.assert_allclose(first.gap, [1.0, 1.0, 1.0])
    np.testing.assert_allclose(first.weight, [0.5, 0.5, 0.25])
    np.testing.assert_allclose(blended.gap, [9 / 19, 1.0, 1.0])
    np.testing.assert_allclose(blended.weight, [6 / 19, 0.5, 0.25])
    assert blended.support.tolist() == [2, 1, 1]


def test_new_modes_are_known_options():
    table = group(BLEND_GROUP)
    with pytest.raises(ValueError, match="support"):
        mcgpo.build_preferences(table, support="next_state")
    with pytest.raises(ValueError, match="inverse_variance"):
        mcgpo.build_preferences(table, blend="mean")


VARIANT = st.fixed_dictionaries({
    "support": st.sampled_from(["direct", "successor"]),
    "blend": st.sampled_from(["first", "inverse_variance"]),
    "weighting": st.sampled_from(["evidence", "beta"]),
    "coarse_actions": st.sampled_from(["coarse", "exact"]),
})  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(tables(), st.data(), VARIANT)
def test_opposite_fold_labels_ignore_the_own_folds_outcomes(table, data, options):
    # opposite_fold: flipping the outcomes of trajectories of a fold (the ones its own
    # labels must not see) never changes that fold's preferences
    fold = data.draw(st.sampled_from([0, 1]))
    before = mcgpo.build_preferences(table, **options)
    own = sorted(set(table.traj[(table.slot >= 4) == bool(fold)].tolist()))
    flip = data.draw(st.sets(st.sampled_from(own)) if own else st.just(set()))
    success = np.where(np.isin(table.traj, list(flip)), 1.0 - table.success, table.success)
    after = mcgpo.build_preferences(table.with_columns(success=success), **options)
    assert [p for p in as_list(after) if p[1] == fold] == [
        p for p in as_list(before) if p[1] == fold
    ]


@settings(max_examples=80, deadline=None)
@given(tables(), st.data(), VARIANT)
def test_leave_pair_out_labels_ignore_the_pairs_own_outcomes(table, data, options):
    # leave_pair_out: flipping either candidate's outcome leaves every level's evidence of
    # that pair (support and values, blended or not) unchanged
    opts = PreferenceOptions(evidence="leave_pair_out", **options)
    dec = decisions(table, opts)
    before = _evidence(table, dec, opts)
    if len(before.a) == 0:
        return
    p = data.draw(st.integers(0, len(before.a) - 1))
    own = [int(table.traj[dec.row[before.a[p]]]), int(table.traj[dec.row[before.b[p]]])]
    flip = data.draw(st.sets(st.sampled_from(own), min_size=1))
    flipped = np.where(np.isin(table.traj, list(flip)), 1.0 - table.success, table.success)
    after = _evidence(table.with_columns(success=flipped), dec, opts)
    assert (after.a[p], after.b[p], after.level[p]) == (before.a[p], before.b[p], before.level[p])
    for name in ("support_a", "support_b", "value_a", "value_b"):
        assert getattr(after, name)[p] == getattr(before, name)[p]


@settings(max_examples=40, deadline=None)
@given(tables(), st.sampled_from(["direct", "successor"]))
def test_one_level_blended_is_first_rule_wins(table, support):
    # rubric_only matching has a single rule level: blending has nothing to mix
    first = mcgpo.build_preferences(table, matching="rubric_only", support=support)
    blended = mcgpo.build_preferences(
        table, matching="rubric_only", support=support, blend="inverse_variance"
    )
    assert as_list(blended) == as_list(first) and blended.stats == first.stats
