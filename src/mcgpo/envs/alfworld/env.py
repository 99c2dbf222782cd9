"""AlfworldEnv: the real ALFWorld text engine behind mcgpo's environment protocol.

Games: the official ones when ``data_path`` (default ``$ALFWORLD_DATA``) holds the standard
``json_2.1.1/{train,valid_seen,valid_unseen}`` layout, otherwise ALFWorld-style games that
mcgpo generates offline from the wheel's assets (``generate.py``), cached on disk. Seed ``s``
of a split is the split's game ``s`` (official: ``games[s % n]`` of the sorted list; generated:
the game generated from (split, s)). Observations, admissible commands and ``won`` are
ALFWorld's own (PddlEnv + AlfredDemangler + AlfredInfos).

Reward (the only one; nothing rescales it elsewhere): **10 on the step that wins, 0
otherwise** (verl-agent's ALFWorld ``10 * won``, the household env's reward). ``info`` holds
``won``, ``score`` (1.0 once won, else 0.0), ``action_valid`` (the command is admissible;
anything else answers ALFWorld's "Nothing happens." and changes nothing), ``turn``,
``truncated`` and ``gamefile``. An episode ends when won or after ``max_turns`` commands (50,
verl-agent's ALFWorld ``max_steps``).

``expert_action()`` is ALFWorld's planner expert: the plan ``policy_commands`` gives from the
current state, re-planned only when the agent leaves the plan (a generated game's stored
walkthrough is that plan from the start, so following it costs no planning). Departures are listed in docs/envs/alfworld.md.
"""

from __future__ import annotations

import json
import numbers
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mcgpo.envs.alfworld import context as ctx
from mcgpo.envs.alfworld.engine import (
    build_engine,
    fact_tuples,
    load_game,
    replan,
    require_alfworld,
    reset_game,
)
from mcgpo.envs.alfworld.generate import DEFAULT_CACHE, solvable_game
from mcgpo.envs.alfworld.official import GameFile, OfficialGames, has_games, task_of
from mcgpo.envs.alfworld.problem import GENERATOR_VERSION
from mcgpo.envs.alfworld_keys import NOTHING_HAPPENS, TASK_TYPES, step_info
from mcgpo.envs.protocol import SPLITS, Context, Observation, StepResult, unknown_option

__all__ = ["WIN_REWARD", "AlfworldEnv", "AlfworldError"]

WIN_REWARD = 10.0
MAX_COMMAND_CHARS = 1000
SOURCES = ("auto", "official", "generated")


class AlfworldError(ValueError):
    """A bad option, seed or split, a call out of order, or no playable game."""


class AlfworldFallbackWarning(UserWarning):
    """``source='auto'`` found no official games and plays generated ones."""


def auto_fallback_message(data: Path | None) -> str:
    """One line naming the path where ``source='auto'`` looked for the official games."""
    where = (
        "$ALFWORLD_DATA is not set and no data_path was given"
        if data is None
        else f"no json_2.1.1/<split>/ under {data}"
    )
    return (
        f"alfworld source='auto': {where}; playing generated games (set source='official' "
        "to require the official ones, or source='generated' to silence this)"
    )


class AlfworldEnv:
    """One ALFWorld episode at a time; see the module docstring for reward and info.

    Options: ``max_turns`` (50); ``source`` ("auto": official games when ``data_path`` has
    them, else generated; "official"; "generated"); ``data_path`` (default
    ``$ALFWORLD_DATA``); ``cache_dir`` (generated games, default ~/.cache/mcgpo/alfworld);
    ``task_types`` (None: all six); ``planner_timeout_s`` (60: generated games whose plan
    takes longer are rejected).
    """

    def __init__(
        self,
        *,
        max_turns: int = 50,
        source: str = "auto",
        data_path: str | os.PathLike | None = None,
        cache_dir: str | os.PathLike | None = None,
        task_types: Sequence[str] | None = None,
        planner_timeout_s: float = 60.0,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise AlfworldError(unknown_option("alfworld", unknown, AlfworldEnv))
        if (
            isinstance(max_turns, bool)
            or not isinstance(max_turns, numbers.Integral)
            or max_turns < 1
        ):
            raise AlfworldError(f"max_turns must be a positive integer, got {max_turns!r}")
        if source not in SOURCES:
            raise AlfworldError(f"unknown source {source!r}; known: {', '.join(SOURCES)}")
        task_types = tuple(TASK_TYPES if task_types is None else task_types)
        bad = [t for t in task_types if t not in TASK_TYPES]
        if not task_types or isinstance(task_types, str) or bad:
            raise AlfworldError(
                f"task_types must list ALFWorld task types, got {bad[0] if bad else task_types!r}; "
                f"known: {', '.join(TASK_TYPES)}"
            )
        data = data_path if data_path is not None else os.environ.get("ALFWORLD_DATA")
        data = Path(data).expanduser() if data else None
        if source == "official" and not has_games(data):
            raise AlfworldError(
                f"source='official' needs json_2.1.1/<split>/ under data_path or $ALFWORLD_DATA "
                f"(got {str(data)!r}); run alfworld-download where there is network access"
            )
        require_alfworld()  # one clear error naming the install command when missing
        self.max_turns = int(max_turns)
        self.task_types = task_types
        self.planner_timeout_s = float(planner_timeout_s)
        self.source = (
            "official"
            if source == "official" or (source == "auto" and has_games(data))
            else "generated"
        )
        if source == "auto" and self.source == "generated":
            warnings.warn(auto_fallback_message(data), AlfworldFallbackWarning, stacklevel=2)
        self.official = OfficialGames(data, task_types) if self.source == "official" else None
        root = Path(cache_dir).expanduser() if cache_dir is not None else DEFAULT_CACHE
        self.cache_root = root / GENERATOR_VERSION
        self.stats: dict[str, Any] = {"games_skipped": 0, "skipped": [], "replans": 0}
        self._engine = build_engine(facts=True)
        self._loaded: Path | None = None
        self._broken: set[Path] = set()
        self._done = True
        self._turn = 0

    # ------------------------------------------------------------------ protocol
    def reset(self, seed: int = 0, split: str = "train") -> Observation:
        """Start game ``seed`` of ``split``: the same pair always gives the same game."""
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise AlfworldError(f"seed must be a non-negative integer, got {seed!r}")
        if split not in SPLITS:
            raise AlfworldError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
        if self.official is not None:
            return self._reset_official(int(seed), split)
        return self._reset_generated(int(seed), split)

    def step(self, action: str) -> StepResult:
        """Apply one command. Bad text never raises: it answers "Nothing happens."."""
        if self._done:
            raise AlfworldError("step() before reset() or after the episode ended; call reset()")
        command = self._match(action)
        self._turn += 1
        if command is None:  # PddlEnv answers this and changes nothing; skip the engine
            text, won = NOTHING_HAPPENS, False
        else:
            state, _, _ = self._engine.step(command)
            text, won = state.feedback, bool(state["won"])
            self._plan_step(command)
            self._observe_state(state)
        self._done = won or self._turn >= self.max_turns
        return StepResult(
            observation=self._observation(text),
            reward=WIN_REWARD if won else 0.0,
            done=self._done,
            info=step_info(
                won=won,
                action_valid=command is not None,
                turn=self._turn,
                truncated=self._done and not won,
                gamefile=str(self._loaded),
            ),
        )

    def expert_action(self) -> str:
        """ALFWorld's planner expert: the next command of the plan from the current state.

        Returns "look" when no plan exists (ALFWorld's expert default).
        """
        if self._loaded is None:
            raise AlfworldError("expert_action() called before reset()")
        if (
            self._plan is None
            or self._cursor >= len(self._plan)
            or (self._plan[self._cursor] not in self._admissible)
        ):
            self._plan, self._cursor = replan(self._engine), 0
            self.stats["replans"] += 1
        return self._plan[self._cursor] if self._plan else "look"

    # ------------------------------------------------------------------ games
    def _reset_official(self, seed: int, split: str) -> Observation:
        games = self.official.games(split)
        for k in range(len(games)):  # a broken file is reported and the next game played
            game = games[(seed + k) % len(games)]
            if game.path in self._broken:
                continue
            try:
                return self._start(game)
            except AlfworldError as err:
                self._broken.add(game.path)
                self.stats["games_skipped"] += 1
                self.stats["skipped"].append(f"{game.path}: {err}")
        raise AlfworldError(
            f"no playable {', '.join(self.task_types)} game in split {split!r} under "
            f"{self.official.root}; skipped: {'; '.join(self.stats['skipped'][-3:]) or 'none'}"
        )

    def _reset_generated(self, seed: int, split: str) -> Observation:
        k = len(self.task_types)
        base = TASK_TYPES.index(self.task_types[seed % k])
        game_seed = len(TASK_TYPES) * (seed // k) + base  # game_seed % 6 is the wanted type
        for retry in range(2):
            path = solvable_game(
                self.cache_root,
                split,
                game_seed,
                timeout_s=self.planner_timeout_s,
                stats=self.stats,
            )
            try:
                return self._start(GameFile(path, TASK_TYPES[base]))
            except AlfworldError as err:  # a damaged cache file: report, regenerate once
                self.stats["games_skipped"] += 1
                self.stats["skipped"].append(f"{path}: {err}")
                path.unlink(missing_ok=True)
                if retry:
                    raise
        raise AssertionError("unreachable")

    def _start(self, game: GameFile) -> Observation:
        try:
            gamedata = json.loads(game.path.read_text())
            self._task = task_of(game.task_type, gamedata["pddl_problem"])
            walkthrough = gamedata.get("walkthrough")
            if game.path != self._loaded:
                self._loaded = None
                load_game(self._engine, game.path)
            state = reset_game(self._engine)
        except (Exception, SystemExit) as err:  # the engine raises assorted errors on bad files
            self._loaded, self._done = None, True
            raise AlfworldError(f"cannot load game: {type(err).__name__}: {err}") from None
        self._loaded, self._turn, self._done = game.path, 0, False
        # Generated games store the planner's plan from the start; official files may store
        # the hand-coded expert's, so there the planner is asked on the first call.
        good = self.source == "generated" and isinstance(walkthrough, list)
        good = good and all(isinstance(c, str) for c in walkthrough)
        self._plan, self._cursor = (list(walkthrough) if good and walkthrough else None), 0
        self._observe_state(state)
        self._start_facts = ctx.start_of(self._facts)
        self._task_text = _task_sentence(state.feedback)
        self._task_type = game.task_type
        return self._observation(state.feedback)

    # ------------------------------------------------------------------ helpers
    def _match(self, action: Any) -> str | None:
        if not isinstance(action, str) or len(action) > MAX_COMMAND_CHARS:
            return None
        for candidate in (action.strip(), " ".join(action.lower().split())):
            if candidate in self._admissible_set:
                return candidate
        return None

    def _plan_step(self, command: str) -> None:
        """Keep the cached plan while the agent follows it; drop it when it leaves."""
        if (
            self._plan is not None
            and self._cursor < len(self._plan)
            and (self._plan[self._cursor] == command)
        ):
            self._cursor += 1
        else:
            self._plan = None

    def _observe_state(self, state: Any) -> None:
        self._facts = fact_tuples(state)
        self._admissible = tuple(state["admissible_commands"])
        self._admissible_set = frozenset(self._admissible)
        self._won = bool(state["won"])
        self._keys: tuple[str, str] | None = None

    def _observation(self, text: str) -> Observation:
        if self._keys is None:  # computed once per state (an invalid command keeps it)
            self._keys = ctx.state_keys(self._facts, self._start_facts)
            self._progress = ctx.progress(self._facts, self._task, self._won)
            self._enabled = ctx.enabled(self._facts, self._task, self._admissible)
        context = Context(
            anchor=ctx.anchor(text, self._facts, self._admissible),
            state=self._keys[0],
            state_coarse=self._keys[1],
            progress=self._progress[0],
            enabled=self._enabled,
            progress_value=self._progress[1],
        )
        return Observation(text, self._task_text, self._admissible, context, self._task_type)

    @property
    def facts(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The current PDDL facts as (predicate, args) tuples (read-only view)."""
        return self._facts

    @property
    def task(self) -> ctx.TaskSpec:
        return self._task


def _task_sentence(intro: str) -> str:
    """The "Your task is to: ..." line of ALFWorld's intro text."""
    for line in intro.splitlines():
        if line.startswith("Your task is to:"):
            return line.strip()
    return ""
