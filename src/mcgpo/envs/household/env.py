"""HouseholdEnv: an ALFWorld-like text environment in pure Python (the library's default).

Reward (the only one; nothing rescales it elsewhere): **10 on the step that completes the
task, 0 on every other step**, as verl-agent's ALFWorld reward ``10 * won``. ``info`` holds
``won``, ``score`` (1.0 once won, else 0.0), ``action_valid`` (False for an unknown,
malformed or inapplicable command, which answers "Nothing happens." and changes nothing),
``turn`` and ``truncated`` (the turn limit ended a lost episode).

An episode ends when the task is won or after ``max_turns`` commands (50, verl-agent's
ALFWorld ``max_steps``). Commands are matched after lower-casing and collapsing white space
(as verl-agent lower-cases actions); a command longer than 1,000 characters is never
admissible and is not even normalised. Non-string actions are treated as invalid text.

Departures from ALFWorld are listed in docs/envs/household.md (synthetic rooms without
geometry, canContain-gated ``move``, the default expert sees the full state, no ``help``;
``expert="explorer"`` selects one that searches, see ``explorer.py``).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

from mcgpo.envs.alfworld_keys import TASK_TYPES, step_info
from mcgpo.envs.household.context import anchor, enabled, progress, state_keys
from mcgpo.envs.household.engine import NOTHING_HAPPENS, State, admissible, execute, intro_text
from mcgpo.envs.household.expert import expert_action
from mcgpo.envs.household.explorer import explorer_action, note_searched
from mcgpo.envs.household.layouts import MAX_RECEPTACLES, MIN_RECEPTACLES
from mcgpo.envs.household.tasks import task_world
from mcgpo.envs.household.world import World
from mcgpo.envs.protocol import SPLITS, Context, Observation, StepResult, unknown_option

__all__ = ["WIN_REWARD", "HouseholdEnv", "HouseholdError"]

WIN_REWARD = 10.0
MAX_COMMAND_CHARS = 1000
MAX_DISTRACTORS = 60
EXPERTS = ("planner", "explorer")


class HouseholdError(ValueError):
    """A bad option, seed or split, or a call out of order (step before reset / after done)."""


def _check_int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise HouseholdError(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise HouseholdError(f"{name} must be in [{lo}, {hi}], got {value}")
    return int(value)


class HouseholdEnv:
    """One household episode at a time; see the module docstring for reward and info.

    Options: ``max_turns`` (50), ``n_receptacles`` (None: each layout's own count, about
    12-30; else exactly this many, 12-60), ``n_distractors`` (None: 6-14 non-target objects;
    else exactly this many, 0-60), ``task_types`` (None: all six; seed k gets
    ``task_types[k % len(task_types)]``), ``expert`` (``"planner"``: ``expert_action``
    knows where everything is; ``"explorer"``: it searches using only what the agent has
    been shown, see ``explorer.py``).
    """

    def __init__(
        self,
        *,
        max_turns: int = 50,
        n_receptacles: int | None = None,
        n_distractors: int | None = None,
        task_types: Sequence[str] | None = None,
        expert: str = "planner",
        **unknown: Any,
    ) -> None:
        if unknown:
            raise HouseholdError(unknown_option("household", unknown, HouseholdEnv))
        if expert not in EXPERTS:
            raise HouseholdError(f"expert must be 'planner' or 'explorer', got {expert!r}")
        self.expert = expert
        self.max_turns = _check_int("max_turns", max_turns, 1, 10_000)
        self.n_receptacles = (
            None
            if n_receptacles is None
            else _check_int("n_receptacles", n_receptacles, MIN_RECEPTACLES, MAX_RECEPTACLES)
        )
        self.n_distractors = (
            None
            if n_distractors is None
            else _check_int("n_distractors", n_distractors, 0, MAX_DISTRACTORS)
        )
        if task_types is None:
            task_types = TASK_TYPES
        if isinstance(task_types, str) or not list(task_types):
            raise HouseholdError(
                f"task_types must be a non-empty list of names, got {task_types!r}"
            )
        unknown = [t for t in task_types if t not in TASK_TYPES]
        if unknown:
            raise HouseholdError(
                f"unknown task type {unknown[0]!r}; known: {', '.join(TASK_TYPES)}"
            )
        self.task_types = tuple(task_types)
        self._world: World | None = None
        self._state: State | None = None
        self._searched: set[int] = set()  # receptacles whose contents were shown (explorer)
        self._turn = 0
        self._done = True

    # ------------------------------------------------------------------ protocol
    def reset(self, seed: int = 0, split: str = "train") -> Observation:
        """Start the task of (seed, split): the same pair always gives the same task."""
        seed = _check_int("seed", seed, -(2**63), 2**63 - 1)
        if split not in SPLITS:
            raise HouseholdError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
        self._world = task_world(
            seed,
            split,
            task_types=self.task_types,
            n_receptacles=self.n_receptacles,
            n_distractors=self.n_distractors,
        )
        return self.load(self._world)

    def load(self, world: World) -> Observation:
        """Start an episode on a given task (hand-made tasks, tests); ``reset`` uses it.

        No solvability check is made here: ``reset`` only passes verified tasks.
        """
        if not isinstance(world, World):
            raise HouseholdError(f"load() needs a household World, got {type(world).__name__}")
        self._world = world
        self._state = State(world)
        self._searched = set()
        self._turn = 0
        self._done = False
        return self._observe(intro_text(world), changed=True)

    def step(self, action: str) -> StepResult:
        """Apply one command. Bad text never raises: it is answered "Nothing happens."."""
        world, st = self._world, self._state
        if world is None or st is None:
            raise HouseholdError("step() called before reset()")
        if self._done:
            raise HouseholdError(
                f"step() after the episode ended (turn {self._turn} of {self.max_turns}); "
                "call reset()"
            )
        op = None
        if isinstance(action, str):
            op = self._ops.get(action)
            if op is None and len(action) <= MAX_COMMAND_CHARS:
                op = self._ops.get(" ".join(action.lower().split()))
        self._turn += 1
        if op is None:
            text = NOTHING_HAPPENS
        else:
            text = execute(world, st, op)
            note_searched(world, st, op, self._searched)
        won = st.won
        self._done = won or self._turn >= self.max_turns
        return StepResult(
            observation=self._observe(text, changed=op is not None),
            reward=WIN_REWARD if won else 0.0,
            done=self._done,
            info=step_info(
                won=won,
                action_valid=op is not None,
                turn=self._turn,
                truncated=self._done and not won,
            ),
        )

    def expert_action(self) -> str:
        """The expert's next command from the current state (``expert.py`` / ``explorer.py``)."""
        if self._world is None or self._state is None:
            raise HouseholdError("expert_action() called before reset()")
        if self.expert == "explorer":
            return explorer_action(self._world, self._state, self._searched)
        return expert_action(self._world, self._state)

    # ------------------------------------------------------------------ extras
    @property
    def world(self) -> World:
        """The current task (immutable)."""
        if self._world is None:
            raise HouseholdError("no task yet: call reset()")
        return self._world

    @property
    def state(self) -> State:
        """The live play state (read it, do not change it)."""
        if self._state is None:
            raise HouseholdError("no task yet: call reset()")
        return self._state

    @property
    def turn(self) -> int:
        return self._turn

    def _observe(self, text: str, *, changed: bool) -> Observation:
        world, st = self._world, self._state
        assert world is not None and st is not None
        if changed:  # an invalid command changes nothing but the text
            self._ops = admissible(world, st)
            self._actions = tuple(sorted(self._ops))
            self._keys = state_keys(world, st)
            self._progress = progress(world, st)
            self._enabled = enabled(world, st, self._progress[0])
        context = Context(
            anchor=anchor(text, world, st, self._actions),
            state=self._keys[0],
            state_coarse=self._keys[1],
            progress=self._progress[0],
            enabled=self._enabled,
            progress_value=self._progress[1],
        )
        return Observation(text, world.task, self._actions, context, world.task_type)
