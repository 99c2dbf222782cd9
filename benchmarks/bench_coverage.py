"""How often MCGPO finds preferences, by group size N and by the policy's success rate.

    python benchmarks/bench_coverage.py [--groups 32] [--sizes 8 16] [--noise 0 0.2 0.4 0.6 0.8]

No training: every rollout is played by a noisy expert, a stand-in for a policy whose success
rate we can set. At each turn the sibling takes a uniformly random admissible action with
probability ``noise`` and the environment's expert action otherwise (each sibling has its own
random stream, so the N siblings of a task differ). ``noise`` = 0 gives N identical expert
trajectories (nothing to compare); growing noise lowers the success rate and spreads the
siblings apart. The rollouts go through :func:`mcgpo.build_preferences` with its defaults and
``group_size = N``; the table shows what a user needs to judge whether MCGPO can help on a
task: success rate, the share of groups with mixed outcomes (only those can label a pair),
preferences per group, the share of groups without any, and where candidates were dropped.

Environments and sizes are those of the quick presets (household: 12 receptacles, 4
distractors, 15 turns, explorer expert; webshop: 15 turns). The noisy expert is not the
trained policy: its mistakes are uniform over admissible actions, a trained policy's are not,
so read the table as the shape of the dependence, not as a prediction for one run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import mcgpo
from machine import cpu_name

ENVS: dict[str, dict[str, Any]] = {
    "household": {"max_turns": 15, "n_receptacles": 12, "n_distractors": 4, "expert": "explorer"},
    "webshop": {"max_turns": 15},
}


def noisy_action(env: Any, obs: Any, rng: random.Random, noise: float) -> str:
    """A uniformly random admissible action with probability ``noise``, else the expert's."""
    if obs.admissible_actions and rng.random() < noise:
        return rng.choice(obs.admissible_actions)
    return env.expert_action()


def play_episode(
    env: Any, task: int, rng: random.Random, noise: float, prefix: Sequence[str] = ()
) -> list[tuple[Any, str, Any]]:
    """(observation, action, step result) per turn of one episode on training task ``task``.

    The first ``len(prefix)`` actions are ``prefix`` (a replay), the rest the noisy expert's
    drawn from ``rng``; the episode ends when the environment says done.
    """
    obs = env.reset(seed=task, split="train")
    steps: list[tuple[Any, str, Any]] = []
    for turn in range(env.max_turns):
        action = prefix[turn] if turn < len(prefix) else noisy_action(env, obs, rng, noise)
        res = env.step(action)
        steps.append((obs, action, res))
        obs = res.observation
        if res.done:
            break
    return steps


def episode_rows(
    steps: Sequence[tuple[Any, str, Any]], group: int, traj: int, slot: int
) -> list[dict[str, Any]]:
    """The StepTable rows of one played episode (``play_episode``), outcome on every row."""
    info = steps[-1][2].info if steps else {}
    outcome = {"success": float(bool(info.get("won"))), "score": float(info.get("score", 0))}
    rows: list[dict[str, Any]] = []
    for turn, (obs, action, res) in enumerate(steps):
        ctx, nxt = obs.context, res.observation.context
        rows.append(
            {
                "group": group,
                "traj": traj,
                "slot": slot,
                "turn": turn,
                "reward": float(res.reward),
                "done": bool(res.done),
                "action": action,
                "action_valid": True,
                "anchor": ctx.anchor,
                "next_anchor": nxt.anchor,
                "state": ctx.state,
                "state_coarse": ctx.state_coarse,
                "progress": ctx.progress,
                "enabled": ctx.enabled,
                **outcome,
            }
        )
    return rows


def play_group(env: Any, task: int, group: int, size: int, noise: float) -> list[dict[str, Any]]:
    """The StepTable rows of ``size`` noisy-expert siblings on one training task."""
    rows: list[dict[str, Any]] = []
    for slot in range(size):
        rng = random.Random(f"coverage/{task}/{slot}/{noise}")
        steps = play_episode(env, task, rng, noise)
        rows += episode_rows(steps, group, group * size + slot, slot)
    return rows


def coverage_row(env_name: str, size: int, noise: float, groups: int) -> dict[str, float]:
    env = mcgpo.make_env(env_name, **ENVS[env_name])
    rows: list[dict[str, Any]] = []
    for g in range(groups):
        rows += play_group(env, task=g, group=g, size=size, noise=noise)
    table = mcgpo.StepTable.from_records(rows)
    prefs = mcgpo.build_preferences(table, group_size=size)
    success = table.success.reshape(-1)
    per_group = np.array([success[table.group == g].max() - success[table.group == g].min()
                          for g in range(groups)])  # fmt: skip
    stats = prefs.stats
    n = float(groups)
    return {
        "success": float(np.mean([r["success"] for r in rows if r["turn"] == 0])),
        "mixed_groups": float(np.mean(per_group > 0)),
        "prefs_per_group": stats["preferences_per_group"],
        "groups_without": stats["share_groups_without_preferences"],
        "coarse_share": stats["coarse"] / stats["preferences"] if stats["preferences"] else 0.0,
        "no_support": stats["dropped_no_support"] / n,
        "below_epsilon": stats["dropped_below_epsilon"] / n,
        "allocation": stats["dropped_allocation"] / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=32, help="tasks per cell")
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 16], help="group sizes N")
    parser.add_argument(
        "--noise", type=float, nargs="+", default=[0.0, 0.2, 0.4, 0.6, 0.8], help="noise levels"
    )
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    args = parser.parse_args()
    print(
        f"MCGPO preference coverage, noisy-expert rollouts, {args.groups} tasks per cell, "
        f"build_preferences defaults; {cpu_name()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {datetime.date.today().isoformat()}"
    )
    print()
    header = (
        "| env | N | noise | success % | mixed groups % | prefs / group | groups without % "
        "| coarse % | no support / group | below eps / group | allocation / group |"
    )
    print(header)
    print("|---" * 11 + "|")
    start = time.perf_counter()
    for env_name in args.envs:
        for size in args.sizes:
            for noise in args.noise:
                r = coverage_row(env_name, size, noise, args.groups)
                print(
                    f"| {env_name} | {size} | {noise:.1f} | {100 * r['success']:.1f} "
                    f"| {100 * r['mixed_groups']:.1f} | {r['prefs_per_group']:.2f} "
                    f"| {100 * r['groups_without']:.1f} | {100 * r['coarse_share']:.1f} "
                    f"| {r['no_support']:.2f} | {r['below_epsilon']:.2f} | {r['allocation']:.2f} |",
                    flush=True,
                )
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
