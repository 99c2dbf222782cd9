"""MCGPO context keys of a household state: anchor, h(s), coarse h(s), C and F.

All keys are canonical strings (fixed field order, sorted lists, no randomness), so equal
states give equal keys whichever path led to them. The anchor and h(s) formats, the coarse
rule and the goal's rubric items are ``envs/alfworld_keys.py``'s, shared with the ALFWorld
env; this module says where the values come from (the engine's State).

anchor  the exact observation key (GiGPO / GraphGPO anchor state, as in GraphGPO's ALFWorld
        wrapper): the observation text, location, held object with its status, and the
        sorted admissible commands::

            <observation text>
            Location: fridge 1. Held: tomato 1(hot).
            Actions: close fridge 1 | cool tomato 1 with fridge 1 | ...

state   h(s), the world state the agent has made (everything else is the task's start)::

            loc=<receptacle or middle>;hold=<object(status) or nothing>;open=<receptacles>;
            on=<lamps>;moved=<object(status):from>to, ...>

        ``moved`` lists, sorted, every object not in hand whose place or status differs
        from the start (``from`` = where it started, ``to`` = where it is now), e.g.
        ``loc=countertop 1;hold=nothing;open=fridge 1;on=;moved=tomato 1(hot):fridge 1>countertop 1``.
        It is the net effect of the agent's moves, so two paths to the same world give the
        same h(s).
state_coarse  the same with identity fields dropped: instance numbers go ("fridge 1" ->
        "fridge"), then every list is re-sorted (duplicates kept).
progress  C, the rubric items that hold now, sorted and joined with "," ("" for none):

            pick_and_place_simple   found, held, placed
            look_at_obj_in_light    found, held, lamp_on, looked
            pick_{clean,heat,cool}  found, held, cleaned|heated|cooled, placed
            pick_two_obj_and_place  found_1, found_2, held, placed_1, placed_2

        found: a target has been shown to the agent (latched); found_2: two distinct ones;
        held: the agent holds a target, or the goal is already met (so a won state has every
        item); heated / cooled / cleaned: some target is processed now; placed: a target,
        processed if the task asks, is in a receptacle of the goal type; placed_k: one goal
        receptacle holds k targets; lamp_on: a desk lamp is on; looked: the goal (holding a
        target at a lit lamp). ``progress_value`` = items holding / items in the rubric.
enabled  F, the criteria one admissible command can advance now, sorted, "," joined:

            find   a found item is still false (going somewhere or opening may show a target)
            take   hands empty and a target not already counted as placed can be taken here
            heat | cool | clean   holding an unprocessed target at the right appliance
            place  holding a target (processed if asked) at an open goal receptacle
            light  at a desk lamp that is off (look tasks)
"""

from __future__ import annotations

from mcgpo.envs import alfworld_keys as keys
from mcgpo.envs.household.engine import FLAG, STATUS, State, qualifies
from mcgpo.envs.household.world import World

__all__ = ["RUBRICS", "anchor", "enabled", "progress", "state_keys"]

# the goal's items (alfworld_keys.RUBRICS) after the household env's found items
_FOUND = {"pick_two_obj_and_place": ("found_1", "found_2")}
RUBRICS: dict[str, tuple[str, ...]] = {
    t: _FOUND.get(t, ("found",)) + items for t, items in keys.RUBRICS.items()
}


def _held(world: World, st: State) -> str:
    """The held object with its status ("" for empty hands)."""
    if st.held < 0:
        return ""
    return keys.with_status(world.objects[st.held], STATUS[st.status[st.held]])


def state_keys(world: World, st: State) -> tuple[str, str]:
    """(h(s), coarse h(s)); see the module docstring for the format."""
    recs, objs = world.receptacles, world.objects
    moved = [
        keys.moved_entry(objs[o], STATUS[st.status[o]], recs[world.start[o]], recs[st.where[o]])
        for o in st.touched
        if st.where[o] >= 0 and (st.where[o] != world.start[o] or st.status[o])
    ]
    return keys.state_keys(
        recs[st.loc] if st.loc >= 0 else "",
        _held(world, st),
        (recs[r] for r, is_open in enumerate(st.opened) if is_open),
        (objs[o] for o in world.lamps if st.lamp_on[o]),
        moved,
    )


def _placed_counts(world: World, st: State) -> int:
    """The most targets held by one goal receptacle (pick two)."""
    return max(
        (sum(1 for o in world.targets if st.where[o] == r) for r in world.goal_recs), default=0
    )


def _items(world: World, st: State) -> set[str]:
    targets = world.targets
    n_seen = sum(1 for o in targets if o in st.seen)
    holding = st.held in targets
    tt = world.task_type
    if tt == "pick_two_obj_and_place":
        most = _placed_counts(world, st)
        flags = {
            "found_1": n_seen >= 1,
            "found_2": n_seen >= 2,
            "held": holding or most >= 2,
            "placed_1": most >= 1,
            "placed_2": most >= 2,
        }
    elif tt == "look_at_obj_in_light":
        flags = {
            "found": n_seen >= 1,
            "held": holding,
            "lamp_on": any(st.lamp_on[o] for o in world.lamps),
            "looked": st.won,
        }
    else:
        placed = any(st.where[o] in world.goal_recs and qualifies(world, st, o) for o in targets)
        flags = {"found": n_seen >= 1, "held": holding or placed, "placed": placed}
        if world.process is not None:
            bit = FLAG[world.process]
            flags[keys.PROCESSED[world.process]] = any(st.status[o] & bit for o in targets)
    return {name for name, holds in flags.items() if holds}


def progress(world: World, st: State) -> tuple[str, float]:
    """(C as a canonical string, the fraction of rubric items that hold)."""
    items = _items(world, st)
    return ",".join(sorted(items)), len(items) / len(RUBRICS[world.task_type])


def enabled(world: World, st: State, items: str | None = None) -> str:
    """F: the rubric criteria one admissible command can advance now (canonical string)."""
    reached = set((items if items is not None else progress(world, st)[0]).split(","))
    out = []
    if not ({"found", "found_2"} & reached):
        out.append("find")
    r, held, tt = st.loc, st.held, world.task_type
    if r < 0:
        return ",".join(out)
    accessible = not world.openable[r] or st.opened[r]
    if tt == "look_at_obj_in_light":
        if accessible and any(not st.lamp_on[o] for o in st.contents[r] if o in world.lamps):
            out.append("light")
        if held < 0 and accessible and any(o in world.targets for o in st.contents[r]):
            out.append("take")
        return ",".join(sorted(out))
    if held < 0 and accessible:
        for o in st.contents[r]:
            if o in world.targets and not _counted(world, st, o, r):
                out.append("take")
                break
    if held >= 0 and held in world.targets:
        process = world.process
        if process is not None and not qualifies(world, st, held):
            if r in world.appliances[process]:
                out.append(process)
        elif accessible and r in world.goal_recs:
            out.append("place")
    return ",".join(sorted(out))


def _counted(world: World, st: State, o: int, r: int) -> bool:
    """Whether target ``o`` lying in ``r`` already counts as placed."""
    if r not in world.goal_recs:
        return False
    if world.task_type == "pick_two_obj_and_place":
        return True
    return qualifies(world, st, o)


def anchor(text: str, world: World, st: State, actions: tuple[str, ...]) -> str:
    """The exact observation key; ``actions`` must be the sorted admissible commands."""
    location = world.receptacles[st.loc] if st.loc >= 0 else ""
    return keys.anchor(text, location, _held(world, st), actions)
