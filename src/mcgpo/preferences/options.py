"""Options of the MCGPO preference builder: one frozen dataclass, each default defined once.

The paper's values of kappa, epsilon, q_level and lambda_pair (its Appendix A / Table 6) are
not available; the defaults below are this library's choices, argued in
docs/algorithms/mcgpo.md ("Hyper-parameters"). ``lambda_pair`` belongs to the loss: its default
is ``algo.lambda_pair`` in :mod:`mcgpo.training.config` (``LAMBDA_PAIR``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mcgpo.options import Options, is_int, option

__all__ = [
    "BLEND_MODES",
    "COARSE_ACTION_MODES",
    "EVIDENCE_MODES",
    "MATCHING_MODES",
    "SUPPORT_MODES",
    "WEIGHTING_MODES",
    "PreferenceOptions",
]

EVIDENCE_MODES = ("opposite_fold", "same_fold", "pooled", "leave_pair_out")
WEIGHTING_MODES = ("evidence", "uniform", "beta")
MATCHING_MODES = ("joint", "state_only", "rubric_only")
COARSE_ACTION_MODES = ("coarse", "exact")
SUPPORT_MODES = ("direct", "successor")
BLEND_MODES = ("first", "inverse_variance")


@dataclass(frozen=True)
class PreferenceOptions(Options):
    """Every option of :func:`mcgpo.build_preferences`; validated on construction."""

    OWNER = "build_preferences"
    LABEL = "{owner}: {name!r}"
    UNKNOWN = "{owner}: unknown option {name!r}; options: {known}"

    group_size: int = option(8, "N: rollouts per group, the recipes' 8 (even; slots 0..N-1)")
    fold_split: int | None = option(None, "slots below it form fold 0; None: N / 2, equal folds")
    min_support: int = option(1, "m: evidence trajectories each action needs; 1 keeps coverage")
    epsilon: float = option(0.25, "keep a pair only if |Delta_u| >= epsilon: one success in four")
    kappa: float = option(
        1.0, "prior count in n / (n + kappa): a one-trajectory action counts half"
    )
    q_exact: float = option(1.0, "q_level of pairs the exact rule resolves: the reference level")
    q_coarse: float = option(0.5, "q_level of coarse pairs: pooled instances are weaker evidence")
    max_per_fold: int | None = option(2, "preferences kept per fold (the seed's two); None: no cap")
    evidence: str = option(
        "opposite_fold",
        "the other fold labels a fold's pairs (cross-fitting); leave_pair_out: any two siblings, "
        "labelled by the other N - 2",
    )
    weighting: str = option(
        "evidence",
        "c = |Delta_u| n/(n+kappa) q_level; uniform: c = q_level; beta: c = (2 P(u+ > u-) - 1) "
        "q_level under Beta posteriors (prior: kappa pseudo-trajectories at the context's rate)",
    )
    matching: str = option("joint", "context key (h, C, F); state_only: (h,), rubric_only: (C, F)")
    coarse_actions: str = option(
        "coarse", "coarse rule drops actions' instance numbers as h_coarse does; exact: keeps them"
    )
    support: str = option(
        "direct",
        "evidence for an action: the held-out trajectories that took it at the context; "
        "successor: also those that visited the state it leads to (the next turn's key)",
    )
    blend: str = option(
        "first",
        "the first rule level with support labels a pair; inverse_variance: the supported "
        "levels' values blended by 1 / (Beta posterior variance)",
    )

    def __post_init__(self) -> None:
        n = self.group_size
        if not (is_int(n) and n >= 2 and n % 2 == 0):
            self.fail("group_size", "an even integer >= 2")
        want = f"an integer in [1, {n - 1}] (group_size {n})"
        self.integer("fold_split", low=1, high=n - 1, none_ok=True, want=want)
        self.integer("min_support", low=1)
        for name in ("epsilon", "kappa", "q_exact", "q_coarse"):
            self.number(name, low=0)
        self.number("epsilon", high=1, want="<= 1 (success gaps lie in [0, 1])")
        self.integer("max_per_fold", low=1, none_ok=True)
        for name, allowed in (
            ("evidence", EVIDENCE_MODES),
            ("weighting", WEIGHTING_MODES),
            ("matching", MATCHING_MODES),
            ("coarse_actions", COARSE_ACTION_MODES),
            ("support", SUPPORT_MODES),
            ("blend", BLEND_MODES),
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
