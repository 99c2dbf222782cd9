"""The household rules: play state, admissible commands, their effects and ALFWorld's texts.

Command grammar (ALFWorld 0.4 text engine; R a receptacle, O an object, both with their
instance number, e.g. "fridge 1", "mug 2"):

    go to R | open R | close R | take O from R | move O to R | heat O with R
    cool O with R | clean O with R | use R | examine X | inventory | look

(``use`` takes the desk lamp: "use desklamp 1", as in ALFWorld where lamps are objects.)
A command is applicable exactly when it is in the admissible list of the current state:

- ``go to R`` for every receptacle except the one the agent stands at;
- at a receptacle R: ``examine R``; ``open R`` / ``close R`` if R opens (cabinet, drawer,
  fridge, microwave, safe); when R is open or does not open: ``take O from R`` for each
  object in R (hands empty), ``move O to R`` for the held object if R may hold it (the
  catalog's canContain table), ``use desklamp N`` for a lamp in R;
- holding O at a microwave / fridge / sink basin: ``heat`` / ``cool`` / ``clean`` O with it
  if O can be heated / cooled / cleaned (the appliance need not be open, as in ALFWorld);
- ``examine O`` for the held object; ``inventory``; ``look``. (ALFWorld's ``help`` is left
  out: verl-agent removes it from the prompt anyway.)

Anything else (unknown, malformed, inapplicable) answers "Nothing happens." and changes
nothing. Effects: heating makes an object hot and no longer cool, cooling makes it cool and
no longer hot, cleaning makes it clean; lamps stay on once turned on. The agent carries at
most one object. Texts follow ALFWorld's ("You arrive at fridge 1. The fridge 1 is
closed.", "On the countertop 1, you see a mug 1, and a tomato 2.").
"""

from __future__ import annotations

from bisect import insort

from mcgpo.envs.alfworld_keys import NOTHING_HAPPENS, STATUS_WORD, status_text
from mcgpo.envs.household.world import World

__all__ = [
    "CLEAN",
    "COOL",
    "FLAG",
    "HOT",
    "NOTHING_HAPPENS",
    "STATUS",
    "State",
    "admissible",
    "execute",
    "intro_text",
    "is_won",
]

HOT, COOL, CLEAN = 1, 2, 4  # status bits of an object
FLAG = {"heat": HOT, "cool": COOL, "clean": CLEAN}  # process -> the status bit it sets
# status bits -> canonical text (alfworld_keys.status_text: "clean+hot", "" when none)
STATUS = tuple(status_text(STATUS_WORD[p] for p, bit in FLAG.items() if s & bit) for s in range(8))

# Operation codes: an admissible command maps to (code, a, b).
GO, OPEN, CLOSE, TAKE, MOVE, HEAT, COOL_OP, CLEAN_OP, USE, EXAMINE_R, EXAMINE_O, INV, LOOK = range(
    13
)
_PROCESS_OPS = ((HEAT, "heat"), (COOL_OP, "cool"), (CLEAN_OP, "clean"))
_EFFECT = {HEAT: (HOT, COOL), COOL_OP: (COOL, HOT), CLEAN_OP: (CLEAN, 0)}  # (set, clear)
_VERB = {HEAT: "heat", COOL_OP: "cool", CLEAN_OP: "clean"}


class State:
    """The mutable play state of one episode (indices refer to the World's tuples)."""

    __slots__ = (
        "contents",
        "go_ops",
        "held",
        "lamp_on",
        "loc",
        "opened",
        "seen",
        "status",
        "touched",
        "where",
        "won",
    )

    def __init__(self, world: World) -> None:
        self.loc = -1  # receptacle index; -1 = the middle of the room
        self.held = -1  # object index; -1 = hands empty
        self.where = list(world.start)  # [n_obj] receptacle of each object; -1 when held
        self.status = [0] * len(world.objects)  # [n_obj] HOT | COOL | CLEAN bits
        self.opened = [False] * len(world.receptacles)  # [n_rec]
        self.lamp_on = [False] * len(world.objects)  # [n_obj] (only lamps turn on)
        self.contents: list[list[int]] = [[] for _ in world.receptacles]  # sorted indices
        for o, r in enumerate(world.start):
            self.contents[r].append(o)
        self.seen: set[int] = set()  # objects the agent has been shown (found)
        self.touched: set[int] = set()  # objects the agent has moved or processed
        self.won = False
        self.go_ops = {f"go to {name}": (GO, r, -1) for r, name in enumerate(world.receptacles)}


def _listing(world: World, st: State, r: int) -> str:
    """ "a mug 1, a tomato 2, and a spoon 1" (ALFWorld's list style); marks them seen."""
    items = st.contents[r]
    if not items:
        return "nothing"
    st.seen.update(items)
    names = world.objects
    if len(items) == 1:
        return f"a {names[items[0]]}"
    return ", ".join(f"a {names[o]}" for o in items[:-1]) + f", and a {names[items[-1]]}"


def _describe(world: World, st: State, r: int) -> str:
    name = world.receptacles[r]
    if world.openable[r]:
        if not st.opened[r]:
            return f"The {name} is closed."
        return f"The {name} is open. In it, you see {_listing(world, st, r)}."
    return f"On the {name}, you see {_listing(world, st, r)}."


def intro_text(world: World) -> str:
    """The first observation: the receptacles in view, then the task."""
    recs = [f"a {name}" for name in world.receptacles]
    listed = recs[0] if len(recs) == 1 else ", ".join(recs[:-1]) + f", and {recs[-1]}"
    return (
        f"You are in the middle of a room. Looking quickly around you, you see {listed}."
        f"\n\n{world.task}"
    )


def admissible(world: World, st: State) -> dict[str, tuple[int, int, int]]:
    """Every applicable command of the current state, mapped to its operation."""
    ops = st.go_ops.copy()
    held, r = st.held, st.loc
    if r >= 0:
        name = world.receptacles[r]
        del ops[f"go to {name}"]
        ops[f"examine {name}"] = (EXAMINE_R, r, -1)
        accessible = True
        if world.openable[r]:
            accessible = st.opened[r]
            if accessible:
                ops[f"close {name}"] = (CLOSE, r, -1)
            else:
                ops[f"open {name}"] = (OPEN, r, -1)
        if accessible:
            for o in st.contents[r]:
                if o in world.lamps:
                    ops[f"use {world.objects[o]}"] = (USE, o, r)
                elif held < 0:
                    ops[f"take {world.objects[o]} from {name}"] = (TAKE, o, r)
            if held >= 0 and held in world.accepts[r]:
                ops[f"move {world.objects[held]} to {name}"] = (MOVE, held, r)
        if held >= 0:
            for op, process in _PROCESS_OPS:
                if process in world.affords[held] and r in world.appliances[process]:
                    ops[f"{process} {world.objects[held]} with {name}"] = (op, held, r)
    if held >= 0:
        ops[f"examine {world.objects[held]}"] = (EXAMINE_O, held, -1)
    ops["inventory"] = (INV, -1, -1)
    ops["look"] = (LOOK, -1, -1)
    return ops


def execute(world: World, st: State, op: tuple[int, int, int]) -> str:
    """Apply an admissible operation; return ALFWorld's feedback text and update ``won``."""
    code, a, b = op
    if code == GO:
        st.loc = a
        text = f"You arrive at {world.receptacles[a]}. {_describe(world, st, a)}"
    elif code == OPEN:
        st.opened[a] = True
        text = f"You open the {world.receptacles[a]}. {_describe(world, st, a)}"
    elif code == CLOSE:
        st.opened[a] = False
        text = f"You close the {world.receptacles[a]}."
    elif code == TAKE:
        st.contents[b].remove(a)
        st.where[a], st.held = -1, a
        st.touched.add(a)
        text = f"You pick up the {world.objects[a]} from the {world.receptacles[b]}."
    elif code == MOVE:
        insort(st.contents[b], a)
        st.where[a], st.held = b, -1
        st.touched.add(a)
        text = f"You move the {world.objects[a]} to the {world.receptacles[b]}."
    elif code in _EFFECT:
        bit_set, bit_clear = _EFFECT[code]
        st.status[a] = (st.status[a] | bit_set) & ~bit_clear
        st.touched.add(a)
        text = f"You {_VERB[code]} the {world.objects[a]} using the {world.receptacles[b]}."
    elif code == USE:
        st.lamp_on[a] = True
        text = f"You turn on the {world.objects[a]}."
    elif code == EXAMINE_R:
        text = _describe(world, st, a)
    elif code == EXAMINE_O:
        status = STATUS[st.status[a]].replace("+", " and ") or "normal"
        text = f"This is a {status} {world.objects[a]}."
    elif code == INV:
        text = (
            f"You are carrying: a {world.objects[st.held]}."
            if st.held >= 0
            else "You are not carrying anything."
        )
    elif st.loc < 0:  # LOOK in the middle of the room
        text = intro_text(world).split("\n\n", 1)[0]
    else:  # LOOK at a receptacle
        text = f"You are facing the {world.receptacles[st.loc]}. Next to it, you see nothing."
    st.won = is_won(world, st)
    return text


def qualifies(world: World, st: State, o: int) -> bool:
    """Whether object ``o`` is a target in the state the goal asks for (processed if needed)."""
    return world.process is None or bool(st.status[o] & FLAG[world.process])


def is_won(world: World, st: State) -> bool:
    """The goal condition of the task type (ALFWorld's PDDL goals, restated)."""
    if world.task_type == "look_at_obj_in_light":
        # holding a target while standing at a receptacle whose desk lamp is on
        return (
            st.held in world.targets
            and st.loc >= 0
            and any(st.lamp_on[o] for o in st.contents[st.loc] if o in world.lamps)
        )
    if world.task_type == "pick_two_obj_and_place":
        # two distinct targets in one receptacle of the goal type
        return any(sum(1 for o in world.targets if st.where[o] == r) >= 2 for r in world.goal_recs)
    return any(st.where[o] in world.goal_recs and qualifies(world, st, o) for o in world.targets)
