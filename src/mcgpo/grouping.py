"""Grouping primitives: dense codes from values, one row per trajectory, one group normaliser.

Every estimator and the preference builder group rows by column *values* (never by row
positions or uuids), so no result depends on row order. The three pieces here are the only
implementation of that idea:

* :func:`value_codes` / :func:`codes` / :func:`combine_codes`: dense integer codes that are
  the ranks of the sorted distinct values (tuples of columns rank lexicographically). String
  columns are coded through Python's own comparison, so values that differ only by trailing
  NUL characters stay distinct (numpy's unicode cast would drop them).
* :func:`trajectory_view`: the trajectory code of each row and one representative row per
  trajectory, for fields that are constant along a trajectory (return, success, group).
* :func:`normalise`: ``x - mean_g`` or ``(x - mean_g) / (std_g + eps)`` over the rows of each
  group. The float-noise rule, stated once: a deviation ``|x - mean_g|`` no larger than
  ``SNAP = 1e-9`` times the group's largest ``|x|`` is set to exactly 0 before the std is
  taken. So a group whose members share one value gives exactly 0 in any row order (a float
  sum would leave ~1e-16 of noise, which ``1 / eps`` turns into ~1e-10).
  :func:`group_stats`, which returns the means themselves, gives a group of equal values
  exactly that value as mean and exactly 0 as std.

Bottom layer: imports nothing from mcgpo but :mod:`mcgpo.steps`.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np

from mcgpo.steps import StepTable

__all__ = [
    "EPS",
    "MODES",
    "SNAP",
    "Mode",
    "TrajectoryView",
    "codes",
    "combine_codes",
    "group_stats",
    "normalise",
    "representative_rows",
    "trajectory_view",
    "value_codes",
]

EPS = 1e-6  # added to the std before dividing (verl-agent's epsilon)
SNAP = 1e-9  # relative size under which a deviation from the group mean counts as exactly 0
Mode = Literal["mean_norm", "mean_std_norm"]
MODES = ("mean_norm", "mean_std_norm")


# ---------------------------------------------------------------------- codes
def value_codes(column: np.ndarray) -> np.ndarray:
    """Rank of each entry among the sorted distinct values of ``column``: ``[R]`` -> ``[R]`` int64.

    Object (string) columns: the distinct values are ranked by Python's own ordering and
    each entry looked up in a dict, O(R) plus a sort of the distinct values only, exact for
    any string.
    """
    column = np.asarray(column)
    if column.dtype != object:
        return np.unique(column.reshape(-1), return_inverse=True)[1].reshape(-1).astype(np.int64)
    values = column.reshape(-1).tolist()
    rank = {v: i for i, v in enumerate(sorted(set(values)))}
    return np.fromiter(map(rank.__getitem__, values), dtype=np.int64, count=len(values))


def combine_codes(*columns: np.ndarray) -> np.ndarray:
    """Dense codes of the tuples of non-negative integer codes, lexicographic by column.

    One int64 key per tuple where it fits (a 1-D unique is fast), else a row-wise unique.
    """
    out = np.asarray(columns[0], dtype=np.int64).reshape(-1)
    for col in columns[1:]:
        col = np.asarray(col, dtype=np.int64).reshape(-1)
        if len(out) == 0:
            return np.zeros(0, dtype=np.int64)
        width = int(col.max()) + 1
        if (int(out.max()) + 1) * width < 2**62:
            out = np.unique(out * width + col, return_inverse=True)[1]
        else:
            out = np.unique(np.stack([out, col], axis=1), axis=0, return_inverse=True)[1]
        out = out.reshape(-1).astype(np.int64)
    return out


def codes(*columns: np.ndarray) -> np.ndarray:
    """Dense code per row for the combination of the value columns (each ``[R]``)."""
    if not columns:
        raise ValueError("codes() needs at least one column")
    return combine_codes(*(value_codes(col) for col in columns))


# ---------------------------------------------------------------------- trajectories
class TrajectoryView(NamedTuple):
    """Rows seen per trajectory."""

    traj: np.ndarray  # [R] int64  dense trajectory code of each row (rank of the traj id)
    head: np.ndarray  # [T] int64  one row index per trajectory, in code order

    @property
    def count(self) -> int:
        """Number of trajectories T."""
        return len(self.head)


def trajectory_view(table: StepTable) -> TrajectoryView:
    """Trajectory code per row and one representative row per trajectory.

    The representative is any row of the trajectory (the last in table order): use it only
    for fields that are constant along a trajectory (its return, ``success``, ``group``).
    """
    traj = value_codes(table.traj)
    return TrajectoryView(traj, representative_rows(traj))


def representative_rows(code: np.ndarray) -> np.ndarray:
    """One row index per code 0..K-1 (the last row holding it): ``[R]`` -> ``[K]`` int64."""
    head = np.zeros(int(code.max(initial=-1)) + 1, dtype=np.int64)
    head[code] = np.arange(len(code))
    return head


# ---------------------------------------------------------------------- statistics
def group_stats(
    values: np.ndarray, group: np.ndarray, *, unbiased: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row mean, std and count of ``values`` over the rows sharing the ``group`` code.

    ``group`` holds dense codes (see :func:`codes`). A one-member group has std 0; a group
    whose values are all equal gets exactly that value as mean and exactly 0 as std.
    ``unbiased``: sample std (ddof = 1), else population std. Shapes: ``[R]`` -> ``[R]`` x 3.
    """
    values = np.asarray(values, dtype=np.float64)
    n_groups = int(group.max(initial=-1)) + 1
    count = np.bincount(group, minlength=n_groups)
    mean = _exact_means(values, group, count)
    centred = values - mean[group]
    sq = np.bincount(group, weights=centred * centred, minlength=n_groups)
    dof = count - 1 if unbiased else count
    var = np.where(dof > 0, sq / np.maximum(dof, 1), 0.0)
    return mean[group], np.sqrt(var)[group], count[group]


def normalise(
    values: np.ndarray,
    group: np.ndarray,
    *,
    mode: Mode = "mean_std_norm",
    unbiased: bool = True,
    singleton: Literal["zero", "raw"] = "zero",
    eps: float = EPS,
) -> np.ndarray:
    """Group-normalised values: ``x - mean_g`` (mean_norm) or ``(x - mean_g) / (std_g + eps)``.

    Deviations follow the module's float-noise rule. A one-member group gives 0
    (``singleton="zero"``, the step-level rule) or keeps its raw value as if its mean were 0
    and its std 1 (``"raw"``, the references' episode-level rule).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    values = np.asarray(values, dtype=np.float64)
    n_groups = int(group.max(initial=-1)) + 1
    count = np.bincount(group, minlength=n_groups)
    # the plain mean suffices: in a group of equal values its rounding error is far below SNAP
    mean = np.bincount(group, weights=values, minlength=n_groups) / np.maximum(count, 1)
    dev = values - mean[group]
    scale = np.zeros(n_groups)
    np.maximum.at(scale, group, np.abs(values))
    dev[np.abs(dev) <= SNAP * scale[group]] = 0.0
    single = count[group] <= 1
    if mode == "mean_std_norm":
        dof = count - 1 if unbiased else count
        var = np.where(dof > 0, np.bincount(group, weights=dev * dev, minlength=n_groups), 0.0)
        dev = dev / (np.sqrt(var / np.maximum(dof, 1))[group] + eps)
    if singleton == "zero":
        return np.where(single, 0.0, dev)
    raw = values / ((1.0 - eps) + eps) if mode == "mean_std_norm" else values
    return np.where(single, raw, dev)


def _exact_means(values: np.ndarray, group: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Mean per group; exactly the shared value where all of a group's values are equal."""
    n_groups = len(count)
    total = np.bincount(group, weights=values, minlength=n_groups)
    lo = np.full(n_groups, np.inf)
    hi = np.full(n_groups, -np.inf)
    np.minimum.at(lo, group, values)
    np.maximum.at(hi, group, values)
    return np.where(lo == hi, lo, total / np.maximum(count, 1))
