"""Progress-conditioned GPO: first-visit coverage replaces the outcome signal in all-fail groups.

Yang et al., "Progress-conditioned Group Policy Optimization for Long-Horizon Agentic Tasks",
arXiv 2607.22724. Only the abstract is public: in groups where every rollout failed, the
outcome advantage (all zero) is replaced by a first-visit observation-coverage signal; any
other group keeps the normal outcome-based estimator. The coverage score follows the
third-party implementation ``lcp2021211/cp-longhorizon-grpo`` (facts, not code):

    P_i = C_i / T_i     C_i = actions of trajectory i whose next observation was not yet seen
                              in that trajectory (its initial observation pre-inserted)
                        T_i = actions of trajectory i
    A_i = lam * (P_i - mean_g P) / (std_g P + eps)     in all-fail groups; 0 if std_g P = 0
    A   = base estimator's advantage                   elsewhere

Choices the abstract leaves open (docs/algorithms/progress_gpo.md):
* ``lam`` defaults to 1.0, so the coverage z-score has a GRPO advantage's unit scale. The
  third-party repo uses 0.3 x (share of all-fail groups in the update): their choice, not
  verified against the paper; ``lam=0.3, scale_by_fail_share=True`` reproduces it.
* The coverage advantage is per trajectory, broadcast to its rows (like GRPO).
* "Failed" reads the ``success`` flag, not the rewards, so reward shaping cannot hide a
  failure; "observation" is the exact ``anchor`` / ``next_anchor`` text.
* ``combine="replace"`` (default) overwrites the base advantage in all-fail groups; "add"
  keeps it (e.g. GraphGPO's invalid-action ranking) and adds the coverage term.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from mcgpo.advantages.gigpo import GigpoOptions, gigpo
from mcgpo.advantages.graphgpo import GraphgpoOptions, graphgpo
from mcgpo.advantages.groups import eps_option
from mcgpo.advantages.grpo import GrpoOptions, grpo
from mcgpo.grouping import codes, group_stats, normalise, trajectory_view
from mcgpo.options import Options, option
from mcgpo.steps import StepTable

__all__ = [
    "BASES",
    "Base",
    "ProgressGpoOptions",
    "all_fail_groups",
    "first_visit_coverage",
    "progress_gpo",
]


class Base(NamedTuple):
    """A base estimator progress_gpo can sit on: its function and its options class."""

    estimator: Callable[..., tuple[np.ndarray, dict[str, float]]]
    options: type[Options]


BASES: dict[str, Base] = {
    "grpo": Base(grpo, GrpoOptions),
    "gigpo": Base(gigpo, GigpoOptions),
    "graphgpo": Base(graphgpo, GraphgpoOptions),
}
COMBINES = ("replace", "add")


@dataclass(frozen=True)
class ProgressGpoOptions(Options):
    """Options of :func:`progress_gpo` (docs/algorithms/progress_gpo.md)."""

    OWNER = "progress_gpo"

    base: str = option("grpo", "the outcome estimator of the abstract's other groups: GRPO")
    base_options: Mapping[str, Any] | None = option(None, "the base's options; None: its defaults")
    lam: float = option(1.0, "coverage z-score at a GRPO advantage's unit scale")
    scale_by_fail_share: bool = option(False, "a fixed lam; True: lam x share of all-fail groups")
    combine: str = option(
        "replace", "all-fail groups take the coverage term in place of the base's"
    )
    eps: float = eps_option()

    def __post_init__(self) -> None:
        self.choice("base", BASES)
        if self.base_options is not None and not isinstance(self.base_options, Mapping):
            raise ValueError(
                f"progress_gpo: option 'base_options' must be a dict, "
                f"got {type(self.base_options).__name__}"
            )
        known = BASES[self.base].options.names()
        for name in sorted(self.base_options or {}):
            if name not in known:
                raise ValueError(
                    f"progress_gpo: unknown base option {name!r} for base {self.base!r}; "
                    f"options: {', '.join(sorted(known))}"
                )
        self.number("lam")
        self.flag("scale_by_fail_share")
        self.choice("combine", COMBINES, want="'replace' or 'add'")
        self.number("eps", low=0, low_open=True)
        self.base_estimator  # noqa: B018 - builds the base's options: their errors come now

    @cached_property
    def base_estimator(self) -> tuple[Callable[..., Any], Options]:
        """The base estimator function and its built options (from :data:`BASES`)."""
        base = BASES[self.base]
        return base.estimator, base.options.from_kwargs(dict(self.base_options or {}))


def first_visit_coverage(table: StepTable) -> np.ndarray:
    """Per-row coverage P_i of the row's trajectory (same value on all its rows), shape [R].

    The observation sequence of a trajectory is o_0 = anchor at turn 0, then o_{t+1} =
    next_anchor at turn t. Action t is new when o_{t+1} first occurs at position t + 1.
    """
    if len(table) == 0:
        return np.zeros(0)
    t = codes(table.traj)
    start = np.flatnonzero(table.turn == 0)
    # the sequence: initial observations at position 0, then each row's next observation
    seq_traj = np.concatenate([t[start], t])
    seq_pos = np.concatenate([np.zeros(len(start), dtype=np.int64), table.turn + 1])
    seq_obs = codes(np.concatenate([table.anchor[start], table.next_anchor]))
    order = np.lexsort((seq_pos, seq_obs, seq_traj))
    first = np.ones(len(order), dtype=bool)
    same = (seq_traj[order][1:] == seq_traj[order][:-1]) & (
        seq_obs[order][1:] == seq_obs[order][:-1]
    )
    first[1:] = ~same
    is_first = np.empty(len(order), dtype=bool)
    is_first[order] = first
    new = is_first[len(start) :]  # one flag per row: its action reached a new observation
    covered = np.bincount(t, weights=new.astype(np.float64))
    actions = np.bincount(t)
    return (covered / actions)[t]


def all_fail_groups(table: StepTable) -> np.ndarray:
    """One flag per task group (in the order of :func:`codes`): no row of it succeeded."""
    g = codes(table.group)
    return np.bincount(g, weights=table.success, minlength=int(g.max()) + 1) == 0


def progress_gpo(
    table: StepTable, options: ProgressGpoOptions | None = None, **kwargs: Any
) -> tuple[np.ndarray, dict[str, float]]:
    """Coverage advantage in all-fail groups, the ``base`` estimator's advantage elsewhere."""
    o = options if options is not None else ProgressGpoOptions.from_kwargs(kwargs)
    fn, base_options = o.base_estimator
    adv, base_stats = fn(table, base_options)
    adv = np.asarray(adv, dtype=np.float64)
    stats = {f"base_{k}": v for k, v in base_stats.items()}
    if len(table) == 0:
        return adv, stats
    g = codes(table.group)
    n_groups = int(g.max()) + 1
    all_fail = all_fail_groups(table)
    # trajectory-level z-score of the coverage inside each all-fail group; a group whose
    # coverage does not vary (or with one trajectory) gets 0
    cover = first_visit_coverage(table)
    view = trajectory_view(table)
    cover_traj, g_traj = cover[view.head], g[view.head]
    z = normalise(cover_traj, g_traj, mode="mean_std_norm", eps=o.eps)[view.traj]
    _, std_t, n_t = group_stats(cover_traj, g_traj)
    spread = np.zeros(n_groups, dtype=bool)
    spread[g_traj] = (std_t > 0) & (n_t > 1)
    fail_share = float(all_fail.mean())
    lam_eff = o.lam * fail_share if o.scale_by_fail_share else o.lam
    progress = lam_eff * z
    adv = np.where(all_fail[g], progress + (adv if o.combine == "add" else 0.0), adv)
    fail_traj = all_fail[g_traj]
    stats.update(
        {
            "groups": float(n_groups),
            "groups_all_fail": float(all_fail.sum()),
            "groups_coverage_used": float((all_fail & spread).sum()),
            "coverage_mean_all_fail": float(cover_traj[fail_traj].mean())
            if fail_traj.any()
            else 0.0,
            "coverage_mean": float(cover_traj.mean()),
            "lam_effective": float(lam_eff),
        }
    )
    return adv, stats
