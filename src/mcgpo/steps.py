"""The step table: one row per agent turn, typed numpy columns.

Every estimator and the MCGPO preference builder work on a :class:`StepTable` and never
see tokens. A row is one decision of one trajectory: the context the agent saw (``anchor``,
``state``, ``state_coarse``, ``progress``, ``enabled``), the action it took, the reward the
environment gave for it, and the outcome of the whole trajectory (``success``, ``score``).

Identifiers
    ``group``  task instance (the N sibling rollouts of one task share it), int
    ``traj``   trajectory id, unique over the whole table, int
    ``slot``   position 0..N-1 of the trajectory inside its group, fixed when sampled, int
    ``turn``   0-based turn index inside the trajectory, contiguous, int

``group`` and ``traj`` may also be given as strings (outside callers such as verl label
prompts and samples with uuid strings): a column of strings is mapped to dense integers
0, 1, 2, ... in order of first appearance (:func:`dense_ids`, the one place this happens),
and the strings are kept in ``group_label`` / ``traj_label`` for output. Estimators and the
preference builder only read the integers, and their results never depend on which
integers label the groups, so string and integer ids give the same results. Integer ids
leave the label columns empty.

Rows may come in any order: every consumer sorts what it needs itself, so results never
depend on row order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

__all__ = ["FIELDS", "StepTable", "StepTableError", "dense_ids"]


class StepTableError(ValueError):
    """A step table was built from bad input; the message names the field and the row."""


# name -> (kind, default). kind: "int", "float", "bool", "str". default None = required.
FIELDS: dict[str, tuple[str, Any]] = {
    "group": ("int", None),
    "traj": ("int", None),
    "slot": ("int", None),
    "turn": ("int", None),
    "reward": ("float", None),
    "done": ("bool", None),
    "success": ("float", None),
    "score": ("float", None),
    "action": ("str", None),
    "action_valid": ("bool", None),
    "anchor": ("str", None),
    "next_anchor": ("str", None),
    "state": ("str", ""),
    "state_coarse": ("str", ""),
    "progress": ("str", ""),
    "enabled": ("str", ""),
    # Numeric rubric progress in [0, 1] before the action, and after it (for reward shaping).
    "progress_value": ("float", 0.0),
    "next_progress_value": ("float", 0.0),
    # The trajectory hit an environment error: kept for inspection, excluded from learning.
    "errored": ("bool", False),
    # Task family (e.g. ALFWorld task type), for per-type statistics. Empty when unknown.
    "task_type": ("str", ""),
    # The caller's own string ids when group / traj were given as strings, else "".
    "group_label": ("str", ""),
    "traj_label": ("str", ""),
}
_LABELS = {"group": "group_label", "traj": "traj_label"}

_DTYPES = {"int": np.int64, "float": np.float64, "bool": np.bool_, "str": object}


@dataclass(frozen=True, eq=False)
class StepTable:
    """One row per agent turn. All columns have shape ``[R]`` (R = number of rows)."""

    group: np.ndarray  # [R] int64   task instance
    traj: np.ndarray  # [R] int64    trajectory id (unique over the table)
    slot: np.ndarray  # [R] int64    0..N-1 position of the trajectory in its group
    turn: np.ndarray  # [R] int64    0-based, contiguous inside a trajectory
    reward: np.ndarray  # [R] float64  environment reward at this turn
    done: np.ndarray  # [R] bool     episode ended after this turn
    success: np.ndarray  # [R] float64  trajectory outcome, 0 or 1 (same on all its rows)
    score: np.ndarray  # [R] float64   trajectory graded score (e.g. WebShop's), same on all rows
    action: np.ndarray  # [R] object(str)  the parsed action text
    action_valid: np.ndarray  # [R] bool  the response was well-formed
    anchor: np.ndarray  # [R] object(str)  exact observation key before the action
    next_anchor: np.ndarray  # [R] object(str)  observation key after the action
    state: np.ndarray  # [R] object(str)  h(s): state summary with identity fields
    state_coarse: np.ndarray  # [R] object(str)  h(s) without identity fields
    progress: np.ndarray  # [R] object(str)  C: rubric progress (canonical string)
    enabled: np.ndarray  # [R] object(str)  F: rule-enabled criteria (canonical string)
    progress_value: np.ndarray  # [R] float64  rubric progress in [0, 1] before the action
    next_progress_value: np.ndarray  # [R] float64  rubric progress after the action
    errored: np.ndarray  # [R] bool  trajectory hit an environment error
    task_type: np.ndarray  # [R] object(str)  task family
    group_label: np.ndarray  # [R] object(str)  caller's string group id ("" for int ids)
    traj_label: np.ndarray  # [R] object(str)  caller's string trajectory id ("" for int ids)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_records(cls, rows: Sequence[Mapping[str, Any]]) -> StepTable:
        """Build from a list of dicts, one per agent turn.

        Required keys: ``group traj slot turn reward done success score action action_valid
        anchor``; ``next_anchor`` defaults to the anchor of the next turn of the same
        trajectory ("" after the last turn); the context fields default to "".
        ``success`` may be a bool (``True`` / ``False`` read as 1.0 / 0.0). Unknown keys are
        an error.
        """
        if isinstance(rows, (Mapping, str, bytes)) or not isinstance(rows, Sequence):
            raise StepTableError("from_records expects a list of dicts, one per agent turn")
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise StepTableError(f"row {i}: expected a dict, got {type(row).__name__}")
            unknown = set(row) - set(FIELDS)
            if unknown:
                raise StepTableError(f"row {i}: unknown field {sorted(unknown)[0]!r}")
        columns: dict[str, list[Any]] = {}
        for name, (_, default) in FIELDS.items():
            if name == "next_anchor":
                continue
            col = []
            for i, row in enumerate(rows):
                if name in row:
                    col.append(row[name])
                elif default is None:
                    raise StepTableError(f"row {i}: missing field {name!r}")
                else:
                    col.append(default)
            columns[name] = col
        if all("next_anchor" in row for row in rows):
            columns["next_anchor"] = [row["next_anchor"] for row in rows]
        return cls.from_columns(columns)

    @classmethod
    def from_columns(cls, columns: Mapping[str, Iterable[Any]]) -> StepTable:
        """Build from a dict of equal-length columns (lists or arrays); see :data:`FIELDS`."""
        unknown = set(columns) - set(FIELDS)
        if unknown:
            raise StepTableError(f"unknown field {sorted(unknown)[0]!r}")
        lengths = {name: len(np.asarray(col, dtype=object)) for name, col in columns.items()}
        if len(set(lengths.values())) > 1:
            raise StepTableError(f"columns have different lengths: {lengths}")
        n = next(iter(lengths.values())) if lengths else 0
        columns = _with_dense_ids(columns)
        arrays: dict[str, np.ndarray] = {}
        for name, (kind, default) in FIELDS.items():
            if name in columns:
                arrays[name] = _coerce(name, kind, columns[name])
            elif name == "next_anchor" and "anchor" in arrays:
                continue  # filled below from the following turn
            elif default is None:
                raise StepTableError(f"missing field {name!r}")
            else:
                arrays[name] = np.full(n, default, dtype=_DTYPES[kind])
        if "next_anchor" not in arrays:
            arrays["next_anchor"] = _following_anchor(arrays)
        table = cls(**arrays)
        table.validate()
        return table

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Check types and the structural rules; raise :class:`StepTableError` naming the row."""
        n = len(self.group)
        for f in fields(self):
            col = getattr(self, f.name)
            kind = FIELDS[f.name][0]
            if not isinstance(col, np.ndarray) or col.ndim != 1 or len(col) != n:
                raise StepTableError(f"field {f.name!r}: expected a 1-D array of length {n}")
            if col.dtype != np.dtype(_DTYPES[kind]):
                raise StepTableError(f"field {f.name!r}: expected dtype {kind}, got {col.dtype}")
        if n == 0:
            return
        for name in ("reward", "success", "score", "progress_value", "next_progress_value"):
            bad = np.flatnonzero(~np.isfinite(getattr(self, name)))
            if len(bad):
                raise StepTableError(f"row {bad[0]}: field {name!r} is not finite (NaN or inf)")
        bad = np.flatnonzero((self.success != 0) & (self.success != 1))
        if len(bad):
            raise StepTableError(f"row {bad[0]}: field 'success' must be 0 or 1")
        for name in ("slot", "turn"):
            bad = np.flatnonzero(getattr(self, name) < 0)
            if len(bad):
                raise StepTableError(f"row {bad[0]}: field {name!r} must be >= 0")
        order = np.lexsort((self.turn, self.traj))
        traj, turn = self.traj[order], self.turn[order]
        first = np.ones(n, dtype=bool)
        first[1:] = traj[1:] != traj[:-1]
        # expected turn = position inside the trajectory's sorted run
        starts = np.flatnonzero(first)
        run_start = starts[np.cumsum(first) - 1]
        expected = np.arange(n) - run_start
        bad = np.flatnonzero(turn != expected)
        if len(bad):
            i = order[bad[0]]
            raise StepTableError(
                f"row {i}: field 'turn' = {self.turn[i]} breaks the contiguous turns "
                f"0,1,2,... of trajectory {self.traj[i]}"
            )
        constant = ("group", "slot", "success", "score", "errored", "task_type", "group_label")
        for name in (*constant, "traj_label"):
            col = getattr(self, name)[order]
            changed = np.flatnonzero(~first & (col != np.roll(col, 1)))
            if len(changed):
                i = order[changed[0]]
                what = {"group": "spread over two groups"}.get(name, f"has two values of {name!r}")
                raise StepTableError(f"row {i}: field {name!r}: trajectory {self.traj[i]} {what}")
        # duplicate slots: two trajectories of one group sharing a slot
        heads = order[first]
        key = np.stack([self.group[heads], self.slot[heads]], axis=1)
        _, idx, counts = np.unique(key, axis=0, return_index=True, return_counts=True)
        if np.any(counts > 1):
            dup = key[idx[np.argmax(counts > 1)]]
            rows = heads[(key[:, 0] == dup[0]) & (key[:, 1] == dup[1])]
            raise StepTableError(
                f"row {rows[1]}: field 'slot' = {dup[1]} is used by two trajectories of "
                f"group {dup[0]} ({self.traj[rows[0]]} and {self.traj[rows[1]]})"
            )

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self.group)

    def columns(self) -> dict[str, np.ndarray]:
        """The columns as a dict (shared arrays, not copies)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_records(self) -> list[dict[str, Any]]:
        """One dict per row with plain Python values (inverse of :meth:`from_records`)."""
        cols = self.columns()
        return [
            {k: v[i].item() if hasattr(v[i], "item") else v[i] for k, v in cols.items()}
            for i in range(len(self))
        ]

    def select(self, index: np.ndarray) -> StepTable:
        """Rows picked by a boolean mask or an integer index array, in that order."""
        index = np.asarray(index)
        return StepTable(**{k: v[index] for k, v in self.columns().items()})

    def learnable(self) -> StepTable:
        """The rows of trajectories that did not hit an environment error."""
        return self.select(~self.errored)

    def with_columns(self, **new: Any) -> StepTable:
        """A copy with some columns replaced (coerced and validated)."""
        arrays = {}
        for name, col in _with_dense_ids(new).items():
            if name not in FIELDS:
                raise StepTableError(f"unknown field {name!r}")
            arrays[name] = _coerce(name, FIELDS[name][0], col)
        table = replace(self, **arrays)
        table.validate()
        return table

    def trajectory_order(self) -> np.ndarray:
        """Row indices sorted by (group, traj, turn): a canonical, order-free layout."""
        return np.lexsort((self.turn, self.traj, self.group))

    def to_arrow(self) -> Any:
        """A ``pyarrow.Table`` with the same columns (for Parquet / pandas inspection)."""
        import pyarrow as pa

        return pa.table(
            {k: pa.array(v.tolist() if v.dtype == object else v) for k, v in self.columns().items()}
        )


def dense_ids(name: str, values: Iterable[Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """``(ids, labels)`` for a column of string ids, None for any other column.

    ``ids`` ``[R]`` int64 numbers the distinct strings 0, 1, 2, ... in order of first
    appearance; ``labels`` ``[R]`` object holds the strings. A column mixing strings with
    other values is a :class:`StepTableError` naming the first row that breaks the kind of
    row 0.
    """
    raw = values.tolist() if isinstance(values, np.ndarray) else list(values)
    is_str = [isinstance(v, str) for v in raw]
    if not raw or not any(is_str):
        return None
    if not all(is_str):
        i = is_str.index(not is_str[0])
        want = "a string like row 0" if is_str[0] else "an integer like row 0"
        raise StepTableError(f"row {i}: field {name!r} must be {want}, got {raw[i]!r}")
    first: dict[str, int] = {}
    ids = np.fromiter((first.setdefault(v, len(first)) for v in raw), np.int64, len(raw))
    labels = np.empty(len(raw), dtype=object)
    labels[:] = raw
    return ids, labels


def _with_dense_ids(columns: Mapping[str, Any]) -> dict[str, Any]:
    """``columns`` with string ``group`` / ``traj`` mapped by :func:`dense_ids`."""
    out = dict(columns)
    for name, label in _LABELS.items():
        if name not in columns:
            continue
        mapped = dense_ids(name, columns[name])
        if mapped is None:
            continue
        if label in columns and any(v != "" for v in columns[label]):
            raise StepTableError(f"field {name!r} holds strings, so {label!r} cannot be given")
        out[name], out[label] = mapped
    return out


# Float columns that hold a 0/1 outcome: Python and numpy bools are taken as 0.0 / 1.0 there
# (``success=True``), while a bool in any other number column (a reward, a turn) is an error.
_OUTCOME_FLAGS = frozenset({"success"})


def _coerce(name: str, kind: str, values: Iterable[Any]) -> np.ndarray:
    raw = values if isinstance(values, np.ndarray) else list(values)
    if kind == "str":
        arr = np.asarray(raw, dtype=object) if not isinstance(raw, np.ndarray) else raw
        if arr.dtype.kind == "U":
            arr = arr.astype(object)
        for i, v in enumerate(arr):
            if not isinstance(v, str):
                raise StepTableError(
                    f"row {i}: field {name!r} must be a string, got {type(v).__name__}"
                )
        out = np.empty(len(arr), dtype=object)
        out[:] = list(arr)
        return out
    if kind == "float" and name in _OUTCOME_FLAGS:  # success=False reads as 0.0
        if isinstance(raw, np.ndarray) and raw.dtype == np.bool_:
            raw = raw.astype(np.float64)
        elif not isinstance(raw, np.ndarray):
            raw = [float(v) if isinstance(v, (bool, np.bool_)) else v for v in raw]
    if isinstance(raw, np.ndarray):
        if kind == "int" and raw.dtype.kind in "iu":
            return raw.astype(np.int64)
        if kind == "float" and raw.dtype.kind in "iuf" and raw.dtype != np.bool_:
            return raw.astype(np.float64)
        if kind == "bool" and raw.dtype == np.bool_:
            return raw.copy()
        raw = raw.tolist()
    checks = {
        "int": lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)),
        "float": lambda v: (
            isinstance(v, (int, float, np.integer, np.floating))
            and not isinstance(v, (bool, np.bool_))
        ),
        "bool": lambda v: (
            isinstance(v, (bool, np.bool_)) or (isinstance(v, (int, np.integer)) and v in (0, 1))
        ),
    }
    for i, v in enumerate(raw):
        if not checks[kind](v):
            want = {"int": "an integer", "float": "a number", "bool": "a boolean"}[kind]
            raise StepTableError(f"row {i}: field {name!r} must be {want}, got {v!r}")
        if kind == "float" and isinstance(v, float) and math.isnan(v):
            raise StepTableError(f"row {i}: field {name!r} is NaN")
    return np.asarray(raw, dtype=_DTYPES[kind]).reshape(len(raw))


def _following_anchor(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """next_anchor default: the anchor of the next turn of the same trajectory, else ""."""
    traj, turn, anchor = arrays["traj"], arrays["turn"], arrays["anchor"]
    n = len(traj)
    out = np.full(n, "", dtype=object)
    if n == 0:
        return out
    order = np.lexsort((turn, traj))
    same = traj[order][1:] == traj[order][:-1]
    out[order[:-1][same]] = anchor[order[1:][same]]
    return out
