"""TextWorld-Express (optional extra ``twx``, needs Java 11+) behind mcgpo's env protocol.

TextWorld-Express (Jansen & Côté 2022, arXiv 2208.01174) simulates TWC, CookingWorld, Coin
and five more games in a JVM (the jar ships in the wheel; py4j talks to it). Splits map to
its folds: train -> train, valid_seen -> dev, valid_unseen -> test; seed ``s`` of a split
plays the fold's seed ``seeds[s % 1000]`` (``getValidSeedsTrain/Dev/Test``).

Reward (the only one; nothing rescales it elsewhere): **10 on the step where the game reports
``tasksuccess``, 0 otherwise**, as the ALFWorld-like envs. ``info`` (their step info,
``alfworld_keys.step_info``) holds ``won`` (tasksuccess), ``score`` (TWX's score: raw subgoal
points / maximum, -1 after a failure), ``action_valid`` (the command is one of TWX's valid
actions), ``turn``, ``truncated``, ``score_raw`` and ``failed`` (taskfailure, a dead end such
as eating the wrong item). An
episode ends on success, failure or after ``max_turns`` commands. Every command string goes to
TWX unchanged (after white-space/case normalisation when that makes it valid), so the
observation text is TWX's own, including "Unknown action: I'm not sure what you mean.".

Context (docs/envs/textworld-express.md):
- anchor: the observation text, the room and carried items, the sorted valid actions (the
  ALFWorld-like anchor, ``alfworld_keys.anchor``; "unknown" when the room is not known);
- state h(s): TWX's ``look`` text and inventory items (white space normalised); coarse: the
  room and the carried items with digits removed (what is where in the room is dropped);
- progress C: ``score=<raw points>``; ``progress_value`` = the score clipped to [0, 1];
- enabled F: the verbs of the valid actions that can score (take, put, cook, slice, eat, ...:
  everything but navigation, look, inventory, examine, read, open and close).
``expert_action()`` follows TWX's gold path while the agent is on it; off it, a best effort
(the next gold action that is valid now, else "look around"), counted in ``stats``.
"""

from __future__ import annotations

import numbers
import re
import shutil
import subprocess
from functools import lru_cache
from typing import Any

from mcgpo.envs.alfworld_keys import anchor, step_info
from mcgpo.envs.protocol import SPLITS, Context, Observation, StepResult, unknown_option

__all__ = ["FOLDS", "WIN_REWARD", "TextWorldExpressEnv", "TextWorldExpressError", "TwxUnavailable"]

WIN_REWARD = 10.0
FOLDS = {"train": "train", "valid_seen": "dev", "valid_unseen": "test"}
GAMES = (
    "twc",
    "cookingworld",
    "coin",
    "mapreader",
    "arithmetic",
    "sorting",
    "simonsays",
    "peckingorder",
)
INSTALL_HINT = "pip install 'mcgpo[twx]'  (textworld-express==1.1.0)"
JAVA_HINT = "install a JDK, e.g. apt-get install openjdk-17-jre-headless"
NON_SCORING = frozenset({"look", "inventory", "examine", "move", "read", "open", "close", "help"})
MAX_COMMAND_CHARS = 1000
_ROOM = re.compile(r"^You are in the ([^.]+)\.")
_DIGITS = re.compile(r"\d+")
_ARTICLE = re.compile(r"^(a|an|the|some) ")


class TextWorldExpressError(ValueError):
    """A bad option, seed or split, or a call out of order."""


class TwxUnavailable(ImportError):
    """The ``twx`` extra or Java is missing; the message names the fix."""


@lru_cache(maxsize=1)
def _java_major() -> int:
    """Major version of the ``java`` on PATH; TwxUnavailable when there is none."""
    java = shutil.which("java")
    if java is None:
        raise TwxUnavailable(
            f"textworld-express needs Java 11+ on PATH (no `java` found); {JAVA_HINT}"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if m is None:
        raise TwxUnavailable(
            f"textworld-express needs Java 11+; cannot read `{java} -version`; {JAVA_HINT}"
        )
    major = int(m.group(1)) if m.group(1) != "1" else int(m.group(2) or 0)  # "1.8" -> 8
    if major < 11:
        raise TwxUnavailable(
            f"textworld-express needs Java 11+, found Java {major} at {java}; {JAVA_HINT}"
        )
    return major


def _engine_class() -> type:
    try:
        from textworld_express import TextWorldExpressEnv as Engine
    except ImportError as err:
        raise TwxUnavailable(
            f"the textworld-express environment needs the twx extra ({err}); install it with: {INSTALL_HINT}"
        ) from None
    return Engine


def _norm(text: str) -> str:
    return " ".join(text.split())


def room_of(look: str) -> str:
    """The room name of a TWX ``look`` text ("You are in the kitchen. ..." -> "kitchen")."""
    m = _ROOM.match(look.strip())
    return m.group(1) if m else ""


def items_of(inventory: str) -> list[str]:
    """The carried items of a TWX inventory text, articles stripped, sorted."""
    lines = [line.strip() for line in inventory.splitlines()[1:]]
    return sorted(
        _ARTICLE.sub("", line) for line in lines if line and not line.startswith("Your inventory")
    )


def context_of(text: str, infos: dict[str, Any], actions: tuple[str, ...]) -> Context:
    """The MCGPO context of one TWX state (see the module docstring)."""
    look, inventory = infos.get("look", ""), infos.get("inventory", "")
    room, items = room_of(look), items_of(inventory)
    score = float(infos.get("score", 0.0))
    enabled = sorted({a.split(" ", 1)[0] for a in actions if a} - NON_SCORING)
    coarse_items = sorted(_norm(_DIGITS.sub("", item)) for item in items)
    return Context(
        anchor=anchor(text, room or "unknown", ", ".join(items), actions),
        state=f"look={_norm(look)};inventory={','.join(items)}",
        state_coarse=f"loc={room};hold={','.join(coarse_items)}",
        progress=f"score={float(infos.get('scoreRaw', 0.0)):g}",
        enabled=",".join(enabled),
        progress_value=min(max(score, 0.0), 1.0),
    )


class TextWorldExpressEnv:
    """One TWX episode at a time in its own JVM; see the module docstring.

    Options: ``game`` ("twc"; also "cookingworld", "coin", ...), ``game_params`` ("" = TWX's
    defaults, e.g. "numLocations=1,numItemsToPutAway=2"), ``max_turns`` (100, TWX's own
    ``envStepLimit`` default: CookingWorld's gold paths reach ~50 commands), ``gold_path``
    (True: ask TWX for the gold path at reset, needed by ``expert_action``).
    """

    def __init__(
        self,
        *,
        game: str = "twc",
        game_params: str = "",
        max_turns: int = 100,
        gold_path: bool = True,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise TextWorldExpressError(
                unknown_option("textworld-express", unknown, TextWorldExpressEnv)
            )
        if game not in GAMES:
            raise TextWorldExpressError(f"unknown TWX game {game!r}; known: {', '.join(GAMES)}")
        if not isinstance(game_params, str):
            raise TextWorldExpressError(f"game_params must be a string, got {game_params!r}")
        if (
            isinstance(max_turns, bool)
            or not isinstance(max_turns, numbers.Integral)
            or max_turns < 1
        ):
            raise TextWorldExpressError(f"max_turns must be a positive integer, got {max_turns!r}")
        engine_class = _engine_class()  # one clear error naming the install command
        _java_major()
        self.game, self.game_params = game, game_params
        self.max_turns, self.gold_path = int(max_turns), bool(gold_path)
        self._engine = engine_class(envStepLimit=10**9)  # the turn limit is enforced here
        self._seeds: dict[str, list[int]] = {}
        self.stats: dict[str, int] = {"expert_off_path": 0}
        self._done, self._turn, self._infos = True, 0, None

    def close(self) -> None:
        """Stop the JVM (also done when the object is garbage collected)."""
        self._engine.close()

    # ------------------------------------------------------------------ protocol
    def reset(self, seed: int = 0, split: str = "train") -> Observation:
        """Start TWX game ``seed`` of ``split``'s fold: the same pair gives the same game."""
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise TextWorldExpressError(f"seed must be a non-negative integer, got {seed!r}")
        if split not in SPLITS:
            raise TextWorldExpressError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
        fold = FOLDS[split]
        if fold not in self._seeds:
            getter = {
                "train": "getValidSeedsTrain",
                "dev": "getValidSeedsDev",
                "test": "getValidSeedsTest",
            }
            self._seeds[fold] = list(getattr(self._engine, getter[fold])())
        seeds = self._seeds[fold]
        try:
            text, infos = self._engine.reset(
                seed=seeds[int(seed) % len(seeds)],
                gameFold=fold,
                gameName=self.game,
                gameParams=self.game_params,
                generateGoldPath=self.gold_path,
            )
        except ValueError as err:  # TWX rejects bad gameParams with a one-line message
            raise TextWorldExpressError(f"textworld-express rejected the game: {err}") from None
        self._gold = list(self._engine.getGoldActionSequence()) if self.gold_path else []
        self._cursor, self._on_path = 0, True
        self._turn, self._done = 0, False
        self._task = infos.get("taskDescription", "")
        return self._observe(text, infos)

    def step(self, action: str) -> StepResult:
        """Apply one command. Bad text never raises: TWX answers "Unknown action: ..."."""
        if self._done:
            raise TextWorldExpressError(
                "step() before reset() or after the episode ended; call reset()"
            )
        command = action if isinstance(action, str) else ""
        command = command[:MAX_COMMAND_CHARS]
        valid = command in self._valid
        if not valid and _norm(command.lower()) in self._valid:
            command, valid = _norm(command.lower()), True
        text, _, _, infos = self._engine.step(command)
        self._turn += 1
        self._follow(command)
        won, failed = bool(infos["tasksuccess"]), bool(infos["taskfailure"])
        self._done = won or failed or self._turn >= self.max_turns
        return StepResult(
            observation=self._observe(text, infos),
            reward=WIN_REWARD if won else 0.0,
            done=self._done,
            info=step_info(
                won=won,
                action_valid=valid,
                turn=self._turn,
                truncated=self._done and not (won or failed),
                score=float(infos["score"]),
                score_raw=float(infos["scoreRaw"]),
                failed=failed,
            ),
        )

    def expert_action(self) -> str:
        """The gold path's next action while on it; off it, a best effort (module docstring)."""
        if self._infos is None:
            raise TextWorldExpressError("expert_action() called before reset()")
        if not self.gold_path:
            raise TextWorldExpressError("expert_action() needs gold_path=True")
        if self._on_path and self._cursor < len(self._gold):
            return self._gold[self._cursor]
        self.stats["expert_off_path"] += 1
        for command in self._gold[self._cursor :]:
            if command in self._valid:
                return command
        return "look around"

    # ------------------------------------------------------------------ helpers
    def _follow(self, command: str) -> None:
        """Advance the gold-path cursor; off the path, resynchronise on a later gold action."""
        rest = self._gold[self._cursor :]
        if self._on_path and rest and rest[0] == command:
            self._cursor += 1
            return
        self._on_path = False
        if command in rest:
            self._cursor += rest.index(command) + 1

    def _observe(self, text: str, infos: dict[str, Any]) -> Observation:
        self._infos = infos
        actions = tuple(sorted(infos.get("validActions", ())))
        self._valid = frozenset(actions)
        context = context_of(text, infos, actions)
        return Observation(text, self._task, actions, context, self.game)
