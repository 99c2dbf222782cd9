"""The label variants of build_preferences (ours, not the paper's; docs/algorithms/mcgpo.md):
leave-pair-out evidence and Beta-posterior confidence weights, on hand-built groups with
the expected values derived in comments, and the closed forms of the confidence weight."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mcgpo
from mcgpo.preferences.confidence import beta_confidence
from mcgpo.steps import StepTable


def one_context(actions_and_outcomes: list[tuple[int, str, float]]) -> StepTable:
    """One group, one turn per trajectory, every trajectory at the same state "room"."""
    rows = []
    for traj, (slot, action, success) in enumerate(actions_and_outcomes):
        rows.append({
            "group": 0, "traj": traj, "slot": slot, "turn": 0, "reward": 10.0 * success,
            "done": True, "success": success, "score": success, "action": action,
            "action_valid": True, "anchor": "room", "state": "room", "state_coarse": "room",
            "progress": "", "enabled": "",
        })  # fmt: skip
    return StepTable.from_records(rows)


def test_leave_pair_out_labels_a_pair_with_the_other_six():
    # N = 8, one context; slots 0-3 (fold 0) and 4-7 (fold 1):
    #   slot: 0  1  2  3  4  5  6  7
    #   act:  a  b  b  b  a  a  b  b
    #   y:    1  0  0  0  1  0  0  1
    # opposite_fold: fold 0 has pairs (0,1), (0,2), (0,3) labelled by fold 1: a = 1/2
    # (slots 4, 5), b = 1/2 (slots 6, 7): gap 0, no preference in fold 0; fold 1's pairs
    # (4,6), (4,7), (5,6), (5,7) by fold 0: a = 1/1, b = 0/3, gap 1.
    # leave_pair_out: candidates are all 3 x 5 a-vs-b pairs of the group, each labelled by
    # the other six. All at turn 0, so allocation walks them by slots, rows used once, cap
    # 2 x 2 = 4 per group:
    #   (0, 1): a from 4, 5 -> 1/2; b from 2, 3, 6, 7 -> 1/4: gap 1/4, a (row 0) preferred;
    #           c = 1/4 * n/(n + 1), n = min(2, 4) = 2 -> 1/6
    #   (0, *), (1, *) reuse rows 0 / 1; next (2, 4): a from 0, 5 -> 1/2; b from 1, 3, 6, 7
    #           -> 1/4: gap 1/4, row 4 preferred; c = 1/6
    #   (3, 5): a from 0, 4 -> 1; b from 1, 2, 6, 7 -> 1/4: gap 3/4, row 5 preferred;
    #           c = 3/4 * 2/3 = 1/2
    #   then no a-row is left (0, 4, 5 used): 3 preferences.
    table = one_context([
        (0, "a", 1.0), (1, "b", 0.0), (2, "b", 0.0), (3, "b", 0.0),
        (4, "a", 1.0), (5, "a", 0.0), (6, "b", 0.0), (7, "b", 1.0),
    ])  # fmt: skip
    prefs = mcgpo.build_preferences(table, evidence="leave_pair_out", kappa=1.0)
    assert list(zip(prefs.plus.tolist(), prefs.minus.tolist())) == [(0, 1), (4, 2), (5, 3)]
    np.testing.assert_allclose(prefs.gap, [0.25, 0.25, 0.75])
    np.testing.assert_allclose(prefs.weight, [1 / 6, 1 / 6, 0.5])
    assert prefs.support.tolist() == [2, 2, 2] and np.all(prefs.fold == -1)
    # every kept pair's label, recomputed by hand from the six other siblings
    y = {i: float(table.success[i]) for i in range(8)}
    act = {i: str(table.action[i]) for i in range(8)}
    for plus, minus, gap in zip(prefs.plus.tolist(), prefs.minus.tolist(), prefs.gap):
        others = [i for i in range(8) if i not in (plus, minus)]
        u = {a: np.mean([y[i] for i in others if act[i] == a]) for a in ("a", "b")}
        assert gap == pytest.approx(u[act[plus]] - u[act[minus]])
    opposite = mcgpo.build_preferences(table, kappa=1.0)
    assert set(opposite.fold.tolist()) == {1}  # fold 0's gap was 0


def test_leave_pair_out_is_a_known_evidence_mode():
    with pytest.raises(ValueError, match="leave_pair_out"):
        mcgpo.build_preferences(one_context([(0, "a", 1.0)]), evidence="leave_one_out")


# closed forms of P(X > Y) for Beta posteriors with kappa = 0 (prior Beta(1, 1)):
#   X ~ Beta(2, 1) (1 win of 1), Y ~ Beta(1, 1) (no evidence): P = E[X] = 2/3 -> c = 1/3
#   X ~ Beta(2, 1), Y ~ Beta(1, 2) (0 of 1): P = int 2x (2x - x^2) dx = 5/6 -> c = 2/3
#   X ~ Beta(3, 1) (2 of 2), Y ~ Beta(1, 3) (0 of 2): P = int 3x^2 (1 - (1 - x)^3) dx
#     = 1 - int 3x^2 (1 - x)^3 dx = 1 - 3 B(3, 4) = 1 - 3 * 2! 3! / 6! = 1 - 1/20 -> c = 0.9
@pytest.mark.parametrize(
    ("win_p", "n_p", "win_m", "n_m", "expected"),
    [(1, 1, 0, 0, 1 / 3), (1, 1, 0, 1, 2 / 3), (2, 2, 0, 2, 0.9), (1, 2, 1, 2, 0.0)],
)
def test_beta_confidence_closed_forms(win_p, n_p, win_m, n_m, expected):
    got = beta_confidence(np.array([win_p]), np.array([n_p]), np.array([win_m]),
                          np.array([n_m]), 0.0)  # fmt: skip
    assert got[0] == pytest.approx(expected, abs=1e-3)


def test_beta_prior_shrinks_thin_evidence_towards_the_context_rate():
    # 1 of 1 against 0 of 1: with kappa pseudo-trajectories at the context's rate (1/2)
    # both posteriors move towards 1/2, so the confidence falls as kappa grows
    c = [float(beta_confidence(np.array([1.0]), np.array([1.0]), np.array([0.0]),
                               np.array([1.0]), k)[0]) for k in (0.0, 2.0, 8.0)]  # fmt: skip
    assert c[0] > c[1] > c[2] > 0


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 8), st.integers(0, 8), st.integers(0, 8), st.floats(0, 4))
def test_beta_confidence_grows_with_the_preferred_actions_wins(n_p, n_m, extra, kappa):
    win_m = n_m // 2
    base = beta_confidence(np.array([n_p / 2]), np.array([n_p]), np.array([win_m]),
                           np.array([n_m]), kappa)[0]  # fmt: skip
    more = beta_confidence(np.array([n_p / 2 + extra]), np.array([n_p + extra]),
                           np.array([win_m]), np.array([n_m]), kappa)[0]  # fmt: skip
    assert 0.0 <= base <= 1.0 and 0.0 <= more <= 1.0
    assert more >= base - 1e-9


def test_beta_weighting_in_build_preferences():
    # the fold-1 pairs of the group above: a = 1/1 (slot 0) vs b = 0/3 (slots 1-3) from
    # fold 0, kappa = 1: prior mean (1 + 0) / 4 = 1/4, so a ~ Beta(2.25, 1.75), b ~
    # Beta(1.25, 4.75): c = 2 P(a > b) - 1, recomputed here by the same function
    table = one_context([
        (0, "a", 1.0), (1, "b", 0.0), (2, "b", 0.0), (3, "b", 0.0),
        (4, "a", 1.0), (5, "a", 0.0), (6, "b", 0.0), (7, "b", 1.0),
    ])  # fmt: skip
    prefs = mcgpo.build_preferences(table, weighting="beta", kappa=1.0)
    c = beta_confidence(np.array([1.0]), np.array([1.0]), np.array([0.0]), np.array([3.0]), 1.0)
    assert len(prefs) > 0 and np.allclose(prefs.weight, c[0])
    assert 0.5 < c[0] < 1.0
