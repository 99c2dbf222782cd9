"""Environments that fail on purpose, importable by worker processes (spawn re-imports them).

A fault is keyed by (seed, turn): the environment reset with ``seed`` fails on its
``turn``-th step (1-based) by raising, hanging, exiting the process (``os._exit``) or
segfaulting, or is slow (answers normally after SLOW_SECONDS). Give each slot its own seed to aim a fault at one slot. A reset of a seed listed
in the environment variable ``POOL_FAKES_FAIL_RESETS`` ("101,107") raises: set after a pool
has started, it reaches only workers started later (the restarted ones), so it makes their
replays fail.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass, field

from mcgpo.envs import Observation, StepResult
from mcgpo.envs.household import HouseholdEnv

KINDS = ("raise", "hang", "exit", "segfault", "slow")
SLOW_SECONDS = 3.0  # how long a "slow" step takes before it answers normally


class FaultEnv:
    """HouseholdEnv that fails as ``faults[(seed, turn)]`` says (one of KINDS)."""

    def __init__(self, faults: dict[tuple[int, int], str], fail_build: bool = False) -> None:
        if fail_build:
            raise OSError("no game files here")
        self.env = HouseholdEnv()
        self.max_turns = self.env.max_turns
        self.faults = faults
        self.seed = -1
        self.turn = 0

    def reset(self, seed: int = 0, split: str = "train") -> Observation:
        self.seed, self.turn = seed, 0
        if str(seed) in os.environ.get("POOL_FAKES_FAIL_RESETS", "").split(","):
            raise RuntimeError(f"reset of seed {seed} refused")
        if self.faults.get((seed, 0)) is not None:
            self._fail(self.faults[(seed, 0)])
        return self.env.reset(seed=seed, split=split)

    def step(self, action: str) -> StepResult:
        self.turn += 1
        kind = self.faults.get((self.seed, self.turn))
        if kind is not None:
            self._fail(kind)
        return self.env.step(action)

    def expert_action(self) -> str:
        return self.env.expert_action()

    def _fail(self, kind: str) -> None:
        if kind == "raise":
            raise RuntimeError(f"simulated fault at seed {self.seed} turn {self.turn}")
        if kind == "hang":
            threading.Event().wait()
        if kind == "exit":
            os._exit(3)
        if kind == "segfault":
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        if kind == "slow":
            time.sleep(SLOW_SECONDS)


@dataclass(frozen=True)
class FaultSpec:
    """Picklable factory of FaultEnv."""

    faults: dict[tuple[int, int], str] = field(default_factory=dict)
    fail_build: bool = False

    def __call__(self) -> FaultEnv:
        return FaultEnv(self.faults, self.fail_build)


def _child_answer(conn) -> None:  # runs in the environment's own child process
    conn.send("checked")
    conn.close()


class ForkingEnv(HouseholdEnv):
    """A household whose every reset asks a child process of its own (as ALFWorld's
    generated games run their planner check in a child)."""

    def reset(self, seed: int = 0, split: str = "train") -> Observation:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child_answer, args=(child,), daemon=True)
        proc.start()
        child.close()
        assert parent.recv() == "checked"
        proc.join()
        return super().reset(seed=seed, split=split)


@dataclass(frozen=True)
class ForkingSpec:
    """Picklable factory of ForkingEnv."""

    def __call__(self) -> ForkingEnv:
        return ForkingEnv()
