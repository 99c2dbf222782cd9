"""mcgpo.grouping: dense codes from values, the per-trajectory view, the one normaliser."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcgpo.grouping import (
    EPS,
    SNAP,
    codes,
    combine_codes,
    group_stats,
    normalise,
    representative_rows,
    trajectory_view,
    value_codes,
)
from mcgpo.steps import StepTable

TEXT = st.text(alphabet=st.sampled_from(["a", "b", "\x00", " ", "é"]), max_size=4)


# ---------------------------------------------------------------------- codes
def test_codes_are_ranks_of_the_sorted_values():
    col = np.array(["b", "a", "c", "a"], dtype=object)
    assert value_codes(col).tolist() == [1, 0, 2, 0]
    assert value_codes(np.array([30, -1, 30, 7])).tolist() == [2, 0, 2, 1]
    # tuples rank lexicographically: (0, "y") < (0, "z") < (1, "x")
    assert codes(np.array([1, 0, 0, 1]), np.array(["x", "z", "y", "x"], dtype=object)).tolist() == [
        2,
        1,
        0,
        2,
    ]
    assert codes(np.array([], dtype=object)).tolist() == []
    with pytest.raises(ValueError, match="needs at least one column"):
        codes()


def test_strings_differing_by_trailing_nuls_stay_distinct():
    col = np.array(["a\x00", "a", "a\x00\x00", "a", "b\x00"], dtype=object)
    assert value_codes(col).tolist() == [1, 0, 2, 0, 3]
    # numpy's unicode dtype would have merged them: the reason for the object path
    assert len(np.unique(col.astype(str))) == 2


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), TEXT), max_size=30), st.randoms())
def test_codes_depend_only_on_values(rows, rnd):
    a = np.array([r[0] for r in rows], dtype=np.int64)
    b = np.array([r[1] for r in rows], dtype=object)
    code = codes(a, b)
    perm = list(range(len(rows)))
    rnd.shuffle(perm)
    assert codes(a[perm], b[perm]).tolist() == code[perm].tolist()  # order-free
    # equal codes <=> equal values, and the codes are the dense ranks of the sorted tuples
    ranks = {v: i for i, v in enumerate(sorted(set(rows)))}
    assert code.tolist() == [ranks[r] for r in rows]


def test_combine_codes_beyond_one_int64_key():
    # (2**40) * (2**40) does not fit one int64 key: the row-wise path gives the same ranks
    big = np.array([2**40, 0, 2**40, 5], dtype=np.int64)
    other = np.array([2**40, 2**40, 3, 3], dtype=np.int64)
    # sorted tuples: (0, 2**40) < (5, 3) < (2**40, 3) < (2**40, 2**40)
    assert combine_codes(big, other).tolist() == [3, 0, 2, 1]
    assert combine_codes(np.array([2, 0]), np.array([1, 1])).tolist() == [1, 0]
    assert combine_codes(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)).tolist() == []


# ---------------------------------------------------------------------- trajectory view
def test_trajectory_view():
    base = {"reward": 0.0, "done": False, "success": 0.0, "score": 0.0, "action": "a"}
    base.update({"action_valid": True, "anchor": "s"})
    rows = [
        {**base, "group": g, "traj": traj, "slot": slot, "turn": turn}
        for g, traj, slot, turns in [(0, 40, 0, 3), (0, 7, 1, 2), (1, 12, 0, 1)]
        for turn in range(turns)
    ]
    table = StepTable.from_records(rows[::-1])  # any row order
    view = trajectory_view(table)
    assert view.count == 3 and view.head.dtype == np.int64
    # codes are the ranks of the trajectory ids: 7 -> 0, 12 -> 1, 40 -> 2
    assert table.traj[view.head].tolist() == [7, 12, 40]
    assert view.traj.tolist() == [{7: 0, 12: 1, 40: 2}[t] for t in table.traj]
    assert representative_rows(np.array([1, 0, 1, 2])).tolist() == [1, 2, 3]  # last row of each
    empty = trajectory_view(StepTable.from_records([]))
    assert empty.count == 0 and empty.traj.shape == (0,)


# ---------------------------------------------------------------------- statistics
def test_group_stats_golden():
    # group 0: [1, 3] mean 2, sample std sqrt(2); group 1: [5] std 0; group 2: 0.1 x 3 exact
    values = np.array([1.0, 3.0, 5.0, 0.1, 0.1, 0.1])
    group = np.array([0, 0, 1, 2, 2, 2])
    mean, std, count = group_stats(values, group)
    assert mean.tolist() == [2.0, 2.0, 5.0, 0.1, 0.1, 0.1]  # 0.1 exactly, not 0.30000000000000004/3
    np.testing.assert_allclose(std, [math.sqrt(2)] * 2 + [0.0] * 4)
    assert std[3:].tolist() == [0.0, 0.0, 0.0] and count.tolist() == [2, 2, 1, 3, 3, 3]
    _, pop, _ = group_stats(values, group, unbiased=False)
    np.testing.assert_allclose(pop[:2], [1.0, 1.0])


def test_normalise_golden():
    values = np.array([1.0, 3.0, 5.0])
    group = np.array([0, 0, 1])
    # (1 - 2) / (sqrt(2) + eps), (3 - 2) / (sqrt(2) + eps); the singleton: 0 or its raw value
    h = 1 / (math.sqrt(2) + EPS)
    np.testing.assert_allclose(normalise(values, group), [-h, h, 0.0], rtol=1e-12)
    np.testing.assert_allclose(normalise(values, group, singleton="raw"), [-h, h, 5.0], rtol=1e-12)
    assert normalise(values, group, mode="mean_norm").tolist() == [-1.0, 1.0, 0.0]
    # population std: (1 - 2) / (1 + eps)
    np.testing.assert_allclose(normalise(values, group, unbiased=False)[:2], [-1, 1], rtol=1e-5)
    with pytest.raises(ValueError, match="mode must be one of"):
        normalise(values, group, mode="std")


def test_float_noise_rule():
    # 0.1 + 0.2 and 0.3 differ by one ulp: well under SNAP * 0.3, so the group is constant
    noisy = np.array([0.1 + 0.2, 0.3, 0.3])
    assert noisy[0] != noisy[1]
    assert normalise(noisy, np.zeros(3, dtype=np.int64)).tolist() == [0.0, 0.0, 0.0]
    # a real difference, however small against eps, is kept
    real = np.array([1.0, 1.0 + 1e-6])
    assert (SNAP * 1.0 < 1e-6) and normalise(real, np.zeros(2, dtype=np.int64))[1] > 0


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0.0, 0.1, 0.7, 10.0])), max_size=25),
    st.sampled_from([-7.5, 0.5, 20.0]),
    st.randoms(),
)
def test_normalise_is_order_free_and_shift_invariant(rows, c, rnd):
    group = value_codes(np.array([r[0] for r in rows], dtype=np.int64))
    values = np.array([r[1] for r in rows])
    out = normalise(values, group)
    perm = list(range(len(rows)))
    rnd.shuffle(perm)
    np.testing.assert_allclose(normalise(values[perm], group[perm]), out[perm], atol=1e-9)
    np.testing.assert_allclose(normalise(values + c, group), out, atol=1e-6)
    # a group whose members share one value gives exactly 0, in any order
    for g in set(group.tolist()):
        members = values[group == g]
        if np.all(members == members[0]):
            assert np.all(out[group == g] == 0.0)
