"""The names each named choice of the update takes, defined once and free of torch.

``train.kl_kind``, ``train.rollout_correction`` (and its ``_level``), ``train.precision`` and
``train.compile`` name code that needs torch (:mod:`mcgpo.objectives`, :mod:`mcgpo.policy`).
The names live here, below both, so that the run configuration checks a value before
anything heavy is imported (a bad ``--train.kl_kind`` is a one-line error that loads no
torch) while the code that implements each choice imports them from here and names them
too (``mcgpo.objectives.KL_KINDS`` is this module's tuple).
"""

from __future__ import annotations

__all__ = [
    "COMPILE_SETTINGS",
    "KL_KINDS",
    "PRECISIONS",
    "ROLLOUT_CORRECTIONS",
    "ROLLOUT_CORRECTION_LEVELS",
]

# The KL-to-reference estimators (mcgpo.objectives.kl_penalty); k3 = low_var_kl, k1 = kl,
# k2 = mse.
KL_KINDS = ("low_var_kl", "k3", "kl", "k1", "mse", "k2", "abs")
# The rollout correction (mcgpo.objectives.correction): train.rollout_correction (with
# "auto") and train.rollout_correction_level.
ROLLOUT_CORRECTIONS = ("none", "tis", "mis")
ROLLOUT_CORRECTION_LEVELS = ("token", "sequence")
# The weights' and the compute's precision (mcgpo.policy.precision).
PRECISIONS = ("fp32", "bf16-mixed", "bf16")
# train.compile (mcgpo.policy.compile): auto compiles on CUDA only (on a CPU the compile time
# outweighs the gain for the tiny models that train there).
COMPILE_SETTINGS = ("auto", "true", "false")
