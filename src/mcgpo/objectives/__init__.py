"""Per-token objectives (torch): the losses, the rollout-correction weights and the
micro-batch planner, one module each.

* :mod:`mcgpo.objectives.losses`: PPO-clip with dual clip, KL estimators, entropy, the task
  loss, MCGPO's pair score d and pair loss (the formulas are in its docstring).
* :mod:`mcgpo.objectives.correction`: TIS / MIS importance weights pi_old / mu for tokens a
  behaviour policy (vLLM) sampled, and their statistics pooled over ranks.
* :mod:`mcgpo.objectives.micro_batches`: micro-batches that keep pair partners together.

Everything public is importable from ``mcgpo.objectives`` itself.
"""

from mcgpo.objectives.correction import (
    CORRECTION_SUMS,
    ROLLOUT_CORRECTION_LEVELS,
    ROLLOUT_CORRECTIONS,
    correction_stats_from_sums,
    rollout_correction_sums,
    rollout_correction_weights,
)
from mcgpo.objectives.losses import (
    KL_KINDS,
    entropy_from_logits,
    kl_penalty,
    masked_mean,
    pair_loss,
    policy_loss,
    response_log_ratio,
    task_loss,
)
from mcgpo.objectives.micro_batches import MicroBatchPlan, plan_micro_batches

__all__ = [
    "CORRECTION_SUMS",
    "KL_KINDS",
    "ROLLOUT_CORRECTIONS",
    "ROLLOUT_CORRECTION_LEVELS",
    "MicroBatchPlan",
    "correction_stats_from_sums",
    "entropy_from_logits",
    "kl_penalty",
    "masked_mean",
    "pair_loss",
    "plan_micro_batches",
    "policy_loss",
    "response_log_ratio",
    "rollout_correction_sums",
    "rollout_correction_weights",
    "task_loss",
]
