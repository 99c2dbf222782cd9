"""``e2e_fork``: two forks with a hidden way out (the verl end-to-end test's environment).

A task is two forks in a row, each with the paths ``go left`` and ``go right``; one path of
each fork leads out, drawn from ``(seed, split)`` and shown nowhere in the observations.
Taking the way out wins; taking the other path at the first fork leads to the second fork;
the episode ends when won or after ``max_turns`` commands (2). So a policy that picks each
path half the time wins in one turn with probability 1/2 and in two with 1/4, and siblings
of a group share their first state and choose different paths there: reward variance and
MCGPO's matched contexts within two turns. The expert knows the way out, so a policy
cloned from its demonstrations learns the paths' frequencies (1/2 each), not the task.

Reward: 10 on the step that takes the way out, 0 otherwise. info: ``won``, ``score`` (1.0
once won), ``action_valid``, ``turn``. Any other text answers ``Nothing happens.`` and
changes nothing.

Registered under the ``mcgpo.envs`` entry point by :func:`install` (a dist-info folder on
``sys.path`` / ``PYTHONPATH``), so verl's agent-loop workers find it as users' plugins are.
"""

from __future__ import annotations

import random
from pathlib import Path

from mcgpo.envs import Context, Observation, StepResult

__all__ = ["ACTIONS", "NAME", "ForkEnv", "install"]

NAME = "e2e_fork"
ACTIONS = ("go left", "go right")
FORKS = 2


class ForkEnv:
    """Two forks; ``exits[k]`` is the path out of fork ``k`` (0 or 1)."""

    def __init__(self, max_turns: int = FORKS) -> None:
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
        self.max_turns = max_turns
        self.exits: tuple[int, ...] = ()
        self.fork = self.turn = 0
        self.won = False

    def reset(self, seed: int = 0, split: str = "train") -> Observation:
        rng = random.Random(f"{NAME}/{split}/{seed}")
        self.exits = tuple(rng.randrange(len(ACTIONS)) for _ in range(FORKS))
        self.fork, self.turn, self.won = 0, 0, False
        return self._observe("You stand at a fork. Paths lead left and right.")

    def step(self, action: str) -> StepResult:
        if self.won or self.turn >= self.max_turns:
            raise ValueError(f"{NAME}: step after the episode ended")
        self.turn += 1
        valid = action in ACTIONS
        if not valid:
            text = "Nothing happens."
        elif ACTIONS.index(action) == self.exits[self.fork]:
            self.won, text = True, "You found the way out."
        elif self.fork + 1 < FORKS:
            self.fork += 1
            text = "The path ends at another fork. Paths lead left and right."
        else:
            text = "The path ends at a wall."
        info = {"won": self.won, "score": float(self.won), "action_valid": valid, "turn": self.turn}
        done = self.won or self.turn >= self.max_turns
        return StepResult(self._observe(text), 10.0 if self.won else 0.0, done, info)

    def expert_action(self) -> str:
        return ACTIONS[self.exits[self.fork]]

    def _observe(self, text: str) -> Observation:
        state = f"fork={self.fork};out={int(self.won)}"
        context = Context(
            anchor=f"{text}\nActions: {' | '.join(ACTIONS)}",
            state=state,
            state_coarse=state,
            progress="out" if self.won else "",
            enabled="" if self.won else "walk",
            progress_value=float(self.won),
        )
        task = "Your task is to: find the way out."
        return Observation(text, task, ACTIONS, context, task_type=NAME)


def install(root: Path) -> Path:
    """Write this module and a dist-info folder registering ``e2e_fork = e2e_fork_env:ForkEnv``
    under ``mcgpo.envs`` into ``root`` (put ``root`` on ``sys.path`` or ``PYTHONPATH``)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "e2e_fork_env.py").write_text(Path(__file__).read_text())
    info = root / "e2e_fork_env-0.1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: e2e-fork-env\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[mcgpo.envs]\n{NAME} = e2e_fork_env:ForkEnv\n")
    return root
