"""Episode-level pieces shared by the estimators, built on :mod:`mcgpo.grouping`.

Returns, scores and the trajectory-level group advantage A^E (GiGPO Eq. 3), the discounted
step return (GiGPO Eq. 5), and the declarations of the options several estimators share
(each default and its reason written once, here). Two conventions are fixed:

* Singletons. At episode level a group with one member keeps its raw score (mean 0, std 1),
  as the reference code does; step-level groups give 0 to a one-member group
  (:func:`mcgpo.grouping.normalise`, ``singleton="zero"``).
* Std. Unbiased sample std (``ddof=1``) unless an estimator says otherwise (HGPO's step
  groups); ``eps`` is added to the std before dividing. Float noise follows the one rule of
  :mod:`mcgpo.grouping`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mcgpo.grouping import (
    EPS,
    MODES,
    Mode,
    codes,
    group_stats,
    normalise,
    trajectory_view,
)
from mcgpo.options import option
from mcgpo.steps import StepTable

__all__ = [
    "EPS",
    "MODES",
    "Mode",
    "codes",
    "cross_steps_option",
    "discounted_returns",
    "episode_advantage",
    "episode_scores",
    "eps_option",
    "gamma_option",
    "group_stats",
    "normalise",
    "penalty_option",
    "trajectory_returns",
]


# ---------------------------------------------------------------------- shared options
def gamma_option() -> Any:
    """``gamma``: the discount of the step return R_t."""
    return option(0.95, "discount of the step return R_t (GiGPO Eq. 5, the published recipes)")


def penalty_option() -> Any:
    """``invalid_penalty``: the deduction on a row whose action was invalid."""
    return option(0.1, "deducted from a row whose action was invalid (verl-agent's 0.1)")


def cross_steps_option() -> Any:
    """``cross_steps``: where the episode statistics are taken."""
    return option(
        False, "episode statistics once per trajectory (paper); True: over step rows (code)"
    )


def eps_option() -> Any:
    """``eps``: added to the std before dividing."""
    return option(EPS, "added to the std before dividing (verl-agent's epsilon)")


# ---------------------------------------------------------------------- returns and A^E
def trajectory_returns(table: StepTable) -> np.ndarray:
    """Per-row episode return R(tau): the sum of the rewards of the row's trajectory."""
    t = codes(table.traj)
    total = np.bincount(t, weights=table.reward)
    return total[t]


def episode_scores(table: StepTable, invalid_penalty: float) -> np.ndarray:
    """Per-row episode score S_r = R(tau) - invalid_penalty * [row's action invalid].

    The penalty is applied to the row itself (verl-agent ``apply_invalid_action_penalty``),
    after the return is computed, and is not discounted backward.
    """
    return trajectory_returns(table) - invalid_penalty * (~table.action_valid)


def episode_advantage(
    table: StepTable, *, mode: Mode, cross_steps: bool, invalid_penalty: float, eps: float
) -> np.ndarray:
    """Trajectory-level group-relative advantage A^E, one value per row (GiGPO Eq. 3).

    ``cross_steps=False``: the group mean / std are taken over trajectories, each counted
    once with its return R(tau); each row then gets
    ``(R(tau) - mean) / (std + eps) - invalid_penalty * [row invalid]``: the penalty is
    a per-row deduction outside the normalisation (the statistics do not contain it).
    ``cross_steps=True``: the references' convention, statistics over all step rows of
    the group using the per-row scores S_r, so long trajectories weigh more.
    A group with a single member keeps its raw score (mean 0, std 1), as in the reference.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    g = codes(table.group)
    if cross_steps:
        scores = episode_scores(table, invalid_penalty)
        return normalise(scores, g, mode=mode, singleton="raw", eps=eps)
    # statistics once per trajectory: R(tau) is the same on all rows of a trajectory.
    # The statistics hold returns without penalty, so the penalty is subtracted after
    # normalising: dividing it by a std it is not part of would turn -0.1 into -0.1/eps
    # in every group whose trajectories share one return (e.g. all fail).
    view = trajectory_view(table)
    per_traj = normalise(
        trajectory_returns(table)[view.head], g[view.head], mode=mode, singleton="raw", eps=eps
    )
    return per_traj[view.traj] - invalid_penalty * (~table.action_valid)


def discounted_returns(table: StepTable, gamma: float) -> np.ndarray:
    """Step return R_t = sum_{k>=t} gamma^(k-t) r_k inside each trajectory (GiGPO Eq. 5).

    Vectorised over trajectories: rows are laid into a [n_traj, T_max] matrix and the
    backward recursion runs over the T_max columns.
    """
    n = len(table)
    out = np.zeros(n)
    if n == 0:
        return out
    t = codes(table.traj)
    n_traj = int(t.max()) + 1
    t_max = int(table.turn.max()) + 1
    mat = np.zeros((n_traj, t_max))
    mat[t, table.turn] = table.reward
    ret = np.zeros((n_traj, t_max))
    running = np.zeros(n_traj)
    for k in range(t_max - 1, -1, -1):
        running = mat[:, k] + gamma * running
        ret[:, k] = running
    return ret[t, table.turn]
