"""GRPO and RLOO as used in agent training: one trajectory-level advantage per row.

GRPO (GiGPO paper Eq. 3, verl ``compute_grpo_outcome_advantage``):
    A_r = (S_r - mean_g S) / (std_g S + eps)        (``norm_by_std=True``)
    A_r =  S_r - mean_g S                            (``norm_by_std=False``, Dr. GRPO)
RLOO (verl-agent ``compute_rloo_outcome_advantage``, leave-one-out baseline):
    A_r = n / (n - 1) * (S_r - mean_g S) = S_r - mean_{r' != r} S_{r'}
with S_r the row's episode score: the trajectory return minus the invalid-action penalty of
that row. Statistics are taken once per trajectory by default (the papers' form); with
``cross_steps=True`` every step row counts (the reference code's convention), and for RLOO
n is then the number of rows of the group. In the trajectory-once form the statistics hold
the returns R(tau) and the row's penalty is subtracted after normalising / leaving one out.
A group with one member keeps its raw score S_r (reference convention, both estimators).
See docs/algorithms/grpo.md and rloo.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mcgpo.advantages.groups import (
    codes,
    cross_steps_option,
    episode_advantage,
    episode_scores,
    eps_option,
    penalty_option,
)
from mcgpo.grouping import trajectory_view
from mcgpo.options import Options, option
from mcgpo.steps import StepTable

__all__ = ["GrpoOptions", "RlooOptions", "grpo", "rloo"]


@dataclass(frozen=True)
class GrpoOptions(Options):
    """Options of :func:`grpo` (docs/algorithms/grpo.md)."""

    OWNER = "grpo"

    norm_by_std: bool = option(True, "divide by the group std (GRPO); False: Dr. GRPO's mean only")
    cross_steps: bool = cross_steps_option()
    invalid_penalty: float = penalty_option()
    eps: float = eps_option()

    def __post_init__(self) -> None:
        self.flag("norm_by_std")
        self.flag("cross_steps")
        self.number("invalid_penalty")
        self.number("eps", low=0.0, low_open=True)


@dataclass(frozen=True)
class RlooOptions(Options):
    """Options of :func:`rloo` (docs/algorithms/rloo.md)."""

    OWNER = "rloo"

    cross_steps: bool = cross_steps_option()
    invalid_penalty: float = penalty_option()

    def __post_init__(self) -> None:
        self.flag("cross_steps")
        self.number("invalid_penalty")


def grpo(
    table: StepTable, options: GrpoOptions | None = None, **kwargs: Any
) -> tuple[np.ndarray, dict[str, float]]:
    """Group-relative trajectory advantage (GRPO), broadcast to every row of a trajectory."""
    o = options if options is not None else GrpoOptions.from_kwargs(kwargs)
    mode = "mean_std_norm" if o.norm_by_std else "mean_norm"
    adv = episode_advantage(
        table,
        mode=mode,
        cross_steps=o.cross_steps,
        invalid_penalty=o.invalid_penalty,
        eps=o.eps,
    )
    return adv, _episode_stats(table)


def rloo(
    table: StepTable, options: RlooOptions | None = None, **kwargs: Any
) -> tuple[np.ndarray, dict[str, float]]:
    """Leave-one-out baseline: A = n/(n-1) (x - mean) - penalty; a one-member group keeps S.

    Trajectory-once (default): x = R(tau), n = trajectories, and the row's penalty is
    subtracted outside, so A_r = S_r - mean_{j != i} R_j exactly. ``cross_steps=True``:
    x = S_r over the n rows of the group (the penalty is inside the leave-one-out mean).
    A group with one member keeps its raw score S_r, as the reference code does.
    """
    o = options if options is not None else RlooOptions.from_kwargs(kwargs)
    scores = episode_scores(table, o.invalid_penalty)
    penalty = o.invalid_penalty * (~table.action_valid)
    g = codes(table.group)
    if o.cross_steps:
        counts = np.bincount(g)  # every step row counts
        n = counts[g].astype(np.float64)
        mean = np.bincount(g, weights=scores)[g] / n
        adv = n / np.maximum(n - 1, 1) * (scores - mean)
    else:
        head = trajectory_view(table).head
        returns = scores + penalty  # R(tau) per row
        n_g = np.bincount(g[head], minlength=int(g.max(initial=-1)) + 1)
        sum_g = np.bincount(g[head], weights=returns[head], minlength=len(n_g))
        n, mean = n_g[g].astype(np.float64), sum_g[g] / np.maximum(n_g[g], 1)
        adv = n / np.maximum(n - 1, 1) * (returns - mean) - penalty
    return np.where(n > 1, adv, scores), _episode_stats(table)


def _episode_stats(table: StepTable) -> dict[str, float]:
    if len(table) == 0:
        return {"groups": 0.0, "trajectories": 0.0}
    head = trajectory_view(table).head
    g = codes(table.group)
    succ = table.success[head]
    gs = np.bincount(g[head], weights=succ) / np.bincount(g[head])
    return {
        "groups": float(g.max() + 1),
        "trajectories": float(len(head)),
        "success_rate": float(succ.mean()),
        "groups_all_success": float(np.mean(gs == 1.0)),
        "groups_all_fail": float(np.mean(gs == 0.0)),
    }
