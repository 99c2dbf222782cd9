"""The "GraphGPO + shaping" control: the scorer's rubric information passed through rewards.

MCGPO reads rubric progress (C, F) to match contexts. The paper's control gives GraphGPO the
same scorer information as a shaped step reward instead, so that a gain of MCGPO over it
cannot come from the extra information alone (seed: Qwen3 WebShop rows). The shaped reward
of a row is its environment reward plus the rubric progress the action made:

    r'_t = r_t + coef * (P(s_{t+1}) - P(s_t))          P = progress_value in [0, 1]

This is potential-based shaping (Ng, Harada & Russell 1999) with gamma = 1: over a
trajectory the bonus telescopes to coef * (P_final - P_0), so the ranking of complete
trajectories by return changes only through the progress they reached.

Where it enters GraphGPO (the ``graphgpo_shaping`` algorithm of
:mod:`mcgpo.training.algorithms` runs ``estimate("graphgpo", shape_rewards(table, coef),
progress_coef=coef)``), the increment of a row reaches both terms:

* the episode term A^E uses the trajectory return, i.e. the sum of the shaped rewards;
* the step term A^G: the row's graph return R^G (built from distances to the success sink)
  gets ``+ coef * (P(s') - P(s))`` before it is normalised over the rows that leave the
  same anchor, so an action that made rubric progress ranks above a sibling's that did not
  even where the distances tie (GraphGPO's ``progress_coef``).

The success column itself is never changed, so the success sink, the distances and every
success statistic stay those of the environment.

Departure from the seed: the paper's shaping coefficient is unknown; the default
``coef = 1.0`` makes the largest total bonus (1.0) a tenth of the success reward (10).
"""

from __future__ import annotations

import numpy as np

from mcgpo.options import check_number
from mcgpo.steps import StepTable

__all__ = ["SHAPING_COEF", "shape_rewards"]

SHAPING_COEF = 1.0  # the largest total bonus (1.0) is a tenth of the success reward (10)


def shape_rewards(table: StepTable, coef: float = SHAPING_COEF) -> StepTable:
    """A copy of ``table`` whose ``reward`` column carries the progress bonus (see above)."""
    if not isinstance(table, StepTable):
        raise TypeError(f"shape_rewards expects a StepTable, got {type(table).__name__}")
    check_number("shape_rewards: 'coef'", coef, low=0)
    bonus = coef * (table.next_progress_value - table.progress_value)
    return table.with_columns(reward=np.asarray(table.reward + bonus, dtype=np.float64))
