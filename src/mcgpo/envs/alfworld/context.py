"""MCGPO context keys of an ALFWorld state, computed from the game's PDDL facts.

Pure functions of (facts, task, start, admissible commands, text): no engine, no randomness,
canonical strings (fixed field order, sorted lists), so equal states give equal keys
whichever path led to them. The formats, the coarse rule, the status text and the rubric
items are ``envs/alfworld_keys.py``'s, shared with the household env (docs/envs/household.md),
so the two ALFWorld-like envs cannot drift apart.

Facts are ``(predicate, (arg, ...))`` tuples with TextWorld's lower-case names and ALFWorld's
demangled instance names: ``("holds", ("agent1", "tomato 1"))``,
``("objecttype", ("tomato 1", "tomatotype"))``, ``("ishot", ("tomato 1",))``.

state   h(s), what the agent has changed (everything else is the game's start)::

            loc=<receptacles at the agent's location, "/"-joined, or middle>;
            hold=<object(status) or nothing>;open=<receptacles>;on=<lamps>;
            moved=<object(status):from>to, ...>

        status = the sorted subset of clean/cool/hot/sliced joined by "+"; ``on`` lists lamps
        with ``istoggled`` (the predicate the goal and the text use); ``moved`` lists every
        object not in hand whose receptacle or status differs from the start.
state_coarse  the same with identity fields dropped ("cabinet 3" -> "cabinet"), lists
        re-sorted (duplicates kept).
progress  C, the rubric items (the task's goal predicates) that hold now, sorted, ","-joined:

            pick_and_place_simple   held, placed
            look_at_obj_in_light    held, lamp_on, looked
            pick_{clean,heat,cool}  held, cleaned|heated|cooled, placed
            pick_two_obj_and_place  held, placed_1, placed_2

        held: the agent holds a target, or the goal is met (a won state has every item);
        cleaned/heated/cooled: some target has isClean/isHot/isCool; placed: a target
        (processed if asked) is in a receptacle of the goal type; placed_k: one goal-type
        receptacle holds k targets; lamp_on: a lamp of the task's type is toggled; looked:
        the goal holds (target in hand at the lit lamp's location).
enabled  F, the criteria one admissible command advances now (the PDDL preconditions hold):
        take (a target not yet counted as placed can be taken), heat|cool|clean (the held
        target is unprocessed and the appliance command is admissible), place (the held
        target qualifies and a goal-type receptacle accepts it now), light (a lamp of the
        task's type that is off can be used).
anchor  the observation text, then the location and held object, then the sorted
        admissible commands (``alfworld_keys.anchor``, the household env's anchor).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mcgpo.envs import alfworld_keys as keys
from mcgpo.envs.alfworld_keys import RUBRICS

__all__ = [
    "RUBRICS",
    "Facts",
    "TaskSpec",
    "anchor",
    "enabled",
    "progress",
    "start_of",
    "state_keys",
]

Facts = tuple[tuple[str, tuple[str, ...]], ...]

PROCESS = {  # task type -> (status predicate, rubric item, command verb)
    t: (f"is{keys.STATUS_WORD[verb]}", keys.PROCESSED[verb], verb)
    for t, verb in keys.PROCESS_OF.items()
}
# PDDL status predicate -> status word (ALFWorld's isClean/isCool/isHot, and isSliced)
STATUS_PREDICATES = tuple(
    (f"is{word}", word) for word in sorted((*keys.STATUS_WORD.values(), "sliced"))
)


@dataclass(frozen=True)
class TaskSpec:
    """What the goal asks, as lower-case type names ("tomato", "countertop", "desklamp")."""

    task_type: str
    target: str
    recep: str = ""  # goal receptacle type ("" for look_at)
    lamp: str = ""  # toggle target type (look_at only)


@dataclass(frozen=True)
class _View:
    """An indexed view of one fact set."""

    types: dict[str, str]  # instance -> type name without the "type" suffix
    where: dict[str, str]  # object -> receptacle it is in
    status: dict[str, str]  # object -> "clean+hot" style status ("" for none)
    held: str  # held object ("" for none)
    here: tuple[str, ...]  # receptacles at the agent's location
    opened: tuple[str, ...]
    toggled: frozenset[str]


def _view(facts: Facts) -> _View:
    types, where, flags, toggled, opened = {}, {}, {}, set(), []
    held, agent_loc, recep_loc = "", "", {}
    for name, args in facts:
        if name in ("objecttype", "receptacletype"):
            types[args[0]] = args[1].removesuffix("type")
        elif name == "inreceptacle":
            where[args[0]] = args[1]
        elif name == "holds":
            held = args[1]
        elif name == "atlocation":
            agent_loc = args[1]
        elif name == "receptacleatlocation":
            recep_loc[args[0]] = args[1]
        elif name == "opened":
            opened.append(args[0])
        elif name == "istoggled":
            toggled.add(args[0])
        else:
            for predicate, label in STATUS_PREDICATES:
                if name == predicate:
                    flags.setdefault(args[0], []).append(label)
    status = {o: keys.status_text(labels) for o, labels in flags.items()}
    here = tuple(sorted(r for r, loc in recep_loc.items() if loc == agent_loc))
    return _View(types, where, status, held, here, tuple(sorted(opened)), frozenset(toggled))


def start_of(facts: Facts) -> dict[str, tuple[str, str]]:
    """Where every object starts and its start status: object -> (receptacle, status)."""
    v = _view(facts)
    return {o: (r, v.status.get(o, "")) for o, r in v.where.items()}


def _held(v: _View) -> str:
    """The held object with its status ("" for empty hands)."""
    return keys.with_status(v.held, v.status.get(v.held, "")) if v.held else ""


def state_keys(facts: Facts, start: Mapping[str, tuple[str, str]]) -> tuple[str, str]:
    """(h(s), coarse h(s)); see the module docstring for the format."""
    v = _view(facts)
    moved = [
        keys.moved_entry(o, v.status.get(o, ""), start.get(o, ("?", ""))[0], r)
        for o, r in v.where.items()
        if (r, v.status.get(o, "")) != start.get(o, (r, ""))
    ]
    return keys.state_keys("/".join(v.here), _held(v), v.opened, v.toggled, moved)


def _targets(v: _View, task: TaskSpec) -> list[str]:
    return sorted(o for o, t in v.types.items() if t == task.target)


def _qualifies(v: _View, task: TaskSpec, o: str) -> bool:
    """The object carries the status the task asks for (always true without a process)."""
    process = PROCESS.get(task.task_type)
    return process is None or process[0].removeprefix("is") in v.status.get(o, "").split("+")


def _in_goal(v: _View, task: TaskSpec, o: str) -> bool:
    return o in v.where and v.types.get(v.where[o]) == task.recep


def _items(v: _View, task: TaskSpec, won: bool) -> set[str]:
    targets = _targets(v, task)
    holding = v.held in targets
    tt = task.task_type
    if tt == "pick_two_obj_and_place":
        counts: dict[str, int] = {}
        for o in targets:
            if _in_goal(v, task, o):
                counts[v.where[o]] = counts.get(v.where[o], 0) + 1
        most = max(counts.values(), default=0)
        flags = {"held": holding or most >= 2, "placed_1": most >= 1, "placed_2": most >= 2}
    elif tt == "look_at_obj_in_light":
        lamp_on = any(v.types.get(o) == task.lamp for o in v.toggled)
        flags = {"held": holding or won, "lamp_on": lamp_on, "looked": won}
    else:
        placed = any(_in_goal(v, task, o) and _qualifies(v, task, o) for o in targets)
        flags = {"held": holding or placed, "placed": placed}
        if tt in PROCESS:
            predicate, item, _ = PROCESS[tt]
            label = predicate.removeprefix("is")
            flags[item] = any(label in v.status.get(o, "").split("+") for o in targets)
    return {name for name, holds in flags.items() if holds}


def progress(facts: Facts, task: TaskSpec, won: bool) -> tuple[str, float]:
    """(C as a canonical string, the fraction of rubric items that hold)."""
    if task.task_type not in RUBRICS:
        raise ValueError(f"unknown ALFWorld task type {task.task_type!r}")
    items = _items(_view(facts), task, won)
    return ",".join(sorted(items)), len(items) / len(RUBRICS[task.task_type])


_COMMAND = re.compile(r"^(take|move|heat|cool|clean|use) (.+?)(?: (?:from|to|with) (.+))?$")


def enabled(facts: Facts, task: TaskSpec, commands: Iterable[str]) -> str:
    """F: the rubric criteria one admissible command advances now (canonical string)."""
    v = _view(facts)
    targets = set(_targets(v, task))
    process = PROCESS.get(task.task_type)
    out = set()
    for command in commands:
        m = _COMMAND.match(command)
        if m is None:
            continue
        verb, obj, place = m.group(1), m.group(2), m.group(3) or ""
        if verb == "take" and obj in targets and not _counted(v, task, obj):
            out.add("take")
        elif verb == "use" and task.lamp and v.types.get(obj) == task.lamp and obj not in v.toggled:
            out.add("light")
        elif obj != v.held or obj not in targets:
            continue
        elif process is not None and verb == process[2] and not _qualifies(v, task, obj):
            out.add(verb)
        elif verb == "move" and v.types.get(place) == task.recep and _qualifies(v, task, obj):
            out.add("place")
    return ",".join(sorted(out))


def _counted(v: _View, task: TaskSpec, o: str) -> bool:
    """Whether target ``o`` where it lies already counts as placed."""
    if not _in_goal(v, task, o):
        return False
    return task.task_type == "pick_two_obj_and_place" or _qualifies(v, task, o)


def anchor(text: str, facts: Facts, actions: Iterable[str]) -> str:
    """The exact observation key; ``actions`` are the sorted admissible commands."""
    v = _view(facts)
    return keys.anchor(text, "/".join(v.here), _held(v), actions)
