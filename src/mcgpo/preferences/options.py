"""Options of the MCGPO preference builder: one frozen dataclass, each default defined once.

The paper's values of kappa, epsilon, q_level and lambda_pair (its Appendix A / Table 6) are
not available; the defaults below are this library's choices, argued in
docs/algorithms/mcgpo.md ("Hyper-parameters"). ``lambda_pair`` belongs to the loss and lives
in :mod:`mcgpo.objectives` (``LAMBDA_PAIR``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["EVIDENCE_MODES", "MATCHING_MODES", "WEIGHTING_MODES", "PreferenceOptions"]

EVIDENCE_MODES = ("opposite_fold", "same_fold", "pooled")
WEIGHTING_MODES = ("evidence", "uniform")
MATCHING_MODES = ("joint", "state_only", "rubric_only")


@dataclass(frozen=True)
class PreferenceOptions:
    """Every option of :func:`mcgpo.build_preferences`; validated on construction."""

    group_size: int = 8  # N: rollouts per group (even); slots are 0..N-1
    fold_split: int | None = None  # slots < fold_split form fold 0; None -> N / 2
    min_support: int = 1  # m: evidence trajectories each action needs
    epsilon: float = 0.25  # keep a pair only if |Delta_u| >= epsilon
    kappa: float = 0.0  # shrinkage prior count in n / (n + kappa); swept (docs/results §3)
    q_exact: float = 1.0  # q_level for pairs resolved by the exact rule
    q_coarse: float = 1.0  # q_level for pairs resolved by the coarse rule; swept
    max_per_fold: int | None = 2  # preferences kept per fold; None = no cap
    evidence: str = "opposite_fold"  # which trajectories label a fold's pairs
    weighting: str = "evidence"  # c = |Delta_u| n/(n+kappa) q_level, or "uniform": c = q_level
    matching: str = "joint"  # context key: (h, C, F), (h,) or (C, F)

    def __post_init__(self) -> None:
        n = self.group_size
        if not _is_int(n) or n < 2 or n % 2:
            raise ValueError(
                f"build_preferences: 'group_size' must be an even integer >= 2, got {n!r}"
            )
        split = self.fold_split
        if split is not None and (not _is_int(split) or not 1 <= split <= n - 1):
            raise ValueError(
                f"build_preferences: 'fold_split' must be an integer in [1, {n - 1}] "
                f"(group_size {n}), got {split!r}"
            )
        if not _is_int(self.min_support) or self.min_support < 1:
            raise ValueError(
                f"build_preferences: 'min_support' must be an integer >= 1, got {self.min_support!r}"
            )
        for name in ("epsilon", "kappa", "q_exact", "q_coarse"):
            value = getattr(self, name)
            if not _is_number(value) or value < 0:
                raise ValueError(
                    f"build_preferences: {name!r} must be a finite number >= 0, got {value!r}"
                )
        if self.epsilon > 1:
            raise ValueError(
                "build_preferences: 'epsilon' must be <= 1 (success gaps lie in [0, 1]), "
                f"got {self.epsilon!r}"
            )
        cap = self.max_per_fold
        if cap is not None and (not _is_int(cap) or cap < 1):
            raise ValueError(
                f"build_preferences: 'max_per_fold' must be an integer >= 1 or None, got {cap!r}"
            )
        for name, allowed in (
            ("evidence", EVIDENCE_MODES),
            ("weighting", WEIGHTING_MODES),
            ("matching", MATCHING_MODES),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(
                    f"build_preferences: unknown {name} mode {value!r}; "
                    f"choose one of {', '.join(allowed)}"
                )

    @property
    def split(self) -> int:
        """Number of slots in fold 0 (slots ``< split``); fold 1 holds the rest."""
        return self.group_size // 2 if self.fold_split is None else self.fold_split

    @classmethod
    def from_kwargs(cls, options: dict[str, Any]) -> PreferenceOptions:
        """Build from keyword options; an unknown name is a one-line ValueError."""
        known = [f.name for f in fields(cls)]
        for name in options:
            if name not in known:
                raise ValueError(
                    f"build_preferences: unknown option {name!r}; options: {', '.join(known)}"
                )
        return cls(**options)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )
