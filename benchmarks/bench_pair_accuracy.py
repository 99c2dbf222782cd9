"""Are MCGPO's preferences right? Pair accuracy against Monte-Carlo ground truth.

    cd benchmarks && python bench_pair_accuracy.py [--groups 32 | --budget 1024] [--sizes 8 16]
                     [--k 16] [--noise 0.2 0.4 0.6] [--envs household webshop]
                     [--value success] [--variants | --variants-only]
                     [--model FOLDER [--preset household-mid] [--seed 0]]

Rollouts are those of bench_coverage.py (noisy-expert siblings, ``play_group``): no model is
trained or sampled. Both environments are deterministic given the task seed and the action
sequence, so a row's state is reached again by replaying its trajectory's actions before its
turn. For every preference pair (row+ preferred over row-) the ground truth is a Monte-Carlo
estimate Q(s, a) = mean success over ``k`` continuations: replay the row's prefix, take the
action, then let the same noisy expert finish the episode with fresh random streams.

* own state:  Q(s+, a+) against Q(s-, a-), each action from its own row's state;
* same state: Q(s+, a+) against Q(s+, a-), the rejected action taken from the preferred row's
  state (only where a- is admissible there): matched contexts claim the two states are the
  same, and this compares the actions alone.

The continuations from one state share their random streams across actions (common random
numbers: stream i of row r is ``pairacc/<task>/<r>/<i>/<noise>``), which lowers the variance
of the same-state difference. Pair sets (``pair_sets``): the pairs the defaults keep, the
candidates the defaults drop (recovered from a relaxed builder, see there) and the
same-fold-evidence control. With ``--variants`` every label variant of :data:`VARIANTS` is
judged on the same rollouts and continuation streams, by its *signal per group*: the sum of
c (Q+ - Q-) over its pairs per group, with a bootstrap over groups (:func:`signal_per_group`).
With ``--model`` (the trained-policy mode, pair_accuracy_policy.py) the siblings are sampled
from a policy folder with ``--preset``'s environment and rollout settings, and the
continuations come from the same policy after replaying the row's prefix (the prompt the
row was sampled from is rebuilt exactly); one cell per N, no noise levels.
docs/results/pair-accuracy.md describes the method and results.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

import mcgpo
from bench_coverage import ENVS, play_episode, play_group
from machine import cpu_name
from mcgpo.envs.webshop.env import SEARCH_PLACEHOLDER
from mcgpo.preferences.options import PreferenceOptions
from pair_accuracy_policy import (
    PolicyOracle,
    load_policy_setup,
    policy_rollouts,
    trajectory_actions,
)

# build_preferences settings whose outputs make up the pair sets (group_size is added)
SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "relaxed": {"epsilon": 0.0, "max_per_fold": None},
    "same_fold": {"evidence": "same_fold"},
    "pooled": {"evidence": "pooled", "epsilon": 0.0, "max_per_fold": None},
}
EPSILON = PreferenceOptions().epsilon  # the default epsilon (0.25)

# label variants judged side by side on the same rollouts and continuation streams
# (--variants; issue 25): the paper's rule (the defaults) and ours, docs/algorithms/mcgpo.md
VARIANTS: dict[str, dict[str, Any]] = {
    "paper": {},
    "leave_pair_out": {"evidence": "leave_pair_out"},
    "beta": {"weighting": "beta"},
    "leave_pair_out+beta": {"evidence": "leave_pair_out", "weighting": "beta"},
    "paper, no cap": {"max_per_fold": None},
    "leave_pair_out, no cap": {"evidence": "leave_pair_out", "max_per_fold": None},
    # successor-state support and inverse-variance level blending (ours, detail 12b)
    "successor": {"support": "successor"},
    "successor+ivw": {"support": "successor", "blend": "inverse_variance"},
    "leave_pair_out+successor+ivw": {
        "evidence": "leave_pair_out",
        "support": "successor",
        "blend": "inverse_variance",
    },
    "leave_pair_out+beta+successor+ivw": {
        "evidence": "leave_pair_out",
        "weighting": "beta",
        "support": "successor",
        "blend": "inverse_variance",
    },
}


@dataclass(frozen=True)
class PairSet:
    """One set of preference pairs over a table's rows. Arrays have shape ``[P]``."""

    name: str
    plus: np.ndarray  # int64  row of the preferred decision
    minus: np.ndarray  # int64  row of the dispreferred decision
    level: np.ndarray  # object(str)  "exact" or "coarse"
    support: np.ndarray  # int64  n = min(|S(g, a+)|, |S(g, a-)|) under the set's evidence


def _row_pairs(prefs: Any) -> list[tuple[int, int]]:
    """The unordered row pairs of a Preferences (to compare sets built by different options)."""
    return [(min(a, b), max(a, b)) for a, b in zip(prefs.plus.tolist(), prefs.minus.tolist())]


def _subset(name: str, prefs: Any, mask: np.ndarray) -> PairSet:
    return PairSet(
        name, prefs.plus[mask], prefs.minus[mask], prefs.level[mask], prefs.support[mask]
    )


def pair_sets(table: mcgpo.StepTable, size: int) -> tuple[list[PairSet], dict[str, float]]:
    """The pair sets judged per cell, derived from :data:`SETTINGS` by public outputs only,
    and the cell's candidate counts (:func:`candidate_counts`).

    kept            what ``build_preferences`` keeps with its defaults
    dropped: eps    pairs of the relaxed builder (epsilon 0, no cap: same evidence, same rule
                    levels) that the defaults do not keep and whose gap is below epsilon
    dropped: alloc  the same with gap >= epsilon: lost to the cap / earliest / row-once rules
    dropped: no support  pairs only pooled evidence (all N trajectories, the pair's own
                    included, epsilon 0, no cap) can label: mostly the candidates without
                    support in the other fold; their direction is an in-sample label
    same_fold       the in-sample control: the defaults with ``evidence = "same_fold"``

    build_preferences reports the drops as counts only, so the dropped sets are the part
    of each drop that a relaxed builder keeps (its own earliest / row-once rules still
    apply), not every dropped candidate. A gap of exactly 0 has no direction and is dropped
    even at epsilon 0: such candidates cannot be judged and are only counted.
    """
    built = {
        name: mcgpo.build_preferences(table, group_size=size, **opts)
        for name, opts in SETTINGS.items()
    }
    kept, relaxed, pooled = built["default"], built["relaxed"], built["pooled"]
    kept_keys, relaxed_keys = set(_row_pairs(kept)), set(_row_pairs(relaxed))
    dropped = np.array([k not in kept_keys for k in _row_pairs(relaxed)], dtype=bool)
    below = relaxed.gap < EPSILON - 1e-12
    unsupported = np.array([k not in relaxed_keys for k in _row_pairs(pooled)], dtype=bool)
    sets = [
        _subset("kept", kept, np.ones(len(kept), dtype=bool)),
        _subset("dropped: eps", relaxed, dropped & below),
        _subset("dropped: alloc", relaxed, dropped & ~below),
        _subset("dropped: no support", pooled, unsupported),
        _subset("same_fold", built["same_fold"], np.ones(len(built["same_fold"]), dtype=bool)),
    ]
    return sets, candidate_counts(kept.stats, relaxed.stats)


def candidate_counts(default: Mapping[str, float], relaxed: Mapping[str, float]) -> dict:
    """Per group: candidates, kept, and drops by reason of the default builder; ``tied`` is
    the part of the below-epsilon drops with a gap of exactly 0 (what the relaxed builder,
    epsilon 0, still drops as below epsilon)."""
    n = max(default["groups"], 1.0)
    return {
        "candidates": default["candidate_pairs"] / n,
        "kept": default["preferences"] / n,
        "no_support": default["dropped_no_support"] / n,
        "below_eps": default["dropped_below_epsilon"] / n,
        "tied": relaxed["dropped_below_epsilon"] / n,
        "allocation": default["dropped_allocation"] / n,
    }


def admissible(obs: Any, action: str) -> bool:
    """Whether ``action`` can be taken at ``obs`` (WebShop lists its search as a placeholder)."""
    if action in obs.admissible_actions:
        return True
    return action.startswith("search[") and SEARCH_PLACEHOLDER in obs.admissible_actions


class Oracle:
    """Monte-Carlo Q(s, a) at the states of a rollout table's rows, cached per (row, action).

    ``tasks`` maps a group id to its training task seed; ``noise`` is the policy's (the
    noisy expert of bench_coverage.py); ``k`` continuations per estimate.
    """

    def __init__(
        self, env: Any, table: mcgpo.StepTable, tasks: Mapping[int, int], noise: float, k: int
    ) -> None:
        if k < 1:
            raise ValueError(f"Oracle: k must be >= 1 continuations, got {k}")
        missing = sorted(set(np.unique(table.group).tolist()) - set(tasks))
        if missing:
            raise ValueError(f"Oracle: no task seed for group {missing[0]} in tasks")
        self.env, self.table, self.tasks, self.noise, self.k = env, table, tasks, noise, k
        self._actions = trajectory_actions(table)
        self._cache: dict[tuple[int, str], np.ndarray] = {}

    def prefix(self, row: int) -> list[str]:
        """The actions of ``row``'s trajectory before its turn (they lead to its state)."""
        return self._actions[int(self.table.traj[row])][: int(self.table.turn[row])]

    def task(self, row: int) -> int:
        return int(self.tasks[int(self.table.group[row])])

    def state(self, row: int) -> Any:
        """The observation at ``row``'s state, reached by replaying its prefix."""
        prefix = self.prefix(row)
        obs = self.env.reset(seed=self.task(row), split="train")
        for action in prefix:
            obs = self.env.step(action).observation
        return obs

    def q(self, row: int, action: str) -> np.ndarray:
        """[2] float64: mean success and mean score of ``action`` taken at ``row``'s state."""
        key = (row, action)
        if key not in self._cache:
            task, prefix = self.task(row), [*self.prefix(row), action]
            outcomes = np.zeros((self.k, 2))
            for i in range(self.k):
                rng = random.Random(f"pairacc/{task}/{row}/{i}/{self.noise}")
                info = play_episode(self.env, task, rng, self.noise, prefix)[-1][2].info
                outcomes[i] = float(bool(info.get("won"))), float(info.get("score", 0.0))
            self._cache[key] = outcomes.mean(axis=0)
        return self._cache[key]


@dataclass(frozen=True)
class Judged:
    """Monte-Carlo values of one pair set. Arrays have shape ``[P, 2]`` (success, score)."""

    plus: np.ndarray  # Q(s+, a+)
    minus_own: np.ndarray  # Q(s-, a-)
    minus_same: np.ndarray  # Q(s+, a-); NaN where a- is not admissible at s+


def judge(oracle: Oracle, pairs: PairSet) -> Judged:
    """Q estimates of every pair of ``pairs``, at the own and at the same state."""
    n = len(pairs.plus)
    plus, own, same = np.zeros((n, 2)), np.zeros((n, 2)), np.full((n, 2), np.nan)
    action = oracle.table.action
    for p, (rp, rm) in enumerate(zip(pairs.plus.tolist(), pairs.minus.tolist())):
        a_plus, a_minus = str(action[rp]), str(action[rm])
        plus[p] = oracle.q(rp, a_plus)
        own[p] = oracle.q(rm, a_minus)
        if admissible(oracle.state(rp), a_minus):
            same[p] = oracle.q(rp, a_minus)
    return Judged(plus, own, same)


def summarise(q_plus: np.ndarray, q_minus: np.ndarray, *, seed: int = 0, boot: int = 2000) -> dict:
    """Accuracy of pairs (q_plus vs q_minus, shape [P], NaN pairs left out): shares of
    right (Q+ > Q-), tied and wrong pairs, mean Q+ - Q- and its 95 % percentile-bootstrap
    interval over pairs (``boot`` resamples, fixed ``seed``)."""
    diff = (q_plus - q_minus)[~(np.isnan(q_plus) | np.isnan(q_minus))]
    n = len(diff)
    if n == 0:
        nan = float("nan")
        return {"n": 0, "right": nan, "tie": nan, "wrong": nan, "mean": nan, "lo": nan, "hi": nan}
    means = diff[np.random.default_rng(seed).integers(0, n, size=(boot, n))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {
        "n": n,
        "right": float(np.mean(diff > 0)),
        "tie": float(np.mean(diff == 0)),
        "wrong": float(np.mean(diff < 0)),
        "mean": float(diff.mean()),
        "lo": float(lo),
        "hi": float(hi),
    }


def group_signal(
    group: np.ndarray, weight: np.ndarray, diff: np.ndarray, groups: int
) -> np.ndarray:
    """[groups]: sum of c (Q+ - Q-) over each group's pairs (0 for a group without pairs).

    ``group`` [P] group rank in 0..groups-1 of each pair, ``weight`` [P] its c, ``diff`` [P]
    Monte-Carlo Q+ - Q- (own states)."""
    return np.bincount(group, weights=weight * diff, minlength=groups)[:groups]


def bootstrap_mean(per_group: np.ndarray, *, seed: int = 0, boot: int = 2000) -> dict:
    """Mean over groups with a 95 % percentile-bootstrap interval, groups resampled (pairs
    of one group share their evidence, so groups, not pairs, are the units). The resamples
    depend only on (seed, groups): two variants of one cell get the same ones, so the
    bootstrap of their per-group difference is paired."""
    groups = len(per_group)
    idx = np.random.default_rng(seed).integers(0, groups, size=(boot, groups))
    means = per_group[idx].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": float(per_group.mean()), "lo": float(lo), "hi": float(hi)}


def weighted_gap(weight: np.ndarray, diff: np.ndarray) -> float:
    """sum c (Q+ - Q-) / sum c over a variant's pairs: the signal without the scale of c (a
    larger c acts like a larger lambda in the loss; this says how right the weighted pairs
    are); NaN without weight."""
    total = float(np.sum(weight))
    return float(np.sum(weight * diff)) / total if total > 0 else float("nan")


def signal_per_group(
    group: np.ndarray, weight: np.ndarray, diff: np.ndarray, groups: int, *, seed: int = 0,
    boot: int = 2000,
) -> dict:  # fmt: skip
    """The variant's signal per group: :func:`group_signal`, then :func:`bootstrap_mean`."""
    return bootstrap_mean(group_signal(group, weight, diff, groups), seed=seed, boot=boot)


def variant_rows(
    table: mcgpo.StepTable, oracle: Any, size: int, groups: int, col: int
) -> list[tuple[str, float, dict, dict, dict, float]]:
    """(variant, pairs per group, own-state accuracy summary, signal per group, paired
    difference of the signal per group against ``paper``, :func:`weighted_gap`) of every
    :data:`VARIANTS` entry on
    one cell's rollouts. Q estimates are shared through the oracle's cache, so every
    variant is judged on the same rollouts and the same continuation streams."""
    out, base = [], None
    for name, options in VARIANTS.items():
        prefs = mcgpo.build_preferences(table, group_size=size, **options)
        pairs = PairSet(name, prefs.plus, prefs.minus, prefs.level, prefs.support)
        judged = judge(oracle, pairs)
        diff = judged.plus[:, col] - judged.minus_own[:, col]
        group = table.group[prefs.plus].astype(np.int64)
        per_group = group_signal(group, prefs.weight, diff, groups)
        base = per_group if base is None else base  # "paper" comes first
        own = summarise(judged.plus[:, col], judged.minus_own[:, col])
        out.append((name, len(prefs) / groups, own, bootstrap_mean(per_group),
                    bootstrap_mean(per_group - base), weighted_gap(prefs.weight, diff)))  # fmt: skip
    return out


def rollouts(env: Any, groups: int, size: int, noise: float) -> mcgpo.StepTable:
    """bench_coverage's noisy-expert groups; group g plays training task g."""
    rows: list[dict[str, Any]] = []
    for g in range(groups):
        rows += play_group(env, task=g, group=g, size=size, noise=noise)
    return mcgpo.StepTable.from_records(rows)


@dataclass(frozen=True)
class Cell:
    """The result of one (env, N, noise) cell."""

    success: float  # share of the cell's trajectories that succeed
    counts: dict[str, float]  # candidate_counts
    rows: list[tuple[str, str, dict, dict]]  # (set, split, own-state, same-state summary)
    variants: list[
        tuple[str, float, dict, dict, dict, float]
    ]  # variant_rows ([] without --variants)


SPLITS = ("all", "exact", "coarse", "n = 1", "n >= 2")  # rows per pair set (see cell)


def split_mask(pairs: PairSet, split: str) -> np.ndarray:
    """[P] bool: the pairs of one split: all, by rule level, or by support n."""
    if split in ("exact", "coarse"):
        return pairs.level == split
    if split == "n = 1":
        return pairs.support == 1
    if split == "n >= 2":
        return pairs.support >= 2
    return np.ones(len(pairs.plus), dtype=bool)


def cell(
    env_name: str, size: int, noise: float, groups: int, k: int, value: str,
    variants: bool = False, sets: bool = True,
) -> Cell:  # fmt: skip
    """One noisy-expert cell: the rollouts of bench_coverage.py, judged by :func:`judge_cell`."""
    env = mcgpo.make_env(env_name, **ENVS[env_name])
    table = rollouts(env, groups, size, noise)
    oracle = Oracle(env, table, {g: g for g in range(groups)}, noise, k)
    return judge_cell(table, oracle, size, groups, value, variants=variants, sets=sets)


def policy_cell(
    policy: Any, groups: int, k: int, value: str, variants: bool = False, sets: bool = True,
    seed: int = 0,
) -> Cell:  # fmt: skip
    """One trained-policy cell (``--model``): siblings and continuations from ``policy``
    (pair_accuracy_policy.py), judged by :func:`judge_cell`."""
    table = policy_rollouts(policy, groups).learnable().table
    oracle = PolicyOracle(policy, table, k, seed=seed)
    return judge_cell(
        table, oracle, policy.options.group_size, groups, value, variants=variants, sets=sets
    )


def judged_sets(
    table: mcgpo.StepTable, size: int, variants: bool, sets: bool,
    built: list[PairSet] | None = None,
) -> list[PairSet]:  # fmt: skip
    """Every pair set one cell judges: the sets of :func:`pair_sets` (``built`` when the
    caller has them already) and the variants'."""
    out = list(built if built is not None else pair_sets(table, size)[0]) if sets else []
    for options in VARIANTS.values() if variants else {}:
        prefs = mcgpo.build_preferences(table, group_size=size, **options)
        out.append(PairSet("variant", prefs.plus, prefs.minus, prefs.level, prefs.support))
    return out


def needed_keys(oracle: Any, sets: list[PairSet]) -> set[tuple[int, str]]:
    """The (row, action) keys :func:`judge` asks of ``oracle`` for ``sets``."""
    action, keys = oracle.table.action, set()
    for pairs in sets:
        for rp, rm in zip(pairs.plus.tolist(), pairs.minus.tolist()):
            keys |= {(rp, str(action[rp])), (rm, str(action[rm]))}
            if admissible(oracle.state(rp), str(action[rm])):
                keys.add((rp, str(action[rm])))
    return keys


def judge_cell(
    table: mcgpo.StepTable, oracle: Any, size: int, groups: int, value: str,
    variants: bool = False, sets: bool = True,
) -> Cell:  # fmt: skip
    """Judge every pair set of one cell: every set over all pairs; kept and same_fold also
    by rule level and by support (splits without pairs are left out); with ``variants``
    also every label variant (:func:`variant_rows`); ``sets=False`` skips the pair sets.
    An oracle with a ``prefetch`` method gets every key it will be asked first."""
    col = {"success": 0, "score": 1}[value]
    judged_list, counts = pair_sets(table, size)
    if hasattr(oracle, "prefetch"):
        every = judged_sets(table, size, variants, sets, built=judged_list)
        oracle.prefetch(needed_keys(oracle, every))
    rows = []
    for pairs in judged_list if sets else []:
        judged = judge(oracle, pairs)
        for split in SPLITS if pairs.name in ("kept", "same_fold") else SPLITS[:1]:
            m = split_mask(pairs, split)
            if split != "all" and not m.any():
                continue
            own = summarise(judged.plus[m, col], judged.minus_own[m, col])
            same = summarise(judged.plus[m, col], judged.minus_same[m, col])
            rows.append((pairs.name, split, own, same))
    extra = variant_rows(table, oracle, size, groups, col) if variants else []
    return Cell(float(table.success[table.turn == 0].mean()), counts, rows, extra)


def _fmt(s: dict) -> str:
    if s["n"] == 0:
        return "0 | – | – | – | –"
    return (
        f"{s['n']} | {100 * s['right']:.0f} | {100 * s['tie']:.0f} | {100 * s['wrong']:.0f} "
        f"| {s['mean']:+.2f} [{s['lo']:+.2f}, {s['hi']:+.2f}]"
    )


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=32, help="tasks (groups) per cell")
    parser.add_argument(
        "--budget", type=int, default=None,
        help="trajectories per cell instead of --groups: groups = budget / N (equal budget "
        "across N, e.g. 1024 = 128 x 8 = 64 x 16)",
    )  # fmt: skip
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[8, 16], help="group sizes N (even)"
    )
    parser.add_argument(
        "--noise", type=float, nargs="+", default=None,
        help="noise levels in [0, 1] of the noisy expert (default 0.2 0.4 0.6; not with --model)",
    )  # fmt: skip
    parser.add_argument("--k", type=int, default=16, help="Monte-Carlo continuations per Q")
    parser.add_argument(
        "--envs", nargs="+", default=None, choices=list(ENVS),
        help="environments of the noisy expert (default: all; not with --model)",
    )  # fmt: skip
    parser.add_argument(
        "--model", default=None,
        help="a policy folder: siblings and continuations sampled from it (trained-policy "
        "mode; the environment and rollout settings are --preset's)",
    )  # fmt: skip
    parser.add_argument(
        "--preset", default="household-mid", help="with --model: the preset it was trained with"
    )
    parser.add_argument("--seed", type=int, default=0, help="with --model: the sampling seed")
    parser.add_argument(
        "--value", default="success", choices=["success", "score"], help="Q = mean of this"
    )
    parser.add_argument(
        "--variants", action="store_true",
        help="also judge the label variants (VARIANTS) on the same rollouts: signal per group",
    )  # fmt: skip
    parser.add_argument(
        "--variants-only", action="store_true", help="judge the label variants only (no pair sets)"
    )
    args = parser.parse_args()
    for name in ("groups", "k"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.budget is not None and any(args.budget < n or args.budget % n for n in args.sizes):
        parser.error(f"--budget {args.budget} must be a multiple of every N in --sizes")
    if any(n < 2 or n % 2 for n in args.sizes):
        parser.error(f"--sizes must be even integers >= 2, got {args.sizes}")
    if args.model is not None:
        for name in ("noise", "envs"):
            if getattr(args, name) is not None:
                parser.error(f"--{name} applies to the noisy expert, not to --model")
    args.noise = [0.2, 0.4, 0.6] if args.noise is None else args.noise
    args.envs = list(ENVS) if args.envs is None else args.envs
    if any(not 0 <= x <= 1 for x in args.noise):
        parser.error(f"--noise must lie in [0, 1], got {args.noise}")
    return args


def _policies(args: argparse.Namespace) -> dict[int, Any]:
    """With ``--model``: the policy setup per group size (a bad folder, preset or option is
    one line on stderr and exit 2, before anything is printed)."""
    try:
        return {
            size: load_policy_setup(args.model, args.preset, size=size, seed=args.seed)
            for size in (args.sizes if args.model else [])
        }
    except ValueError as err:
        print(f"bench_pair_accuracy.py: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def _cells(
    args: argparse.Namespace, policies: Mapping[int, Any]
) -> Iterator[tuple[str, int, str, Cell, int]]:
    """(env, N, noise label, cell, groups) of every cell the arguments ask for, in order."""
    variants, sets = args.variants or args.variants_only, not args.variants_only
    for size, policy in policies.items():
        groups = args.groups if args.budget is None else args.budget // size
        c = policy_cell(policy, groups, args.k, args.value, variants, sets, seed=args.seed)
        yield f"{args.preset} (policy)", size, "policy", c, groups
    for env_name in [] if args.model else args.envs:
        for size in args.sizes:
            for noise in args.noise:
                groups = args.groups if args.budget is None else args.budget // size
                c = cell(env_name, size, noise, groups, args.k, args.value, variants, sets)
                yield env_name, size, f"{noise:.1f}", c, groups


def main() -> None:
    args = _arguments()
    policies = _policies(args)
    source = (
        f"siblings and continuations sampled from {args.model} ({args.preset}, seed {args.seed})"
        if args.model else "noisy-expert rollouts"
    )  # fmt: skip
    print(
        f"MCGPO pair accuracy, {source}, "
        + (f"{args.groups} tasks" if args.budget is None else f"{args.budget} trajectories")
        + " per cell, "
        f"Q = mean {args.value} of {args.k} continuations, build_preferences defaults; "
        f"{cpu_name()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{datetime.date.today().isoformat()}"
    )
    print()
    print(
        "| env | N | noise | success % | pairs | split | n own | right % | tie % | wrong % "
        "| mean Q+ - Q- [95 % CI] | n same | right % | tie % | wrong % | mean Q+ - Q- [95 % CI] |"
    )
    print("|---" * 16 + "|")
    start = time.perf_counter()
    cells = []
    for env_name, size, noise, c, groups in _cells(args, policies):
        cells.append((env_name, size, noise, c, groups))
        for name, split, own, same in c.rows:
            print(
                f"| {env_name} | {size} | {noise} | {100 * c.success:.1f} | {name} "
                f"| {split} | {_fmt(own)} | {_fmt(same)} |",
                flush=True,
            )
    print("\nCandidates per group (default builder; tied = below-eps drops with a gap of 0)\n")
    print("| env | N | noise | candidates | kept | no support | below eps | tied | allocation |")
    print("|---" * 9 + "|")
    for env_name, size, noise, c, _ in cells:
        n = c.counts
        print(
            f"| {env_name} | {size} | {noise} | {n['candidates']:.2f} | {n['kept']:.2f} "
            f"| {n['no_support']:.2f} | {n['below_eps']:.2f} | {n['tied']:.2f} "
            f"| {n['allocation']:.2f} |"
        )
    if any(c.variants for *_, c, _ in cells):
        _print_variants(cells)
    print(f"\n{time.perf_counter() - start:.0f} s")


def _print_variants(cells: list[tuple[str, int, str, Cell, int]]) -> None:
    print(
        "\nLabel variants (same rollouts, same continuation streams; own-state Q; signal "
        "= sum of c (Q+ - Q-) per group, 95 % bootstrap over groups)\n"
    )
    print("| env | N | groups | noise | success % | variant | pairs / group | n | right % "
          "| tie % | wrong % | mean Q+ - Q- | c-weighted Q+ - Q- | signal / group [95 % CI] "
          "| signal / 8 traj | minus paper [95 % CI, paired] |")  # fmt: skip
    print("|---" * 16 + "|")
    for env_name, size, noise, c, groups in cells:
        for name, per_group, own, sig, vs, weighted in c.variants:
            acc = (
                f"{own['n']} | {100 * own['right']:.0f} | {100 * own['tie']:.0f} | "
                f"{100 * own['wrong']:.0f} | {own['mean']:+.3f} | {weighted:+.3f}"
                if own["n"] else "0 | – | – | – | – | –"
            )  # fmt: skip
            print(
                f"| {env_name} | {size} | {groups} | {noise} | {100 * c.success:.1f} "
                f"| {name} | {per_group:.2f} | {acc} | {sig['mean']:+.4f} "
                f"[{sig['lo']:+.4f}, {sig['hi']:+.4f}] | {sig['mean'] * 8 / size:+.4f} "
                f"| {vs['mean']:+.4f} [{vs['lo']:+.4f}, {vs['hi']:+.4f}] |",
                flush=True,
            )


if __name__ == "__main__":
    main()
