"""Hand-built groups, one per MCGPO rule, with the expected preferences derived in comments.

Conventions used in every test (unless a test says otherwise): N = 8, fold 0 =
slots 0-3, fold 1 = slots 4-7, m = 1, epsilon = 0.25, kappa = 1, q_exact = 1,
q_coarse = 0.5, at most 2 preferences per fold. ``build`` pins kappa and q_coarse, the values
the derivations were made with (they are the defaults again, after a one-seed sweep had set
kappa = 0, q_coarse = 1 for a while); ``test_defaults_keep_the_paper_components_on`` checks
the current defaults. A step is written (state, action); the coarse state drops the digits
("sink 1" -> "sink"). Slots that play no part are left out: a group may hold fewer than N
trajectories (folds are by slot).
"""

from __future__ import annotations

import numpy as np
import pytest

import mcgpo
from mcgpo.preferences import PreferenceOptions, Preferences
from mcgpo.steps import StepTable


def build(table, **options):
    """build_preferences with the values the hand derivations use (kappa = 1, q_coarse = 0.5)."""
    return mcgpo.build_preferences(table, **{"kappa": 1.0, "q_coarse": 0.5, **options})


def coarse(state: str) -> str:
    return "".join(ch for ch in state if not ch.isdigit()).strip()


def group_table(trajs: list[tuple], group: int = 0, first_traj: int = 0) -> StepTable:
    """trajs: (slot, success, steps[, extra]); a step is (state, action) or a dict of fields."""
    rows = []
    for k, spec in enumerate(trajs):
        slot, success, steps = spec[:3]
        extra = spec[3] if len(spec) > 3 else {}
        for turn, step in enumerate(steps):
            fields = step if isinstance(step, dict) else {"state": step[0], "action": step[1]}
            state = fields["state"]
            rows.append(
                {
                    "group": group,
                    "traj": first_traj + k,
                    "slot": slot,
                    "turn": turn,
                    "reward": 10.0 * success if turn == len(steps) - 1 else 0.0,
                    "done": turn == len(steps) - 1,
                    "success": float(success),
                    "score": float(success),
                    "action": fields["action"],
                    "action_valid": fields.get("valid", True),
                    "anchor": state,
                    "state": state,
                    "state_coarse": fields.get("coarse", coarse(state)),
                    "progress": fields.get("progress", ""),
                    "enabled": fields.get("enabled", ""),
                    **extra,
                }
            )
    return StepTable.from_records(rows)


def row_of(table: StepTable, slot: int, turn: int, group: int = 0) -> int:
    hit = np.flatnonzero((table.slot == slot) & (table.turn == turn) & (table.group == group))
    assert len(hit) == 1
    return int(hit[0])


def as_tuples(table: StepTable, prefs: Preferences) -> list[tuple]:
    """(plus (slot, turn), minus (slot, turn), weight, level) per preference."""
    return [
        (
            (int(table.slot[p]), int(table.turn[p])),
            (int(table.slot[m]), int(table.turn[m])),
            round(float(w), 12),
            str(lv),
        )
        for p, m, w, lv in zip(prefs.plus, prefs.minus, prefs.weight, prefs.level)
    ]


# --------------------------------------------------------------------------- resolution rules
def test_exact_match():
    # Fold 0: slots 0 and 1 first visit "sink 1" and take x / y  -> one candidate pair.
    # Fold 1 labels it: slot 4 took x at "sink 1" and won, slot 5 took y there and failed.
    #   exact rule: S(x) = {4}, S(y) = {5}, both >= m = 1 -> qualifies.
    #   u(x) = 1, u(y) = 0, Delta_u = 1 >= 0.25; n = min(1, 1) = 1
    #   c = 1 * 1/(1+1) * q_exact = 0.5, x preferred: plus = (slot 0, turn 0).
    # Fold 1's own pair (4: x, 5: y) is labelled by slots 0, 1, which both failed:
    #   Delta_u = 0 -> dropped below epsilon.
    t = group_table(
        [
            (0, 0, [("sink 1", "x")]),
            (1, 0, [("sink 1", "y")]),
            (4, 1, [("sink 1", "x")]),
            (5, 0, [("sink 1", "y")]),
        ]
    )
    prefs = build(t)
    assert as_tuples(t, prefs) == [((0, 0), (1, 0), 0.5, "exact")]
    assert prefs.group.tolist() == [0] and prefs.fold.tolist() == [0]
    assert prefs.gap.tolist() == [1.0] and prefs.support.tolist() == [1]
    assert prefs.stats["candidate_pairs"] == 2
    assert prefs.stats["dropped_below_epsilon"] == 1
    assert prefs.stats["exact"] == 1 and prefs.stats["coarse"] == 0


def test_exact_unsupported_then_coarse():
    # Fold 0 meets at "sink 1" (x vs y); fold 1 was never at "sink 1" but at "sink 2",
    # whose coarse state "sink" is the same.
    #   exact rule: S_exact(x) = {} -> does not qualify.
    #   coarse rule: S(x) = {4} (won), S(y) = {5} (failed) -> qualifies.
    #   Delta_u = 1, n = 1, c = 1 * 1/2 * q_coarse(0.5) = 0.25; plus = slot 0.
    # Fold 1 (x vs y at "sink 2") mirrors it: labelled by fold 0 at coarse "sink":
    #   u(x) = y_0 = 1, u(y) = y_1 = 0 -> plus = slot 4, c = 0.25, coarse.
    t = group_table(
        [
            (0, 1, [("sink 1", "x")]),
            (1, 0, [("sink 1", "y")]),
            (4, 1, [("sink 2", "x")]),
            (5, 0, [("sink 2", "y")]),
        ]
    )
    prefs = build(t)
    assert as_tuples(t, prefs) == [
        ((0, 0), (1, 0), 0.25, "coarse"),
        ((4, 0), (5, 0), 0.25, "coarse"),
    ]
    assert prefs.fold.tolist() == [0, 1]
    assert prefs.stats["coarse"] == 2 and prefs.stats["exact"] == 0


def test_neither_rule_supported_is_dropped():
    # Fold 0: x vs y at "sink 1". Fold 1 took only x (at "sink 2"): S(y) = {} at both the
    # exact key "sink 1" and the coarse key "sink" -> no rule qualifies -> dropped.
    # Fold 1 has no pair (both took x).
    t = group_table(
        [
            (0, 1, [("sink 1", "x")]),
            (1, 0, [("sink 1", "y")]),
            (4, 1, [("sink 2", "x")]),
            (5, 0, [("sink 2", "x")]),
        ]
    )
    prefs = build(t)
    assert len(prefs) == 0
    assert prefs.stats["candidate_pairs"] == 1
    assert prefs.stats["dropped_no_support"] == 1
    assert prefs.stats["dropped_below_epsilon"] == 0
    assert prefs.stats["share_groups_without_preferences"] == 1.0


def test_supported_exact_below_epsilon_is_not_retried_coarse():
    # epsilon = 0.6. Fold 0: x (slot 0) vs y (slot 1) at "sink 1".
    # Fold 1: slot 4 x at "sink 1" won, slot 6 x at "sink 1" failed, slot 5 y at "sink 1"
    # won, slot 7 x at "sink 2" failed.
    #   exact rule: S(x) = {4, 6}, S(y) = {5} -> qualifies; u(x) = 1/2, u(y) = 1,
    #   |Delta_u| = 0.5 < 0.6 -> dropped.
    #   (The coarse rule would have given S(x) = {4, 6, 7}: u(x) = 1/3, |Delta_u| = 2/3 >= 0.6,
    #   but the rule is fixed before the gap is seen: no retry.)
    # Fold 1 candidates, labelled by fold 0 (both failed, so every gap is 0):
    #   exact "sink 1": (4, 5), (5, 6); coarse only: (5, 7) -> 3 pairs, all below epsilon.
    t = group_table(
        [
            (0, 0, [("sink 1", "x")]),
            (1, 0, [("sink 1", "y")]),
            (4, 1, [("sink 1", "x")]),
            (5, 1, [("sink 1", "y")]),
            (6, 0, [("sink 1", "x")]),
            (7, 0, [("sink 2", "x")]),
        ]
    )
    prefs = build(t, epsilon=0.6)
    assert len(prefs) == 0
    assert prefs.stats["candidate_pairs"] == 4
    assert prefs.stats["dropped_below_epsilon"] == 4
    assert prefs.stats["dropped_no_support"] == 0
    # Control: make the exact rule unsupported (fold 1 moves from "sink 1" to "sink 3"); the
    # coarse rule then labels fold 0's pair: u(x) = 1/3 (slots 4, 6, 7), u(y) = 1 (slot 5),
    # Delta_u = 2/3 >= 0.6, n = min(3, 1) = 1, c = 2/3 * 1/2 * 0.5 = 1/6, y preferred.
    moved = t.with_columns(
        state=np.where(
            t.slot >= 4, np.where(t.state == "sink 1", "sink 3", t.state), t.state
        ).astype(object)
    )
    prefs = build(moved, epsilon=0.6)
    fold0 = [p for p in as_tuples(moved, prefs) if p[0][0] < 4]
    assert fold0 == [((1, 0), (0, 0), round(1 / 6, 12), "coarse")]


# --------------------------------------------------------------------------- matching rules
def test_first_visit_rule():
    # Slot 0 is at "sink 1" at turn 0 (x) and again at turn 1 (y): only turn 0 counts.
    # Slot 1 first tries an invalid action at "sink 1" (not eligible), then takes y at turn 1.
    #   fold-0 candidate: (slot 0, turn 0, x) vs (slot 1, turn 1, y).
    # Fold 1: slot 4 takes x at "sink 1" (turn 0) and y there at turn 1, and fails; slot 5
    # takes y and wins. First visits: slot 4 -> x, slot 5 -> y, so S(x) = {4}, S(y) = {5}:
    #   u(x) = 0, u(y) = 1, Delta_u = 1, n = 1, c = 0.5; plus = (1, 1), minus = (0, 0).
    #   (Counting slot 4's revisit would give S(y) = {4, 5}, u(y) = 1/2 and c = 0.25.)
    # Fold 1's pair (4: x, 5: y) is labelled by slots 0 and 1, which both failed: dropped.
    t = group_table(
        [
            (0, 0, [("sink 1", "x"), ("sink 1", "y")]),
            (1, 0, [{"state": "sink 1", "action": "z", "valid": False}, ("sink 1", "y")]),
            (4, 0, [("sink 1", "x"), ("sink 1", "y")]),
            (5, 1, [("sink 1", "y")]),
        ]
    )
    prefs = build(t)
    assert as_tuples(t, prefs) == [((1, 1), (0, 0), 0.5, "exact")]
    # 7 rows, 6 eligible (one invalid); unmatched: slot 0 turn 1 and slot 4 turn 1 (revisits)
    assert prefs.stats["rows_eligible"] == 6
    assert prefs.stats["dropped_no_match"] == 2


def test_context_key_includes_progress_and_enabled():
    # Same state, different rubric progress C: not the same context under joint matching.
    # Evidence exists for both actions under both C values, so the only obstacle is the key.
    steps_0 = [{"state": "sink 1", "action": "x", "progress": "found"}]
    steps_1 = [{"state": "sink 1", "action": "y", "progress": ""}]
    t = group_table(
        [
            (0, 0, steps_0),
            (1, 0, steps_1),
            (4, 1, [{"state": "sink 1", "action": "x", "progress": "found"}]),
            (5, 0, [{"state": "sink 1", "action": "y", "progress": ""}]),
            (6, 1, [{"state": "sink 1", "action": "x", "progress": ""}]),
            (7, 0, [{"state": "sink 1", "action": "y", "progress": "found"}]),
        ]
    )
    # joint: keys ("sink 1", "found") and ("sink 1", ""): fold 0 has no pair, fold 1 has
    # (4: x, 7: y) at "found" and (5: y, 6: x) at "" but fold 0 supports neither pair fully
    # (fold 0 has only x at "found" and only y at "") -> nothing.
    assert len(build(t)) == 0
    # state_only: key "sink 1". Fold 0 pair (0: x, 1: y); fold 1 first visits: x by 4, 6
    # (both won), y by 5, 7 (both failed): u(x) = 1, u(y) = 0, n = 2, c = 1 * 2/3 * 1.
    # Fold 1 pairs (4,5), (4,7), (5,6), (6,7) are labelled by slots 0, 1 (both failed): gap 0.
    prefs = build(t, matching="state_only")
    assert as_tuples(t, prefs) == [((0, 0), (1, 0), round(2 / 3, 12), "exact")]


def test_rubric_only_matches_across_states():
    # rubric_only keys on (C, F) alone: "sink 1" and "desk 2" with the same C/F match.
    t = group_table(
        [
            (0, 0, [{"state": "sink 1", "action": "x", "progress": "held"}]),
            (1, 0, [{"state": "desk 2", "action": "y", "progress": "held"}]),
            (4, 0, [{"state": "shelf 3", "action": "x", "progress": "held"}]),
            (5, 1, [{"state": "bed 1", "action": "y", "progress": "held"}]),
        ]
    )
    # joint: no two rows share a state -> nothing.
    assert len(build(t)) == 0
    # rubric_only: fold 0 (0: x, 1: y) labelled u(x) = 0 (slot 4), u(y) = 1 (slot 5):
    # c = 1 * 1/2 * q_exact = 0.5 (one rule level only, reported as "exact"); y preferred.
    prefs = build(t, matching="rubric_only")
    assert as_tuples(t, prefs) == [((1, 0), (0, 0), 0.5, "exact")]


def test_errored_trajectories_are_skipped():
    # Slot 5 (the only y supporter in fold 1) is errored: its rows neither support nor
    # form pairs, so fold 0's pair (x vs y) loses its y support and is dropped.
    t = group_table(
        [
            (0, 0, [("sink 1", "x")]),
            (1, 0, [("sink 1", "y")]),
            (4, 1, [("sink 1", "x")]),
            (5, 0, [("sink 1", "y")], {"errored": True}),
        ]
    )
    prefs = build(t)
    assert len(prefs) == 0
    assert prefs.stats["rows_eligible"] == 3
    assert prefs.stats["dropped_no_support"] == 1


# --------------------------------------------------------------------------- allocation rules
def test_earliest_comparison_per_sibling_pair():
    # Slots 0 and 1 meet at "sink" (turn 0: x vs y) and at "desk" (turn 1: p vs q).
    # Fold 1: slot 4: sink x, desk p, won; slot 5: sink y, desk q, failed; slots 6 / 7 visit
    # only "desk" and take p (won) / q (failed).
    #   sink: u(x) = 1, u(y) = 0, n = 1 -> c = 1/2
    #   desk: u(p) = 1 (4, 6), u(q) = 0 (5, 7), n = 2 -> c = 2/3 (heavier, but later)
    # The sibling pair (0, 1) keeps only its earliest comparison: sink, c = 0.5.
    # Fold 1 pairs: sink (4,5); desk (4,5), (4,7), (5,6), (6,7): labelled by slots 0 and 1,
    # which both failed -> 5 pairs below epsilon. Candidates: 2 + 5 = 7; allocation drops 1.
    t = group_table(
        [
            (0, 0, [("sink", "x"), ("desk", "p")]),
            (1, 0, [("sink", "y"), ("desk", "q")]),
            (4, 1, [("sink", "x"), ("desk", "p")]),
            (5, 0, [("sink", "y"), ("desk", "q")]),
            (6, 1, [("desk", "p")]),
            (7, 0, [("desk", "q")]),
        ]
    )
    prefs = build(t)
    assert as_tuples(t, prefs) == [((0, 0), (1, 0), 0.5, "exact")]
    assert prefs.stats["candidate_pairs"] == 7
    assert prefs.stats["dropped_below_epsilon"] == 5
    assert prefs.stats["dropped_allocation"] == 1


def test_earliest_is_by_min_turn_then_max_turn():
    # Slots 0 and 1 meet at "sink" (turns 0 and 3) and at "desk" (turns 1 and 1).
    # min turn: sink 0 < desk 1 -> sink wins even though its max turn (3) is later.
    t = group_table(
        [
            (0, 0, [("sink", "x"), ("desk", "p")]),
            (1, 0, [("a", "w"), ("desk", "q"), ("b", "w"), ("sink", "y")]),
            (4, 1, [("sink", "x"), ("desk", "p")]),
            (5, 0, [("sink", "y"), ("desk", "q")]),
        ]
    )
    prefs = build(t)
    fold0 = [p for p in as_tuples(t, prefs) if p[0][0] < 4]
    assert fold0 == [((0, 0), (1, 3), 0.5, "exact")]


def test_at_most_two_per_fold():
    # Fold 0 has three comparisons on disjoint rows from three sibling pairs:
    #   A: (0, 1) at turn 0 x vs y;  B: (2, 3) at turn 0 p vs q;  C: (0, 2) at turn 1 r vs s.
    # Fold 1: slot 4 takes x, p, r at A, B, C and wins; slot 5 takes y, q, s and fails:
    #   every gap is 1, n = 1, c = 0.5, winner = the first-listed action.
    # Allocation walks (min turn, max turn, slots): A (0,0,0,1), B (0,0,2,3), C (1,1,0,2);
    # the cap of 2 keeps A and B. Without the cap C is kept too.
    # Fold 1's pairs are labelled by fold 0, which all failed: gap 0, dropped.
    t = group_table(
        [
            (0, 0, [("A", "x"), ("C", "r")]),
            (1, 0, [("A", "y")]),
            (2, 0, [("B", "p"), ("C", "s")]),
            (3, 0, [("B", "q")]),
            (4, 1, [("A", "x"), ("B", "p"), ("C", "r")]),
            (5, 0, [("A", "y"), ("B", "q"), ("C", "s")]),
        ]
    )
    prefs = build(t)
    assert as_tuples(t, prefs) == [
        ((0, 0), (1, 0), 0.5, "exact"),
        ((2, 0), (3, 0), 0.5, "exact"),
    ]
    assert prefs.stats["dropped_allocation"] == 1
    uncapped = build(t, max_per_fold=None)
    assert as_tuples(t, uncapped)[2] == ((0, 1), (2, 1), 0.5, "exact")


def test_each_row_used_once():
    # At "A" slots 0..3 take x, y, x, y: candidate pairs (0,1), (0,3), (1,2), (2,3), all at
    # turn 0. Fold 1: slot 4 x won, slot 5 y failed -> every pair has gap 1, x preferred.
    # Walk order by slots: (0,1) kept; (0,3) reuses slot 0's row; (1,2) reuses slot 1's;
    # (2,3) kept. max_per_fold=None so the cap plays no part: 2 kept, 2 dropped.
    t = group_table(
        [
            (0, 0, [("A", "x")]),
            (1, 0, [("A", "y")]),
            (2, 0, [("A", "x")]),
            (3, 0, [("A", "y")]),
            (4, 1, [("A", "x")]),
            (5, 0, [("A", "y")]),
        ]
    )
    prefs = build(t, max_per_fold=None)
    assert as_tuples(t, prefs) == [
        ((0, 0), (1, 0), 0.5, "exact"),
        ((2, 0), (3, 0), 0.5, "exact"),
    ]
    used = np.concatenate([prefs.plus, prefs.minus])
    assert len(np.unique(used)) == len(used)
    # fold 1: (4,5) labelled by fold 0: u(x) = 0 (slots 0, 2), u(y) = 0 -> below epsilon
    assert prefs.stats["dropped_allocation"] == 2


# --------------------------------------------------------------------------- folds and modes
SWAP = [
    (0, 1, [("A", "x")]),
    (1, 0, [("A", "y")]),
    (4, 0, [("A", "x")]),
    (5, 1, [("A", "y")]),
]


def test_fold_swap():
    # Fold 0's pair is labelled by fold 1: u(x) = y_4 = 0, u(y) = y_5 = 1 -> y (slot 1)
    # preferred although slot 0 (x) won: a row's own outcome never labels it.
    # Fold 1's pair is labelled by fold 0: u(x) = y_0 = 1, u(y) = y_1 = 0 -> slot 4 preferred.
    t = group_table(SWAP)
    prefs = build(t)
    assert as_tuples(t, prefs) == [
        ((1, 0), (0, 0), 0.5, "exact"),
        ((4, 0), (5, 0), 0.5, "exact"),
    ]
    assert prefs.fold.tolist() == [0, 1]


def test_evidence_modes():
    t = group_table(SWAP)
    # same_fold: fold 0 labelled by its own slots: u(x) = y_0 = 1, u(y) = y_1 = 0 -> slot 0;
    # fold 1: u(x) = y_4 = 0, u(y) = y_5 = 1 -> slot 5. n = 1, c = 0.5.
    same = build(t, evidence="same_fold")
    assert as_tuples(t, same) == [((0, 0), (1, 0), 0.5, "exact"), ((5, 0), (4, 0), 0.5, "exact")]
    # pooled: u(x) = (1 + 0)/2, u(y) = (0 + 1)/2 -> gap 0 -> nothing
    assert len(build(t, evidence="pooled")) == 0


def test_uniform_weighting_keeps_only_q_level():
    # Same pairs as test_fold_swap; c = q_level regardless of gap and support.
    t = group_table(SWAP)
    prefs = build(t, weighting="uniform", q_exact=0.8)
    assert prefs.weight.tolist() == [0.8, 0.8]


def test_weight_formula_with_kappa():
    # test_fold_swap with kappa = 3: c = |Delta_u| * n/(n + kappa) * q = 1 * 1/4 * 1 = 0.25
    t = group_table(SWAP)
    assert build(t, kappa=3.0).weight.tolist() == [0.25, 0.25]


# --------------------------------------------------------------------------- coarse actions
MUGS = [
    # Fold 0 and fold 1 alike: one sibling at "countertop 1" takes mug 1 there and wins, the
    # other at "countertop 2" takes mug 2 there and fails. The exact states differ; the
    # coarse state "countertop" is shared.
    (0, 1, [("countertop 1", "take mug 1 from countertop 1")]),
    (1, 0, [("countertop 2", "take mug 2 from countertop 2")]),
    (4, 1, [("countertop 1", "take mug 1 from countertop 1")]),
    (5, 0, [("countertop 2", "take mug 2 from countertop 2")]),
]


def test_coarse_actions_drop_instance_numbers_at_the_coarse_level():
    # No exact candidates (different exact states). At the coarse key "countertop":
    # coarse_actions="coarse" (default): both actions read "take mug from countertop", the
    #   same action -> no candidate pair at all; the four rows are unmatched.
    t = group_table(MUGS)
    prefs = build(t)
    assert len(prefs) == 0
    assert prefs.stats["candidate_pairs"] == 0 and prefs.stats["dropped_no_match"] == 4
    # coarse_actions="exact": "take mug 1 ..." vs "take mug 2 ..." differ -> a coarse pair in
    #   each fold, labelled by the other: S(mug 1) = {4} won, S(mug 2) = {5} failed,
    #   Delta_u = 1, n = 1, c = 1 * 1/2 * q_coarse(0.5) = 0.25 -> plus = slot 0; fold 1 mirrors
    #   it (u(mug 1) = y_0 = 1, u(mug 2) = y_1 = 0) -> plus = slot 4.
    prefs = build(t, coarse_actions="exact")
    assert as_tuples(t, prefs) == [
        ((0, 0), (1, 0), 0.25, "coarse"),
        ((4, 0), (5, 0), 0.25, "coarse"),
    ]


def test_coarse_actions_pool_evidence_across_instances():
    # Fold 0 meets at "countertop 1": take mug 1 (slot 0, won) vs go to fridge 1 (slot 1,
    # failed). Fold 1 meets at "countertop 2": take mug 2 (slot 4, won) vs go to fridge 1
    # (slot 5, failed). No exact evidence: each fold's exact state is absent from the other.
    # coarse_actions="coarse": the coarse key "countertop" and the actions "take mug from
    #   countertop" / "go to fridge": fold 0's pair is labelled by S(take mug ...) = {4} (won)
    #   and S(go to fridge) = {5} (failed): Delta_u = 1, n = 1, c = 1 * 1/2 * 0.5 = 0.25,
    #   plus = slot 0; fold 1 mirrors it with y_0 = 1, y_1 = 0: plus = slot 4.
    t = group_table(
        [
            (0, 1, [("countertop 1", "take mug 1 from countertop 1")]),
            (1, 0, [("countertop 1", "go to fridge 1")]),
            (4, 1, [("countertop 2", "take mug 2 from countertop 2")]),
            (5, 0, [("countertop 2", "go to fridge 1")]),
        ]
    )
    assert as_tuples(t, build(t)) == [
        ((0, 0), (1, 0), 0.25, "coarse"),
        ((4, 0), (5, 0), 0.25, "coarse"),
    ]
    # coarse_actions="exact": nobody in fold 1 took "take mug 1 from countertop 1" (nor anyone
    #   in fold 0 "take mug 2 from countertop 2"): both pairs lack support at both levels.
    prefs = build(t, coarse_actions="exact")
    assert len(prefs) == 0 and prefs.stats["dropped_no_support"] == 2


def test_group_size_and_split_options():
    # N = 4: folds are slots {0, 1} and {2, 3}; the SWAP layout moved to slots 0, 1, 2, 3.
    t = group_table(
        [(0, 1, [("A", "x")]), (1, 0, [("A", "y")]), (2, 0, [("A", "x")]), (3, 1, [("A", "y")])]
    )
    prefs = build(t, group_size=4)
    assert as_tuples(t, prefs) == [((1, 0), (0, 0), 0.5, "exact"), ((2, 0), (3, 0), 0.5, "exact")]
    # fold_split=1: fold 0 = {slot 0} has no pair; fold 1 = {1, 2, 3}: pairs (1,2), (2,3)
    # labelled by slot 0 alone, which only supports x -> no support.
    prefs = build(t, group_size=4, fold_split=1)
    assert len(prefs) == 0 and prefs.stats["dropped_no_support"] == 2


def test_several_groups_and_row_indices():
    # Two copies of SWAP in groups 3 and 7; row indices refer to the concatenated table.
    a = group_table(SWAP, group=7).to_records()
    b = group_table(SWAP, group=3, first_traj=10).to_records()
    t = StepTable.from_records(a + b)
    prefs = build(t)
    assert prefs.group.tolist() == [3, 3, 7, 7]
    assert t.slot[prefs.plus].tolist() == [1, 4, 1, 4]
    assert t.group[prefs.minus].tolist() == [3, 3, 7, 7]
    assert prefs.stats["groups"] == 2 and prefs.stats["preferences_per_group"] == 2


def test_empty_table():
    t = group_table([])
    prefs = build(t)
    assert len(prefs) == 0 and prefs.plus.dtype == np.int64
    assert prefs.stats["groups"] == 0 and prefs.stats["mean_weight"] == 0


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"group_size": 7}, "'group_size' must be an even integer >= 2, got 7"),
        ({"fold_split": 8}, "'fold_split' must be an integer in [1, 7]"),
        ({"epsilon": -0.1}, "'epsilon' must be a finite number >= 0, got -0.1"),
        ({"epsilon": 1.5}, "'epsilon' must be <= 1"),
        ({"kappa": float("nan")}, "'kappa' must be a finite number >= 0"),
        ({"min_support": 0}, "'min_support' must be an integer >= 1, got 0"),
        ({"max_per_fold": 0}, "'max_per_fold' must be an integer >= 1 or None, got 0"),
        ({"evidence": "both"}, "unknown evidence mode 'both'; choose one of opposite_fold"),
        ({"weighting": "gap"}, "unknown weighting mode 'gap'"),
        ({"matching": "state"}, "unknown matching mode 'state'"),
        (
            {"coarse_actions": "ids"},
            "unknown coarse_actions mode 'ids'; choose one of coarse, exact",
        ),
        ({"lambda_pair": 0.1}, "unknown option 'lambda_pair'"),
    ],
)
def test_bad_options(options, message):
    with pytest.raises(ValueError, match=r"^build_preferences: ") as err:
        mcgpo.build_preferences(group_table(SWAP), **options)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_slot_beyond_group_size_names_the_row():
    t = group_table([(0, 0, [("A", "x")]), (9, 1, [("A", "y")])])
    with pytest.raises(ValueError, match=r"row 1: field 'slot' = 9 is not below group_size 8"):
        build(t)


def test_rejects_non_table():
    with pytest.raises(TypeError, match="expects a StepTable"):
        mcgpo.build_preferences([{"group": 0}])


def test_options_dataclass_defaults():
    o = PreferenceOptions()
    assert (o.group_size, o.split, o.min_support, o.epsilon, o.kappa) == (8, 4, 1, 0.25, 1.0)
    assert (o.q_exact, o.q_coarse, o.max_per_fold) == (1.0, 0.5, 2)
    assert (o.evidence, o.weighting, o.matching) == ("opposite_fold", "evidence", "joint")
    assert o.coarse_actions == "coarse"


def test_defaults_keep_the_paper_components_on():
    # docs/algorithms/mcgpo.md "Hyper-parameters": kappa > 0 keeps the support shrinkage
    # n/(n + kappa) and q_coarse < q_exact the per-resolution factor, so c is not |Delta_u|.
    opts = PreferenceOptions()
    assert (opts.epsilon, opts.kappa, opts.q_exact, opts.q_coarse) == (0.25, 1.0, 1.0, 0.5)
    assert opts.kappa > 0 and opts.q_coarse < opts.q_exact
    assert (opts.evidence, opts.weighting, opts.matching) == ("opposite_fold", "evidence", "joint")
    from mcgpo.training.config import LAMBDA_PAIR, AlgoConfig

    assert LAMBDA_PAIR == AlgoConfig().lambda_pair == 10.0  # issue 35, by the rule of mcgpo.md
    # test_exact_match's group under the defaults: c = 1 * 1/(1 + 1) * q_exact = 0.5;
    # test_exact_unsupported_then_coarse's: c = 1 * 1/2 * q_coarse = 0.25 (both as derived).
    t = group_table(
        [
            (0, 0, [("sink 1", "x")]),
            (1, 0, [("sink 1", "y")]),
            (4, 1, [("sink 1", "x")]),
            (5, 0, [("sink 1", "y")]),
        ]
    )
    assert as_tuples(t, mcgpo.build_preferences(t)) == [((0, 0), (1, 0), 0.5, "exact")]
