"""Game files in the official ALFWorld layout (``$ALFWORLD_DATA/json_2.1.1/<split>/...``).

The selection follows ``AlfredTWEnv.collect_game_files``: a trial folder counts when its
``traj_data.json`` names one of the six task types, it is not a movable-receptacle or sliced
trial, ``game.tw-pddl`` exists and says ``"solvable": true``. Departures: the list is sorted
(ALFWorld keeps ``os.walk`` order, which depends on the file system), and a trial whose files
do not parse is listed in ``skipped`` with the reason instead of stopping the walk.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from mcgpo.envs.alfworld.context import TaskSpec
from mcgpo.envs.alfworld_keys import TASK_TYPES

__all__ = ["GameFile", "OfficialGames", "has_games", "task_of"]

DATA_DIR = "json_2.1.1"


@dataclass(frozen=True)
class GameFile:
    """One playable game: its ``game.tw-pddl`` and the task type from ``traj_data.json``."""

    path: Path
    task_type: str


@dataclass
class OfficialGames:
    """The games of each split under ``root`` (lazily collected, then cached)."""

    root: Path
    task_types: tuple[str, ...] = TASK_TYPES
    skipped: list[str] = field(default_factory=list)  # "path: reason"
    _by_split: dict[str, list[GameFile]] = field(default_factory=dict)

    def games(self, split: str) -> list[GameFile]:
        if split not in self._by_split:
            self._by_split[split] = self._collect(split)
        return self._by_split[split]

    def _collect(self, split: str) -> list[GameFile]:
        games = []
        for root, _, files in sorted(os.walk(self.root / DATA_DIR / split)):
            if "traj_data.json" not in files or "movable" in root or "Sliced" in root:
                continue
            folder = Path(root)
            try:
                task_type = json.loads((folder / "traj_data.json").read_text())["task_type"]
            except (OSError, ValueError, KeyError, TypeError) as err:
                self.skipped.append(f"{folder / 'traj_data.json'}: {type(err).__name__} {err}")
                continue
            if task_type not in self.task_types or not (folder / "game.tw-pddl").exists():
                continue
            try:
                gamedata = json.loads((folder / "game.tw-pddl").read_text())
                solvable = gamedata["solvable"]
            except (OSError, ValueError, KeyError, TypeError) as err:
                self.skipped.append(f"{folder / 'game.tw-pddl'}: {type(err).__name__} {err}")
                continue
            if solvable is True:
                games.append(GameFile(folder / "game.tw-pddl", task_type))
        return games


def has_games(root: Path | None) -> bool:
    """Whether ``root`` looks like an ALFWorld data folder (has json_2.1.1/<split>/)."""
    return root is not None and any(
        (Path(root) / DATA_DIR / s).is_dir() for s in ("train", "valid_seen", "valid_unseen")
    )


_GOAL_TYPES = re.compile(r"\((objecttype|receptacletype) \?(\w+) (\w+)type\)", re.IGNORECASE)


def task_of(task_type: str, pddl_problem: str) -> TaskSpec:
    """The goal's target / receptacle / lamp types, read from the problem's ``(:goal ...)``.

    The goal library names them as ``(objectType ?o AppleType)``, ``(receptacleType ?r
    CounterTopType)`` and, for the lamp, ``(objectType ?ot DeskLampType)``.
    """
    start = pddl_problem.lower().find("(:goal")
    if start < 0:
        raise ValueError("the PDDL problem has no (:goal ...) section")
    target = recep = lamp = ""
    for kind, var, name in _GOAL_TYPES.findall(pddl_problem[start:]):
        name = name.lower()
        if kind.lower() == "receptacletype":
            recep = recep or name
        elif var.lower() == "ot":
            lamp = lamp or name
        else:
            target = target or name
    if not target:
        raise ValueError("the goal names no target object type")
    return TaskSpec(task_type, target, recep, lamp)
