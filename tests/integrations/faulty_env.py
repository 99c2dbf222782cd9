"""An environment that fails on purpose, built by name in worker processes.

``FaultyEnv`` is the household environment, except that the task ``fault_seed`` fails at
its ``fault_turn``-th step (0: its reset) as ``fault`` says: ``hang`` (sleeps
``hang_seconds``), ``abort`` (``os.abort()``: SIGABRT kills the process) or ``raise``. With
``once`` (a folder) only the first environment to reach the fault, in any process, fails:
it claims the file ``once/<seed>_<turn>`` (``O_EXCL``), so one sibling of a group fails and
the others run to their end.

Worker processes start fresh interpreters (``spawn``) and build their environment by name
(``mcgpo.make_env``), so tests register :func:`make_faulty` as a ``mcgpo.envs`` entry point
of a package folder on ``sys.path`` (:func:`install_entry_point`); ``spawn`` hands the
parent's ``sys.path`` to the child.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from mcgpo.envs import Observation, StepResult
from mcgpo.envs.household import HouseholdEnv

NAME = "faulty-household"
KINDS = ("hang", "abort", "raise")


class FaultyEnv:
    """HouseholdEnv that fails at (fault_seed, fault_turn); see the module docstring."""

    def __init__(
        self, fault: str = "raise", fault_seed: int = -1, fault_turn: int = 1,
        hang_seconds: float = 30.0, once: str = "",
    ) -> None:  # fmt: skip
        if fault not in KINDS:
            raise ValueError(f"fault must be one of {', '.join(KINDS)}, got {fault!r}")
        self.env = HouseholdEnv()
        self.max_turns = self.env.max_turns
        self.fault, self.fault_seed, self.fault_turn = fault, int(fault_seed), int(fault_turn)
        self.hang_seconds, self.once = float(hang_seconds), once
        self.seed, self.turn = -1, 0

    def reset(self, seed: int = 0, split: str = "train") -> Observation:
        self.seed, self.turn = int(seed), 0
        self._maybe_fail()
        return self.env.reset(seed=seed, split=split)

    def step(self, action: str) -> StepResult:
        self.turn += 1
        self._maybe_fail()
        return self.env.step(action)

    def expert_action(self) -> str:
        return self.env.expert_action()

    def _maybe_fail(self) -> None:
        if (self.seed, self.turn) != (self.fault_seed, self.fault_turn):
            return
        if self.once:
            try:
                fd = os.open(Path(self.once) / f"{self.seed}_{self.turn}", os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                return  # another environment failed here already
            os.close(fd)
        if self.fault == "hang":
            time.sleep(self.hang_seconds)
        elif self.fault == "abort":
            os.abort()
        raise RuntimeError(f"simulated fault at seed {self.seed} turn {self.turn}")


def make_faulty(**options: object) -> FaultyEnv:
    """The ``mcgpo.envs`` factory of :data:`NAME`."""
    return FaultyEnv(**options)  # type: ignore[arg-type]


def install_entry_point(root: Path) -> Path:
    """A package folder registering ``NAME = faulty_env:make_faulty`` under ``mcgpo.envs``
    (a dist-info folder is all importlib.metadata reads); put it on ``sys.path``."""
    info = root / "faulty_env_test-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: faulty-env-test\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[mcgpo.envs]\n{NAME} = faulty_env:make_faulty\n")
    return root
