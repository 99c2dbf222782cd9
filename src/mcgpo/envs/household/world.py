"""One household task: a room filled with objects, and a goal in ALFWorld's words.

``draw_world(seed, split, attempt, ...)`` makes one candidate task from a string seed:

1. the task type is ``task_types[seed % len(task_types)]`` (so consecutive seeds cycle
   through the types and every type is equally frequent);
2. a room kind where that type is posed, and a layout of that kind from the split's rooms
   (``layouts.split_layouts``);
3. a target object type that fits the task (heatable for heat tasks, ...) and, except for
   look tasks, a goal receptacle type that may hold it; the goal is never a sink or bathtub
   basin nor the appliance that processes the target ("put a cool X in fridge" would be
   done by cooling alone);
4. 1-3 instances of the target (2-3 for pick two), none of them starting in a receptacle of
   the goal type; ``n_distractors`` other objects (6-14 when None) in compatible places;
   a desk lamp on a side table, desk or dresser in living rooms and bedrooms;
5. the task sentence from ALFWorld-style templates ("put a hot tomato in countertop.").

It returns None when the room cannot host the task; ``tasks.task_world`` then retries with
the next attempt number, and also rejects tasks the expert cannot solve. Everything about
the task is immutable; the mutable play state lives in ``engine.State``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from mcgpo.envs.household.catalog import (
    APPLIANCE,
    LAMP,
    LAMP_HOLDERS,
    OBJECTS,
    OPENABLE,
    PROCESSES,
    ROOM_OBJECTS,
    TASK_ROOMS,
)
from mcgpo.envs.household.layouts import split_layouts

__all__ = ["TEMPLATES", "World", "draw_world"]

# Task type -> sentence templates ({obj}: target type, {recep}: goal receptacle type).
TEMPLATES: dict[str, tuple[str, ...]] = {
    "pick_and_place_simple": ("put a {obj} in {recep}.", "put some {obj} on {recep}."),
    "look_at_obj_in_light": (
        "look at {obj} under the desklamp.",
        "examine the {obj} with the desklamp.",
    ),
    "pick_clean_then_place_in_recep": (
        "put a clean {obj} in {recep}.",
        "clean some {obj} and put it in {recep}.",
    ),
    "pick_heat_then_place_in_recep": (
        "put a hot {obj} in {recep}.",
        "heat some {obj} and put it in {recep}.",
    ),
    "pick_cool_then_place_in_recep": (
        "put a cool {obj} in {recep}.",
        "cool some {obj} and put it in {recep}.",
    ),
    "pick_two_obj_and_place": (
        "put two {obj} in {recep}.",
        "find two {obj} and put them in {recep}.",
    ),
}


@dataclass(frozen=True, eq=False)
class World:
    """An immutable task: receptacles and objects (indices into the tuples) and the goal.

    Compared and hashed by identity (tasks are cached per (seed, split, options)).
    """

    seed: int
    split: str
    task_type: str
    kind: str  # room kind: kitchen, livingroom, bedroom, bathroom
    layout: int  # layout number within the room kind
    receptacles: tuple[str, ...]  # [n_rec] names, sorted: "cabinet 1", "cabinet 2", ...
    rec_types: tuple[str, ...]  # [n_rec] receptacle type of each
    objects: tuple[str, ...]  # [n_obj] names, sorted by (type, number): "apple 1", ...
    obj_types: tuple[str, ...]  # [n_obj] object type of each
    start: tuple[int, ...]  # [n_obj] receptacle index each object starts in
    target: str  # target object type
    goal: str | None  # goal receptacle type (None for look tasks)
    sentence: str  # "put a hot tomato in countertop."
    # derived lookups, filled in __post_init__
    process: str | None = field(init=False)  # "heat" / "cool" / "clean" / None
    openable: tuple[bool, ...] = field(init=False)  # [n_rec]
    pickable: tuple[bool, ...] = field(init=False)  # [n_obj] (desk lamps are not)
    affords: tuple[frozenset[str], ...] = field(init=False)  # [n_obj] processes
    accepts: tuple[frozenset[int], ...] = field(init=False)  # [n_rec] objects it may hold
    targets: tuple[int, ...] = field(init=False)  # object indices of the target type
    goal_recs: frozenset[int] = field(init=False)  # receptacles of the goal type
    appliances: dict[str, tuple[int, ...]] = field(init=False)  # process -> receptacles
    lamps: tuple[int, ...] = field(init=False)  # object indices of desk lamps
    rec_index: dict[str, int] = field(init=False)
    obj_index: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "process", PROCESSES[self.task_type])
        put(self, "openable", tuple(t in OPENABLE for t in self.rec_types))
        put(self, "pickable", tuple(t != LAMP for t in self.obj_types))
        put(
            self,
            "affords",
            tuple(OBJECTS[t][1] if t in OBJECTS else frozenset() for t in self.obj_types),
        )
        fits = [frozenset(OBJECTS[t][0]) if t in OBJECTS else frozenset() for t in self.obj_types]
        put(
            self,
            "accepts",
            tuple(
                frozenset(o for o, f in enumerate(fits) if rtype in f) for rtype in self.rec_types
            ),
        )
        put(self, "targets", tuple(o for o, t in enumerate(self.obj_types) if t == self.target))
        put(self, "goal_recs", frozenset(r for r, t in enumerate(self.rec_types) if t == self.goal))
        put(
            self,
            "appliances",
            {
                p: tuple(r for r, t in enumerate(self.rec_types) if t == rtype)
                for p, rtype in APPLIANCE.items()
            },
        )
        put(self, "lamps", tuple(o for o, t in enumerate(self.obj_types) if t == LAMP))
        put(self, "rec_index", {name: r for r, name in enumerate(self.receptacles)})
        put(self, "obj_index", {name: o for o, name in enumerate(self.objects)})

    @property
    def task(self) -> str:
        return f"Your task is to: {self.sentence}"


def _goal_options(target: str, task_type: str, present: set[str]) -> list[str]:
    """Receptacle types in the room that may hold ``target`` and may be its goal."""
    if task_type == "look_at_obj_in_light":
        return []
    banned = {"sinkbasin", "bathtubbasin"}
    process = PROCESSES[task_type]
    if process is not None:
        banned.add(APPLIANCE[process])
    return [t for t in OBJECTS[target][0] if t in present and t not in banned]


def _target_options(kind: str, task_type: str, present: set[str]) -> list[str]:
    """Object types of room ``kind`` that can be this task's target in this room."""
    process = PROCESSES[task_type]
    look = task_type == "look_at_obj_in_light"
    out = []
    for obj in ROOM_OBJECTS[kind]:
        places, affords = OBJECTS[obj]
        if process is not None and process not in affords:
            continue
        if not any(t in present for t in places):
            continue
        if not look and not _goal_options(obj, task_type, present):
            continue
        out.append(obj)
    return out


def draw_world(
    seed: int,
    split: str,
    attempt: int,
    *,
    task_types: tuple[str, ...],
    n_receptacles: int | None = None,
    n_distractors: int | None = None,
) -> World | None:
    """One candidate task for (seed, split, attempt), or None if this draw cannot host it."""
    task_type = task_types[seed % len(task_types)]
    rng = random.Random(
        f"household/task/{split}/{seed}/{attempt}/{task_type}/{n_receptacles}/{n_distractors}"
    )
    kind = rng.choice(TASK_ROOMS[task_type])
    layout = rng.choice(split_layouts(kind, split, n_receptacles))
    recs = layout.receptacles
    present = {t for t, _ in recs}
    by_type: dict[str, list[int]] = {}
    for r, (t, _) in enumerate(recs):
        by_type.setdefault(t, []).append(r)

    look = task_type == "look_at_obj_in_light"
    holders = [r for r, (t, _) in enumerate(recs) if t in LAMP_HOLDERS]
    if look and not holders:
        return None
    process = PROCESSES[task_type]
    if process is not None and APPLIANCE[process] not in present:
        return None
    candidates = _target_options(kind, task_type, present)
    if not candidates:
        return None
    target = rng.choice(candidates)
    goal = None if look else rng.choice(_goal_options(target, task_type, present))
    starts = [r for t in OBJECTS[target][0] if t != goal for r in by_type.get(t, ())]
    if not starts:
        return None

    placed: list[tuple[str, int]] = []  # (object type, receptacle index) in creation order
    n_targets = rng.randint(2, 3) if task_type == "pick_two_obj_and_place" else rng.randint(1, 3)
    placed += [(target, rng.choice(starts)) for _ in range(n_targets)]
    pool = [
        o for o in ROOM_OBJECTS[kind] if o != target and any(t in present for t in OBJECTS[o][0])
    ]
    n_other = rng.randint(6, 14) if n_distractors is None else n_distractors
    for _ in range(n_other if pool else 0):
        obj = rng.choice(pool)
        placed.append((obj, rng.choice([r for t in OBJECTS[obj][0] for r in by_type.get(t, ())])))
    if kind in ("livingroom", "bedroom") and holders:
        placed.append((LAMP, rng.choice(holders)))

    numbered: list[tuple[str, int, int]] = []  # (type, instance number, receptacle)
    counter: dict[str, int] = {}
    for obj, r in placed:
        counter[obj] = counter.get(obj, 0) + 1
        numbered.append((obj, counter[obj], r))
    numbered.sort()
    sentence = rng.choice(TEMPLATES[task_type]).format(obj=target, recep=goal)
    return World(
        seed=seed,
        split=split,
        task_type=task_type,
        kind=kind,
        layout=layout.index,
        receptacles=tuple(f"{t} {k}" for t, k in recs),
        rec_types=tuple(t for t, _ in recs),
        objects=tuple(f"{t} {k}" for t, k, _ in numbered),
        obj_types=tuple(t for t, _, _ in numbered),
        start=tuple(r for _, _, r in numbered),
        target=target,
        goal=goal,
        sentence=sentence,
    )
