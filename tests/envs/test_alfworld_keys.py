"""The ALFWorld-like envs' shared keys (envs/alfworld_keys.py): golden values, then agreement.

Household and ALFWorld compute their anchor and h(s) through the same functions: the same
state, described once as the household engine's State and once as ALFWorld's PDDL facts,
gives the same keys along random walks (hypothesis); replacing the shared coarse rule changes
both envs' coarse keys; TWX's anchor is the same format.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcgpo.envs import alfworld_keys as keys
from mcgpo.envs.alfworld import context as alf
from mcgpo.envs.alfworld import official, problem
from mcgpo.envs.household import HouseholdEnv, catalog
from mcgpo.envs.household import context as household
from mcgpo.envs.household.engine import CLEAN, COOL, HOT
from mcgpo.envs.household.world import World
from mcgpo.envs.textworld_express import context_of


def test_status_and_names_golden():
    # sorted, "+"-joined: {hot, clean} -> "clean" < "hot"
    assert keys.status_text(["hot", "clean"]) == "clean+hot"
    assert keys.status_text([]) == ""
    assert keys.with_status("mug 1", "clean+hot") == "mug 1(clean+hot)"
    assert keys.with_status("mug 1", "") == "mug 1"
    assert keys.moved_entry("mug 1", "hot", "cabinet 1", "countertop 2") == (
        "mug 1(hot):cabinet 1>countertop 2"
    )


def test_coarse_rule_golden():
    # " 1", " 12" go (digits glued to a word stay), then the list is re-sorted, duplicates kept
    assert keys.coarse("fridge 1,cabinet 12,cabinet 2") == "cabinet,cabinet,fridge"
    assert keys.coarse("mug 1(hot):cabinet 1>countertop 2") == "mug(hot):cabinet>countertop"
    assert keys.coarse("") == ""
    assert keys.coarse("desklamp1") == "desklamp1"


NAMES = st.lists(
    st.tuples(st.sampled_from(["cabinet", "mug", "fridge"]), st.integers(1, 30)), max_size=6
)


@given(NAMES, st.randoms())
def test_coarse_ignores_numbering_and_order(names, rng):
    value = ",".join(f"{kind} {number}" for kind, number in names)
    renumbered = [f"{kind} {rng.randint(1, 99)}" for kind, _ in names]
    rng.shuffle(renumbered)
    assert keys.coarse(value) == keys.coarse(",".join(renumbered))
    assert keys.coarse(keys.coarse(value)) == keys.coarse(value)  # idempotent


def test_state_keys_golden():
    exact, coarse = keys.state_keys(
        "", "", ["drawer 2", "cabinet 1"], [], ["tomato 1(cool):fridge 1>countertop 1"]
    )
    # "" location -> middle, "" held -> nothing; lists sorted; fields in loc;hold;open;on;moved
    assert exact == (
        "loc=middle;hold=nothing;open=cabinet 1,drawer 2;on=;moved=tomato 1(cool):fridge 1>countertop 1"
    )
    assert (
        coarse
        == "loc=middle;hold=nothing;open=cabinet,drawer;on=;moved=tomato(cool):fridge>countertop"
    )


def test_anchor_golden():
    assert keys.anchor("You see.", "", "", ["go to a 1", "look"]) == (
        "You see.\nLocation: middle of a room. Held: nothing.\nActions: go to a 1 | look"
    )
    assert keys.anchor("Hi.", "fridge 1", "tomato 1(hot)", []) == (
        "Hi.\nLocation: fridge 1. Held: tomato 1(hot).\nActions: "
    )


def test_step_info_golden():
    assert keys.step_info(won=True, action_valid=True, turn=3, truncated=False) == {
        "won": True,
        "score": 1.0,
        "action_valid": True,
        "turn": 3,
        "truncated": False,
    }
    info = keys.step_info(won=False, action_valid=False, turn=9, truncated=True, score=0.5, x=1)
    assert info["score"] == 0.5 and info["x"] == 1 and info["truncated"]


def test_task_types_and_rubrics_are_the_shared_ones():
    assert catalog.TASK_TYPES is keys.TASK_TYPES
    assert official.TASK_TYPES is keys.TASK_TYPES and problem.TASK_TYPES is keys.TASK_TYPES
    assert alf.RUBRICS is keys.RUBRICS
    # household = the goal's items plus its own found items
    for task_type, items in keys.RUBRICS.items():
        assert set(household.RUBRICS[task_type]) - set(items) <= {"found", "found_1", "found_2"}
        assert set(items) <= set(household.RUBRICS[task_type])
    assert set(keys.RUBRICS["pick_heat_then_place_in_recep"]) == {"heated", "held", "placed"}


# A kitchen with a lamp: receptacles and objects sorted, as World requires.
RECS = (
    "cabinet 1", "cabinet 2", "countertop 1", "countertop 2", "fridge 1", "microwave 1",
    "sidetable 1", "sinkbasin 1",
)  # fmt: skip
OBJS = ("apple 1", "desklamp 1", "mug 1", "mug 2", "tomato 1")
START = (
    2,
    6,
    0,
    1,
    4,
)  # apple @countertop 1, desklamp @sidetable 1, mugs @cabinets, tomato @fridge


def kitchen() -> World:
    return World(
        seed=0,
        split="train",
        task_type="pick_heat_then_place_in_recep",
        kind="kitchen",
        layout=0,
        receptacles=RECS,
        rec_types=tuple(name.split()[0] for name in RECS),
        objects=OBJS,
        obj_types=tuple(name.split()[0] for name in OBJS),
        start=START,
        target="mug",
        goal="countertop",
        sentence="put a hot mug in countertop.",
    )


def facts_of(world: World, state) -> alf.Facts:
    """The household state as ALFWorld's PDDL facts (receptacle r stands at "loc r")."""
    facts = [("atlocation", ("agent1", f"loc {state.loc}"))]
    for r, name in enumerate(world.receptacles):
        facts.append(("receptacletype", (name, f"{world.rec_types[r]}type")))
        facts.append(("receptacleatlocation", (name, f"loc {r}")))
        if state.opened[r]:
            facts.append(("opened", (name,)))
    for o, name in enumerate(world.objects):
        facts.append(("objecttype", (name, f"{world.obj_types[o]}type")))
        if state.where[o] >= 0:
            facts.append(("inreceptacle", (name, world.receptacles[state.where[o]])))
        if state.lamp_on[o]:
            facts.append(("istoggled", (name,)))
        for bit, predicate in ((HOT, "ishot"), (COOL, "iscool"), (CLEAN, "isclean")):
            if state.status[o] & bit:
                facts.append((predicate, (name,)))
    if state.held >= 0:
        facts.append(("holds", ("agent1", world.objects[state.held])))
    return tuple(facts)


def start_facts(world: World) -> alf.Facts:
    return tuple(("inreceptacle", (name, world.receptacles[r])) for name, r in zip(OBJS, START))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 10**6), max_size=30))
def test_household_and_alfworld_give_the_same_keys_for_the_same_state(choices):
    env = HouseholdEnv()
    world = kitchen()
    obs = env.load(world)
    start = alf.start_of(start_facts(world))
    for choice in [None, *choices]:
        if choice is not None:
            obs = env.step(obs.admissible_actions[choice % len(obs.admissible_actions)]).observation
        facts = facts_of(world, env.state)
        assert (obs.context.state, obs.context.state_coarse) == alf.state_keys(facts, start)
        assert obs.context.anchor == alf.anchor(obs.text, facts, obs.admissible_actions)


def test_a_played_state_golden_in_both_envs():
    env = HouseholdEnv()
    world = kitchen()
    env.load(world)
    for command in ("go to cabinet 1", "open cabinet 1", "take mug 1 from cabinet 1"):
        env.step(command)
    env.step("go to microwave 1")
    obs = env.step("heat mug 1 with microwave 1").observation
    # at microwave 1, holding the heated mug 1, cabinet 1 left open; nothing else moved
    want = "loc=microwave 1;hold=mug 1(hot);open=cabinet 1;on=;moved="
    assert obs.context.state == want
    facts = facts_of(world, env.state)
    assert alf.state_keys(facts, alf.start_of(start_facts(world)))[0] == want
    assert obs.context.anchor.splitlines()[1] == "Location: microwave 1. Held: mug 1(hot)."


def test_the_coarse_rule_is_one_function_for_both_envs(monkeypatch):
    env = HouseholdEnv()
    world = kitchen()
    env.load(world)
    monkeypatch.setattr(keys, "coarse", lambda value: "X")
    obs = env.step("go to cabinet 1").observation  # a valid command recomputes the keys
    want = "loc=X;hold=X;open=X;on=X;moved=X"
    assert obs.context.state_coarse == want
    start = alf.start_of(start_facts(world))
    assert alf.state_keys(facts_of(world, env.state), start)[1] == want


@pytest.mark.parametrize(
    ("infos", "location", "held"),
    [
        ({"look": "You are in the kitchen. ", "inventory": "Inventory:\n  a red apple\n"},
         "kitchen", "red apple"),
        ({}, "unknown", ""),
    ],
)  # fmt: skip
def test_textworld_express_anchor_is_the_shared_format(infos, location, held):
    actions = ("look around", "take apple")
    got = context_of("Hello.", infos, actions).anchor
    assert got == keys.anchor("Hello.", location, held, actions)
