"""StepTable: every validation error (checked for its message), construction round trips."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given as hyp_given
from hypothesis import settings
from hypothesis import strategies as st

from mcgpo.steps import FIELDS, StepTable, StepTableError

# required by from_records; next_anchor defaults to the anchor of the following turn
REQUIRED = [name for name, (_, d) in FIELDS.items() if d is None and name != "next_anchor"]


def rec(traj: int = 1, turn: int = 0, **overrides: Any) -> dict[str, Any]:
    """One valid row; trajectory ``traj`` is in group 0 with slot ``traj``."""
    row = {
        "group": 0,
        "traj": traj,
        "slot": traj,
        "turn": turn,
        "reward": 0.0,
        "done": False,
        "success": 0.0,
        "score": 0.0,
        "action": "go to desk 1",
        "action_valid": True,
        "anchor": f"room {turn}",
    }
    row.update(overrides)
    return row


def two_trajectories() -> list[dict[str, Any]]:
    return [
        rec(1, 0, success=1.0, score=1.0),
        rec(1, 1, reward=10.0, done=True, success=1.0, score=1.0),
        rec(2, 0, done=True, action_valid=False, state="at desk", progress="found"),
    ]


def fails(rows: Any, message: str) -> None:
    with pytest.raises(StepTableError, match=message):
        StepTable.from_records(rows)


# ---------------------------------------------------------------------- from_records input
def test_error_is_a_value_error():
    assert issubclass(StepTableError, ValueError)


def test_not_a_list():
    fails({"group": [0]}, r"^from_records expects a list of dicts, one per agent turn$")
    fails("rows", r"^from_records expects a list of dicts, one per agent turn$")


def test_row_not_a_dict():
    fails([rec(), ["group", 0]], r"^row 1: expected a dict, got list$")


def test_unknown_field():
    fails([rec(), rec(1, 1, colour="red")], r"^row 1: unknown field 'colour'$")


@pytest.mark.parametrize("name", REQUIRED)
def test_missing_field(name):
    row = rec(2, 1)
    del row[name]
    fails([rec(2, 0), row], rf"^row 1: missing field '{name}'$")


# ---------------------------------------------------------------------- types
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("group", 1.5, r"^row 1: field 'group' must be an integer, got 1.5$"),
        ("traj", "7", r"^row 1: field 'traj' must be an integer like row 0, got '7'$"),
        ("turn", True, r"^row 1: field 'turn' must be an integer, got True$"),
        ("reward", "10", r"^row 1: field 'reward' must be a number, got '10'$"),
        ("reward", None, r"^row 1: field 'reward' must be a number, got None$"),
        ("reward", False, r"^row 1: field 'reward' must be a number, got False$"),
        ("done", 2, r"^row 1: field 'done' must be a boolean, got 2$"),
        ("action_valid", "yes", r"^row 1: field 'action_valid' must be a boolean, got 'yes'$"),
        ("anchor", 3, r"^row 1: field 'anchor' must be a string, got int$"),
        ("action", None, r"^row 1: field 'action' must be a string, got NoneType$"),
    ],
)
def test_wrong_types(field, value, message):
    fails([rec(1, 0), {**rec(1, 1), field: value}], message)


def test_success_accepts_python_and_numpy_bools():
    # success is a 0/1 outcome: True / False read as 1.0 / 0.0 (from records and columns)
    rows = [rec(1, 0, done=True, success=True, score=1.0), rec(2, 0, done=True, success=False)]
    table = StepTable.from_records(rows)
    assert table.success.dtype == np.float64 and table.success.tolist() == [1.0, 0.0]
    columns = {name: [row[name] for row in rows] for name in rows[0]}
    columns["success"] = np.array([True, False])
    assert StepTable.from_columns(columns).success.tolist() == [1.0, 0.0]
    fails([rec(1, 0), {**rec(1, 1), "success": 0.5}], r"^row 1: field 'success' must be 0 or 1$")


def test_bool_accepts_zero_and_one():
    table = StepTable.from_records([rec(1, 0, done=0, action_valid=1)])
    assert table.done.tolist() == [False] and table.action_valid.tolist() == [True]


# ---------------------------------------------------------------------- values
def test_nan_reward():
    fails([rec(1, 0), rec(1, 1, reward=float("nan"))], r"^row 1: field 'reward' is NaN$")


def test_nan_and_inf_in_arrays():
    cols = StepTable.from_records(two_trajectories()).columns()
    for name, bad in (("reward", np.nan), ("score", np.inf), ("progress_value", -np.inf)):
        values = cols[name].copy()
        values[2] = bad
        with pytest.raises(
            StepTableError, match=rf"^row 2: field '{name}' is not finite \(NaN or inf\)$"
        ):
            StepTable.from_columns({**cols, name: values})


def test_inf_reward_in_records():
    fails([rec(1, 0, reward=float("inf"))], r"^row 0: field 'reward' is not finite")


@pytest.mark.parametrize("value", [0.5, 2.0, -1.0])
def test_success_not_zero_or_one(value):
    fails([rec(1, 0), rec(1, 1, success=value)], r"^row 1: field 'success' must be 0 or 1$")


@pytest.mark.parametrize("name", ["slot", "turn"])
def test_negative_ids(name):
    fails([{**rec(1, 0), name: -1}], rf"^row 0: field '{name}' must be >= 0$")


# ---------------------------------------------------------------------- structure
def test_turns_must_be_contiguous():
    # trajectory 1 has turns 0, 2: row 1 breaks the run
    fails(
        [rec(1, 0), rec(1, 2)],
        r"^row 1: field 'turn' = 2 breaks the contiguous turns 0,1,2,\.\.\. of trajectory 1$",
    )


def test_turns_must_start_at_zero():
    fails([rec(4, 1), rec(4, 2)], r"^row 0: field 'turn' = 1 breaks the contiguous turns")


def test_duplicate_turn():
    fails([rec(1, 0), rec(1, 1), rec(1, 1)], r"^row 2: field 'turn' = 1 breaks the contiguous")


def test_trajectory_spread_over_two_groups():
    fails(
        [rec(1, 0), rec(1, 1, group=5)],
        r"^row 1: field 'group': trajectory 1 spread over two groups$",
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [("success", 1.0), ("score", 0.5), ("slot", 3), ("errored", True), ("task_type", "heat")],
)
def test_trajectory_constant_fields(field, value):
    fails(
        [rec(1, 0), rec(1, 1, **{field: value})],
        rf"^row 1: field '{field}': trajectory 1 has two values of '{field}'$",
    )


def test_duplicate_slots_in_a_group():
    fails(
        [rec(1, 0, slot=0), rec(2, 0, slot=0)],
        r"^row 1: field 'slot' = 0 is used by two trajectories of group 0 \(1 and 2\)$",
    )


def test_same_slot_in_two_groups_is_fine():
    table = StepTable.from_records([rec(1, 0, slot=0), rec(2, 0, slot=0, group=1)])
    assert len(table) == 2


# ---------------------------------------------------------------------- from_columns
def test_from_columns_errors():
    cols = {name: [v] for name, v in rec().items()}
    with pytest.raises(StepTableError, match=r"^unknown field 'colour'$"):
        StepTable.from_columns({**cols, "colour": ["red"]})
    with pytest.raises(StepTableError, match=r"^missing field 'anchor'$"):
        StepTable.from_columns({k: v for k, v in cols.items() if k != "anchor"})
    with pytest.raises(StepTableError, match=r"^columns have different lengths: "):
        StepTable.from_columns({**cols, "reward": [0.0, 1.0]})
    with pytest.raises(StepTableError, match=r"^row 0: field 'group' must be an integer"):
        StepTable.from_columns({**cols, "group": np.array([0.5])})


def test_from_columns_accepts_arrays():
    rows = two_trajectories()
    cols = {k: [r.get(k, FIELDS[k][1]) for r in rows] for k in FIELDS if k != "next_anchor"}
    arrays = {k: np.asarray(v) for k, v in cols.items()}
    table = StepTable.from_columns(arrays)
    assert table.group.dtype == np.int64 and table.anchor.dtype == object
    assert table.to_records() == StepTable.from_records(rows).to_records()


def test_validate_direct_construction():
    table = StepTable.from_records(two_trajectories())
    cols = table.columns()
    with pytest.raises(StepTableError, match=r"^field 'reward': expected dtype float, got int64$"):
        StepTable(**{**cols, "reward": np.zeros(3, dtype=np.int64)}).validate()
    with pytest.raises(StepTableError, match=r"^field 'done': expected a 1-D array of length 3$"):
        StepTable(**{**cols, "done": np.zeros(2, dtype=bool)}).validate()


def test_with_columns():
    table = StepTable.from_records(two_trajectories())
    shifted = table.with_columns(reward=table.reward + 1.0)
    assert shifted.reward.tolist() == [1.0, 11.0, 1.0]
    assert table.reward.tolist() == [0.0, 10.0, 0.0]  # the original is untouched
    with pytest.raises(StepTableError, match=r"^unknown field 'colour'$"):
        table.with_columns(colour=["a", "b", "c"])
    with pytest.raises(StepTableError, match=r"^row 0: field 'success' must be 0 or 1$"):
        table.with_columns(success=[0.5, 0.5, 0.0])


# ---------------------------------------------------------------------- round trips
def test_records_round_trip():
    rows = two_trajectories()
    table = StepTable.from_records(rows)
    out = table.to_records()
    assert len(out) == 3 and set(out[0]) == set(FIELDS)
    for given, back in zip(rows, out):
        assert {k: back[k] for k in given} == given  # every given value comes back as is
    # defaults: context fields "", numbers 0, next_anchor from the following turn
    assert out[0]["state"] == "" and out[2]["state"] == "at desk"
    assert out[0]["progress_value"] == 0.0 and out[0]["errored"] is False
    assert [r["next_anchor"] for r in out] == ["room 1", "", ""]
    assert all(type(r["group"]) is int and type(r["reward"]) is float for r in out)
    again = StepTable.from_records(out)
    assert again.to_records() == out


def test_explicit_next_anchor_is_kept():
    rows = [rec(1, 0, next_anchor="hall"), rec(1, 1, next_anchor="success")]
    assert [r["next_anchor"] for r in StepTable.from_records(rows).to_records()] == [
        "hall",
        "success",
    ]


def test_columns_round_trip():
    table = StepTable.from_records(two_trajectories())
    again = StepTable.from_columns(table.columns())
    for name, col in table.columns().items():
        assert np.array_equal(getattr(again, name), col), name


def test_select_mask_and_index():
    table = StepTable.from_records(two_trajectories())
    by_mask = table.select(table.traj == 1)
    assert by_mask.turn.tolist() == [0, 1]
    by_index = table.select(np.array([2, 0]))
    assert by_index.traj.tolist() == [2, 1]
    assert by_index.to_records() == [table.to_records()[2], table.to_records()[0]]


def test_learnable_drops_errored_trajectories():
    rows = [*two_trajectories(), rec(3, 0, errored=True)]
    table = StepTable.from_records(rows)
    assert table.learnable().traj.tolist() == [1, 1, 2]


def test_rows_in_any_order():
    rows = two_trajectories()
    table = StepTable.from_records(rows[::-1])
    # next_anchor is filled from the following turn, not the following row
    by_key = {(r["traj"], r["turn"]): r["next_anchor"] for r in table.to_records()}
    assert by_key == {(1, 0): "room 1", (1, 1): "", (2, 0): ""}
    assert table.traj[table.trajectory_order()].tolist() == [1, 1, 2]


def test_to_arrow():
    table = StepTable.from_records(two_trajectories())
    arrow = table.to_arrow()
    assert arrow.num_rows == 3 and arrow.column("anchor").to_pylist() == [
        "room 0",
        "room 1",
        "room 0",
    ]


# ---------------------------------------------------------------------- string ids (verl uids)
def test_string_ids_map_to_dense_ints_in_first_seen_order():
    # rows: trajectory "t-b" (turns 0, 1) then "t-a" (turn 0), both in group "uid-z":
    # first seen: group "uid-z" -> 0; traj "t-b" -> 0, "t-a" -> 1
    rows = [rec(1, 0), rec(1, 1), rec(2, 0)]
    for row, traj in zip(rows, ["t-b", "t-b", "t-a"]):
        row.update(group="uid-z", traj=traj)
    table = StepTable.from_records(rows)
    assert table.group.tolist() == [0, 0, 0] and table.group.dtype == np.int64
    assert table.traj.tolist() == [0, 0, 1]
    assert table.group_label.tolist() == ["uid-z"] * 3
    assert table.traj_label.tolist() == ["t-b", "t-b", "t-a"]
    # next_anchor follows the mapped trajectories; records round-trip with their labels
    assert table.next_anchor.tolist() == ["room 1", "", ""]
    again = StepTable.from_records(table.to_records())
    assert again.to_records() == table.to_records()


def test_integer_ids_leave_labels_empty():
    table = StepTable.from_records(two_trajectories())
    assert table.group_label.tolist() == ["", "", ""] == table.traj_label.tolist()


def test_string_ids_bad_input():
    fails(
        [{**rec(1, 0), "group": "g"}, rec(2, 0)],
        r"^row 1: field 'group' must be a string like row 0, got 0$",
    )
    fails(
        [{**rec(1, 0), "traj": "a", "traj_label": "x"}],
        r"^field 'traj' holds strings, so 'traj_label' cannot be given$",
    )
    # one trajectory label spread over two groups is still caught on the mapped ids
    rows = [{**rec(1, 0), "traj": "a"}, {**rec(1, 1), "traj": "a", "group": 5}]
    fails(rows, r"^row 1: field 'group': trajectory 0 spread over two groups$")


def test_with_columns_accepts_string_ids():
    table = StepTable.from_records(two_trajectories())
    relabelled = table.with_columns(traj=["x", "x", "y"], group=["g", "g", "g"])
    assert relabelled.traj.tolist() == [0, 0, 1] and relabelled.traj_label.tolist()[2] == "y"


def _implemented(name: str, table: StepTable) -> bool:
    import mcgpo

    try:
        mcgpo.estimate(name, table)
    except NotImplementedError:
        return False
    return True


@st.composite
def _records(draw: st.DrawFn) -> list[dict[str, Any]]:
    """2 groups x 2-4 trajectories x 1-4 turns; ids drawn out of order, rows shuffled."""
    groups = draw(st.lists(st.integers(0, 99), min_size=2, max_size=2, unique=True))
    trajs = iter(draw(st.lists(st.integers(0, 999), min_size=8, max_size=8, unique=True)))
    rows: list[dict[str, Any]] = []
    for group in groups:
        for slot in range(draw(st.integers(2, 4))):
            traj, length = next(trajs), draw(st.integers(1, 4))
            won = draw(st.booleans())
            states = draw(st.lists(st.sampled_from("abc"), min_size=length, max_size=length))
            for t in range(length):
                last = t == length - 1
                rows.append(
                    rec(
                        traj, t, group=group, slot=slot, done=last, reward=10.0 * (won and last),
                        success=float(won), score=float(won), anchor=f"room {states[t]}",
                        state=f"room {states[t]}", action=f"act {(slot + t) % 2}",
                    )
                )  # fmt: skip
    order = draw(st.permutations(range(len(rows))))
    return [rows[i] for i in order]


@settings(max_examples=25, deadline=None)
@hyp_given(_records(), st.integers(0, 2**31 - 1))
def test_string_ids_change_no_estimator(rows, salt):
    """Relabelling int ids with uuid-like strings (whose order is unrelated to the ints')
    gives every estimator the same per-row values, and the same preference pairs."""
    import mcgpo

    ints = StepTable.from_records(rows)
    relabel = [
        {**r, "group": f"{hash((salt, 'g', r['group'])):x}", "traj": f"{hash((salt, r['traj'])):x}"}
        for r in rows
    ]
    strs = StepTable.from_records(relabel)
    for name in sorted(mcgpo.ESTIMATORS):
        if not _implemented(name, ints):
            continue
        a, _ = mcgpo.estimate(name, ints)
        b, _ = mcgpo.estimate(name, strs)
        np.testing.assert_array_equal(a, b, err_msg=name)
    pa = mcgpo.build_preferences(ints, group_size=4, epsilon=0.0)
    pb = mcgpo.build_preferences(strs, group_size=4, epsilon=0.0)
    key = lambda p: sorted(zip(p.plus.tolist(), p.minus.tolist(), p.weight.tolist()))  # noqa: E731
    assert key(pa) == key(pb)
