"""Synthetic rollout batches with realistic structure, for benchmarks and tests.

Each group is a small random world: ``n_states`` states with deterministic transitions per
(state, action), a goal state, and 10 reward on reaching it (ALFWorld-like sparse reward).
The ``group_size`` siblings of a group start in the same state and walk it with random
actions, so states are often shared between siblings and revisited inside a trajectory,
as in real ALFWorld batches. With ``full_length=True`` no trajectory ends early: the goal
is not terminal, a trajectory that visited it succeeds, and its reward of 10 comes at the
last turn, so the batch holds exactly ``groups * group_size * turns`` rows (the benchmark
batch is 16 x 8 x 50 = 6,400 rows). Context fields follow the environments' conventions:
``state`` carries instance numbers, ``state_coarse`` drops them, ``progress`` lists the
rubric items reached, ``enabled`` the items that can be advanced next.
"""

from __future__ import annotations

import numpy as np

from mcgpo.steps import StepTable

__all__ = ["synthetic_table"]

COLUMNS = (
    "group",
    "traj",
    "slot",
    "turn",
    "reward",
    "done",
    "success",
    "score",
    "action",
    "action_valid",
    "anchor",
    "next_anchor",
    "state",
    "state_coarse",
    "progress",
    "enabled",
    "progress_value",
    "next_progress_value",
    "task_type",
)


def synthetic_table(
    groups: int = 16,
    group_size: int = 8,
    turns: int = 50,
    *,
    n_states: int = 24,
    n_actions: int = 6,
    p_invalid: float = 0.05,
    full_length: bool = False,
    seed: int = 0,
) -> StepTable:
    """A batch of ``groups x group_size`` trajectories of at most ``turns`` turns.

    With the defaults most trajectories run the full 50 turns, giving about
    16 x 8 x 50 = 6,400 rows with many shared anchor states. ``full_length=True`` makes
    every trajectory run exactly ``turns`` turns (success = the goal was visited), for
    batches of a known size.
    """
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {k: [] for k in COLUMNS}
    traj_id = 0
    for g in range(groups):
        # transitions[s, a] -> next state; the goal is reachable but rarely hit at random
        goal = n_states - 1
        transitions = rng.integers(0, goal, size=(n_states, n_actions))
        transitions[rng.integers(0, goal), rng.integers(0, n_actions)] = goal  # one way in
        stage = rng.integers(0, 4, size=n_states)  # rubric stage of each state (0..3)
        start = int(rng.integers(0, n_states - 1))
        for slot in range(group_size):
            steps, won = _walk(rng, start, transitions, goal, turns, p_invalid, full_length)
            for t, s0, a, valid, s1 in steps:
                last = t == len(steps) - 1
                terminal = s1 == goal and not full_length
                row = {"group": g, "traj": traj_id, "slot": slot, "turn": t, "done": last}
                row.update(_outcome(won, last))
                row.update(_context(g, s0, s1, a, valid, terminal, int(stage[s0])))
                row["next_progress_value"] = 1.0 if (last and won) else stage[s1] / 4
                for key, value in row.items():
                    cols[key].append(value)
            traj_id += 1
    return StepTable.from_columns(cols)


def _walk(
    rng: np.random.Generator,
    start: int,
    transitions: np.ndarray,
    goal: int,
    turns: int,
    p_invalid: float,
    full_length: bool,
) -> tuple[list[tuple[int, int, int, bool, int]], bool]:
    """One random walk: (turn, state, action, valid, next state) per step, and whether the
    goal was visited. An invalid action leaves the state unchanged."""
    s, steps, won = start, [], False
    for t in range(turns):
        a = int(rng.integers(0, transitions.shape[1]))
        valid = bool(rng.random() >= p_invalid)
        s_next = int(transitions[s, a]) if valid else s
        steps.append((t, s, a, valid, s_next))
        s = s_next
        won = won or s == goal
        if s == goal and not full_length:
            break
    return steps, won


def _outcome(won: bool, last: bool) -> dict[str, object]:
    """Reward, success and score of a row: 10 at the last turn of a won trajectory."""
    return {
        "reward": 10.0 if (last and won) else 0.0,
        "success": 1.0 if won else 0.0,
        "score": 1.0 if won else 0.0,
    }


def _context(
    g: int, s0: int, s1: int, a: int, valid: bool, terminal: bool, k: int
) -> dict[str, object]:
    """The text and context fields of a row in state ``s0`` taking action ``a``."""
    return {
        "action": f"go to cabinet {a + 1}",
        "action_valid": valid,
        "anchor": f"g{g} room {s0}",
        "next_anchor": "success" if terminal else f"g{g} room {s1}",
        "state": f"at cabinet {s0 % 7 + 1}; holding mug {s0 % 3 + 1}",
        "state_coarse": f"at cabinet; holding mug {s0 % 2}",
        "progress": ",".join(["found", "held", "heated"][:k]),
        "enabled": ["find", "take", "heat", "place"][k],
        "progress_value": k / 4,
        "task_type": "pick_heat_then_place_in_recep",
    }
