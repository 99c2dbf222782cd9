"""Test double for the rollout layer: a tiny counting environment.

CounterEnv, task seed s: the counter must reach ``target = s % 3 + 2``. The admissible
actions are "step" and "wait". Any action text of even length ("step" has 4 characters)
advances the counter, so a random policy wins some episodes and loses others, which is what
the collect tests need; ``info["action_valid"]`` is True only for the two admissible texts.
Reward 10 on the winning step. ``fail_seed`` / ``fail_turn`` make ``step`` raise on that
task at that turn (1-based), ``fail_reset_seed`` makes ``reset`` raise. ``CounterSpec`` is a
picklable factory for worker processes whose environment can exit its process at a turn.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from mcgpo.envs.protocol import Context, Observation, StepResult


class CounterEnv:
    def __init__(
        self,
        *,
        max_turns: int = 4,
        fail_seed: int | None = None,
        fail_turn: int = 1,
        fail_reset_seed: int | None = None,
    ) -> None:
        self.max_turns = max_turns
        self.fail_seed, self.fail_turn, self.fail_reset_seed = fail_seed, fail_turn, fail_reset_seed
        self.seed = self.target = self.count = self.turn = 0

    def _obs(self, text: str | None = None) -> Observation:
        return Observation(
            text=text or f"The counter shows {self.count}.",
            task=f"Your task is to: count to {self.target}.",
            admissible_actions=("step", "wait"),
            context=Context(
                anchor=f"count {self.count}",
                state=f"count={self.count};target={self.target}",
                state_coarse=f"count={self.count}",
                progress=f"{self.count}/{self.target}",
                enabled="step",
                progress_value=self.count / self.target,
            ),
            task_type="even" if self.target % 2 == 0 else "odd",
        )

    def reset(self, seed: int = 0, split: str = "train") -> Observation:
        if seed == self.fail_reset_seed:
            raise RuntimeError(f"reset failed for seed {seed}")
        self.seed, self.target, self.count, self.turn = seed, seed % 3 + 2, 0, 0
        return self._obs()

    def step(self, action: str) -> StepResult:
        self.turn += 1
        if self.seed == self.fail_seed and self.turn == self.fail_turn:
            raise RuntimeError(f"step failed for seed {self.seed} at turn {self.turn}")
        valid = action in ("step", "wait")
        if len(action) % 2 == 0 and action != "wait":
            self.count += 1
        won = self.count >= self.target
        done = won or self.turn >= self.max_turns
        text = None if valid else "Nothing happens."
        info = {"won": won, "score": float(won), "action_valid": valid}
        return StepResult(self._obs(text), 10.0 * won, done, info)

    def expert_action(self) -> str:
        return "step"


class ExitingCounter(CounterEnv):
    """CounterEnv whose worker process exits (``os._exit``) at ``exit_turn`` of ``exit_seed``."""

    def __init__(self, exit_seed: int, exit_turn: int) -> None:
        super().__init__()
        self.exit_seed, self.exit_turn = exit_seed, exit_turn

    def step(self, action: str) -> StepResult:
        if self.seed == self.exit_seed and self.turn + 1 == self.exit_turn:
            os._exit(3)
        return super().step(action)


@dataclass(frozen=True)
class CounterSpec:
    """Picklable CounterEnv factory (worker processes); exits at (exit_seed, exit_turn)."""

    exit_seed: int = -1
    exit_turn: int = 0

    def __call__(self) -> CounterEnv:
        return ExitingCounter(self.exit_seed, self.exit_turn)
