"""ALFWorld-style PDDL problems assembled offline from the alfworld wheel's own assets.

The official ALFWorld games (json_2.1.1, from ``alfworld-download``) cannot be fetched
offline. The wheel ships everything else the text engine needs: the domain
(``alfred.pddl``), the grammar (``alfred.twl2``), the goal library (PDDL goals and English
templates of the six task types), the compatibility tables (``VAL_RECEPTACLE_OBJECTS``,
``VAL_ACTION_OBJECTS``, ``OPENABLE_CLASS_LIST``) and 120 AI2-THOR scene layouts
(``FloorPlan*-objects.json``: object types; ``*-openable.json``: receptacle ids and poses).
:func:`build_game` assembles a game from these (recipe in docs/envs/alfworld.md, reference
environments.md §1.4); ``generate.py`` puts it through ALFWorld's solvability gate (the
planner's plan must win) and caches it on disk.

Departures from ALFWorld's own generator (which replays ALFRED trajectories in AI2-THOR):
- objects are placed at random in compatible receptacles, not by physics, so the games are
  ALFWorld-*style* (synthetic) and scores are not comparable with published ALFWorld numbers;
- every receptacle with an interaction pose in the layout is kept; object ids get THOR-like
  coordinates derived from their receptacle, so that the demangler numbers them as usual;
- splits: ``train`` and ``valid_seen`` use ALFRED's training scenes (different seed streams),
  ``valid_unseen`` uses the scenes ALFRED holds out (``TEST_SCENE_NUMBERS``).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cache
from typing import Any

from mcgpo.envs.alfworld.engine import require_alfworld
from mcgpo.envs.alfworld_keys import TASK_TYPES

__all__ = ["GENERATOR_VERSION", "SceneLayout", "build_game", "load_scene", "mangle"]

GENERATOR_VERSION = "gen-v1"
# seed s plays type TASK_TYPES[s % 6] (ALFWorld's task-type ids 1..6, alfworld_keys)
NEEDS = {  # receptacle type a task type cannot do without
    "pick_clean_then_place_in_recep": "SinkBasin",
    "pick_heat_then_place_in_recep": "Microwave",
    "pick_cool_then_place_in_recep": "Fridge",
}
ACTION_CLASS = {  # task type -> VAL_ACTION_OBJECTS class the target must belong to
    "pick_clean_then_place_in_recep": "Cleanable",
    "pick_heat_then_place_in_recep": "Heatable",
    "pick_cool_then_place_in_recep": "Coolable",
}
NOT_A_GOAL = {"SinkBasin", "Microwave", "Fridge", "GarbageCan"}  # never the goal receptacle
LAMP_HOSTS = {
    "DeskLamp": {"SideTable", "Desk", "Dresser"},
    "FloorLamp": {"SideTable", "Desk", "Dresser", "ArmChair", "Sofa", "CoffeeTable", "TVStand"},
}
SEED_STREAMS = {"train": "train", "valid_seen": "valid_seen", "valid_unseen": "valid_unseen"}
_MANGLE = (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_"))


def mangle(thor_id: str) -> str:
    """ALFWorld's PDDL form of an AI2-THOR id ('-' first, as ALFWorld's own fix-up does)."""
    for old, new in _MANGLE:
        thor_id = thor_id.replace(old, new)
    return thor_id


@dataclass(frozen=True)
class SceneLayout:
    """One AI2-THOR floor plan as the wheel describes it."""

    number: int
    receptacles: tuple[
        tuple[str, str, tuple[int, int, int, int]], ...
    ]  # (thor id, type, grid pose)
    object_types: tuple[str, ...]  # every type listed in FloorPlan<n>-objects.json


@cache
def load_scene(number: int) -> SceneLayout:
    """Receptacle instances (ids with an interaction pose) and object types of one scene.

    A sink's id is ``Sink|x|y|z|SinkBasin``: its type is the last segment (ALFWorld names it
    "sinkbasin 1"; writing ``SinkBasin|...`` would come out as "sinkbasinbasin 1").
    """
    mod = require_alfworld()
    valid = mod["constants"].VAL_RECEPTACLE_OBJECTS
    movable = set(mod["constants"].MOVABLE_RECEPTACLES)
    layouts = mod["layouts"]
    poses = json.loads((layouts / f"FloorPlan{number}-openable.json").read_text())
    receptacles = []
    for thor_id, (x, z, rotation, horizon) in sorted(poses.items()):
        parts = thor_id.split("|")
        rtype = parts[-1] if len(parts) == 5 else parts[0]
        if rtype in valid and rtype not in movable:
            grid = (round(x / 0.25), round(z / 0.25), round(rotation / 90) % 4, int(horizon))
            receptacles.append((thor_id, rtype, grid))
    types = json.loads((layouts / f"FloorPlan{number}-objects.json").read_text())
    return SceneLayout(number, tuple(receptacles), tuple(sorted(set(types))))


def split_scenes(split: str) -> tuple[int, ...]:
    """ALFRED's training scenes for train/valid_seen, its held-out scenes for valid_unseen."""
    constants = require_alfworld()["constants"]
    if split not in SEED_STREAMS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SEED_STREAMS)}")
    numbers = (
        constants.TEST_SCENE_NUMBERS if split == "valid_unseen" else constants.TRAIN_SCENE_NUMBERS
    )
    return tuple(sorted(numbers))


@cache
def _hosting_scenes(split: str, task_type: str) -> tuple[int, ...]:
    """The scenes of ``split`` whose rooms and receptacles can host ``task_type``."""
    probe = random.Random(0)
    return tuple(
        n for n in split_scenes(split) if _choose_task(task_type, load_scene(n), probe) is not None
    )


def _room(number: int) -> str:
    return {0: "Kitchen", 2: "LivingRoom", 3: "Bedroom", 4: "Bathroom"}[number // 100]


def _pickupable(scene: SceneLayout, constants: Any) -> list[str]:
    """Object types of the scene that some static receptacle type can hold."""
    present = {rtype for _, rtype, _ in scene.receptacles}
    valid = constants.VAL_RECEPTACLE_OBJECTS
    static = set(valid) - set(constants.MOVABLE_RECEPTACLES)
    return [
        otype
        for otype in scene.object_types
        if otype not in static and any(otype in valid[r] for r in present)
    ]


def _choose_task(task_type: str, scene: SceneLayout, rng: random.Random) -> dict | None:
    """(target, goal receptacle type, lamp) for this task type in this scene, or None."""
    constants = require_alfworld()["constants"]
    valid = constants.VAL_RECEPTACLE_OBJECTS
    present = sorted({rtype for _, rtype, _ in scene.receptacles})
    if _room(scene.number) not in constants.GOALS_VALID[task_type]:
        return None
    if task_type in NEEDS and NEEDS[task_type] not in present:
        return None
    targets = _pickupable(scene, constants)
    if task_type in ACTION_CLASS:
        targets = [t for t in targets if t in constants.VAL_ACTION_OBJECTS[ACTION_CLASS[task_type]]]
    lamp = None
    if task_type == "look_at_obj_in_light":
        lamps = [
            lamp
            for lamp in ("DeskLamp", "FloorLamp")
            if lamp in scene.object_types and LAMP_HOSTS[lamp] & set(present)
        ]
        if not lamps or not targets:
            return None
        lamp = rng.choice(lamps)
        return {"target": rng.choice(targets), "recep": None, "lamp": lamp}
    pairs = [
        (t, r)
        for t in targets
        for r in present
        if r not in NOT_A_GOAL
        and t in valid[r]
        and any(t in valid[other] for other in present if other != r)  # can start elsewhere
    ]
    if not pairs:
        return None
    target, recep = rng.choice(pairs)
    return {"target": target, "recep": recep, "lamp": lamp}


def _object_id(otype: str, recep_id: str, k: int) -> str:
    """A THOR-like id for the k-th object placed in ``recep_id`` (unique per game)."""
    x, y, z = (float(v) for v in recep_id.split("|")[1:4])
    return f"{otype}|{x:+06.2f}|{y + 0.01 * (k + 1):+06.2f}|{z:+06.2f}"


def _loc(grid: tuple[int, int, int, int]) -> str:
    return "loc|" + "|".join(str(v) for v in grid)


def build_game(split: str, seed: int, attempt: int = 0) -> tuple[dict, dict] | None:
    """The (game.tw-pddl data, traj_data) of game ``seed`` of ``split``, before solving.

    Deterministic in (split, seed, attempt). Returns None when the drawn scene cannot host
    the task type (the caller moves on to the next attempt).
    """
    mod = require_alfworld()
    constants, goals = mod["constants"], mod["goal_library"].gdict
    task_type = TASK_TYPES[seed % len(TASK_TYPES)]
    rng = random.Random(f"mcgpo-alfworld/{GENERATOR_VERSION}/{split}/{seed}/{attempt}")
    scene = load_scene(rng.choice(_hosting_scenes(split, task_type)))
    task = _choose_task(task_type, scene, rng)
    if task is None:
        return None
    valid = constants.VAL_RECEPTACLE_OBJECTS
    target, recep, lamp = task["target"], task["recep"], task["lamp"]

    # Place 1-2 instances of every pickupable type (2-3 of a pick-two target) at random in a
    # compatible receptacle; targets never start in a receptacle of the goal type.
    placements: list[tuple[str, str, str]] = []  # (object id, type, receptacle id)
    per_recep: dict[str, int] = {}

    def place(otype: str, hosts: list[tuple[str, str, tuple]]) -> None:
        recep_id = rng.choice(hosts)[0]
        k = per_recep.get(recep_id, 0)
        per_recep[recep_id] = k + 1
        placements.append((_object_id(otype, recep_id, k), otype, recep_id))

    for otype in _pickupable(scene, constants):
        hosts = [r for r in scene.receptacles if otype in valid[r[1]]]
        if otype == target and recep is not None:
            hosts = [r for r in hosts if r[1] != recep]
        count = rng.randint(2, 3) if otype == target and task_type.startswith("pick_two") else 1
        count = count if otype == target else rng.randint(1, 2)
        for _ in range(count):
            place(otype, hosts)
    if lamp is not None:
        place(lamp, [r for r in scene.receptacles if r[1] in LAMP_HOSTS[lamp]])

    problem = _problem_text(scene, placements, task_type, target, recep, lamp, goals, constants)
    template = rng.choice(goals[task_type]["templates"])
    sentence = template.format(
        obj=target.lower(), recep=(recep or "").lower(), toggle=(lamp or "").lower(), mrecep=""
    )
    gamedata = {
        "pddl_domain": mod["domain"],
        "grammar": mod["grammar"].replace("UNKNOWN GOAL", sentence),
        "pddl_problem": problem,
        "solvable": None,
        "walkthrough": None,
    }
    traj_data = {
        "task_type": task_type,
        "scene": {"floor_plan": f"FloorPlan{scene.number}", "scene_num": scene.number},
        "pddl_params": {
            "object_target": target,
            "parent_target": recep or "",
            "toggle_target": lamp or "",
            "mrecep_target": "",
            "object_sliced": False,
        },
        "task_desc": sentence,
        "mcgpo": {"generator": GENERATOR_VERSION, "split": split, "seed": seed, "attempt": attempt},
    }
    return gamedata, traj_data


def _problem_text(scene, placements, task_type, target, recep, lamp, goals, constants) -> str:
    """The PDDL problem: objects, the (:init ...) facts and the goal-library goal."""
    valid = constants.VAL_RECEPTACLE_OBJECTS
    rtypes = sorted(set(valid) - set(constants.MOVABLE_RECEPTACLES))
    otypes = sorted((set(constants.OBJECTS) | set(constants.MOVABLE_RECEPTACLES)) - set(rtypes))
    recep_loc = {rid: _loc(grid) for rid, _, grid in scene.receptacles}
    used = set(recep_loc.values())
    start = (min(g[0] for _, _, g in scene.receptacles) - 4, 0, 0, 30)
    while _loc(start) in used:
        start = (start[0] - 1, 0, 0, 30)
    present_o = {otype for _, otype, _ in placements}
    action_objects = constants.VAL_ACTION_OBJECTS
    init = [f"(atLocation agent1 {_loc(start)})", "(= (total-cost) 0)"]
    for rid, rtype, _ in scene.receptacles:
        init += [
            f"(receptacleType {rid} {rtype}Type)",
            f"(receptacleAtLocation {rid} {recep_loc[rid]})",
        ]
        if rtype in constants.OPENABLE_CLASS_LIST:
            init.append(f"(openable {rid})")
    for oid, otype, rid in placements:
        init += [
            f"(objectType {oid} {otype}Type)",
            f"(inReceptacle {oid} {rid})",
            f"(objectAtLocation {oid} {recep_loc[rid]})",
        ]
        if otype == lamp:
            init.append(f"(toggleable {oid})")
            continue
        init.append(f"(pickupable {oid})")
        for klass, predicate in (
            ("Heatable", "heatable"),
            ("Coolable", "coolable"),
            ("Cleanable", "cleanable"),
            ("Sliceable", "sliceable"),
        ):
            if otype in action_objects[klass]:
                init.append(f"({predicate} {oid})")
        if otype == target and rid.startswith("Fridge|"):
            init.append(f"(isCool {oid})")  # as ALFWorld: targets found in a fridge are cool
    for rtype in sorted({r for _, r, _ in scene.receptacles}):
        init += [f"(canContain {rtype}Type {o}Type)" for o in sorted(valid[rtype] & present_o)]
    objects = (
        ["agent1 - agent"]
        + [f"{loc} - location" for loc in sorted(used | {_loc(start)})]
        + [f"{rid} - receptacle" for rid, _, _ in scene.receptacles]
        + [f"{oid} - object" for oid, _, _ in placements]
        + [f"{t}Type - otype" for t in otypes]
        + [f"{t}Type - rtype" for t in rtypes]
    )
    goal = goals[task_type]["pddl"].format(
        obj=target, recep=recep or "", toggle=lamp or "", mrecep=""
    )
    body = (
        f"(define (problem plan_mcgpo_{scene.number})\n(:domain alfred)\n(:objects\n    "
        + "\n    ".join(mangle_line(o) for o in objects)
        + "\n)\n(:init\n    "
        + "\n    ".join(mangle_line(f) for f in init)
        + "\n)\n"
    )
    return body + goal.replace("#", "-")


def mangle_line(line: str) -> str:
    """Mangle the ids of one PDDL line, leaving the ' - ' type separator intact."""
    if " - " in line:
        name, kind = line.split(" - ")
        return f"{mangle(name)} - {kind}"
    head, *rest = line.strip("()").split(" ")
    if head == "=":
        return line
    return "(" + " ".join([head, *(mangle(word) for word in rest)]) + ")"
