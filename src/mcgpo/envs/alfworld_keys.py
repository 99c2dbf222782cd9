"""What the ALFWorld-like environments share: task types, rubric items, words and key formats.

The household env (``envs/household``) and the real ALFWorld engine (``envs/alfworld``) claim
the same context formats, and TextWorld-Express the same anchor and step info, so MCGPO and
GiGPO group their states alike. Those strings are written once, here; each environment only
says where its values come from (an engine's indices, PDDL facts, TWX's texts).

anchor  the exact observation key (GiGPO / GraphGPO anchor state, as in GraphGPO's ALFWorld
        wrapper): the observation text, the location, the held object with its status, and
        the sorted admissible commands::

            <observation text>
            Location: fridge 1. Held: tomato 1(hot).
            Actions: close fridge 1 | cool tomato 1 with fridge 1 | ...

        with "middle of a room" for no location and "nothing" for empty hands.
state   h(s), the fields ``loc;hold;open;on;moved`` in this order, each list sorted and
        ","-joined: ``loc=<location or middle>;hold=<object(status) or nothing>;
        open=<receptacles>;on=<lamps>;moved=<object(status):from>to, ...>``.
state_coarse  the same with identity fields dropped: instance numbers (" 1", " 12") go,
        then every list is re-sorted (duplicates kept): ``fridge 1,cabinet 2`` ->
        ``cabinet,fridge``.
status  the sorted subset of the status words (clean, cool, hot, sliced) joined by "+"
        ("" for none); written after a name in parentheses: ``tomato 1(clean+hot)``.
info    the step info: ``won``, ``score`` (1.0 once won, else 0.0, unless the env grades
        the episode itself), ``action_valid``, ``turn``, ``truncated`` (the turn limit ended
        the episode), then the env's own extras.

``TASK_TYPES`` are ALFWorld's six, in ALFWorld's order (``alfred_tw_env.TASK_TYPES``);
``RUBRICS`` the rubric items of each that both envs compute from the goal (the household env
adds its ``found`` items).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

__all__ = [
    "NOTHING",
    "NOTHING_HAPPENS",
    "NOWHERE",
    "NOWHERE_TEXT",
    "PROCESSED",
    "PROCESS_OF",
    "RUBRICS",
    "STATUS_WORD",
    "TASK_TYPES",
    "anchor",
    "coarse",
    "moved_entry",
    "state_keys",
    "status_text",
    "step_info",
    "with_status",
]

TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# task type -> the process its target needs (the command verb); the other types need none
PROCESS_OF: dict[str, str] = {
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
}
PROCESSED: dict[str, str] = {"clean": "cleaned", "heat": "heated", "cool": "cooled"}  # rubric item
STATUS_WORD: dict[str, str] = {"clean": "clean", "heat": "hot", "cool": "cool"}  # after it
# The goal's rubric items per task type, sorted (held: a target in hand, or the goal met).
RUBRICS: dict[str, tuple[str, ...]] = {
    "pick_and_place_simple": ("held", "placed"),
    "look_at_obj_in_light": ("held", "lamp_on", "looked"),
    **{t: tuple(sorted(("held", PROCESSED[p], "placed"))) for t, p in PROCESS_OF.items()},
    "pick_two_obj_and_place": ("held", "placed_1", "placed_2"),
}

NOTHING_HAPPENS = "Nothing happens."  # ALFWorld's answer to a command it does not apply
NOWHERE = "middle"  # h(s) location before the agent has gone anywhere
NOWHERE_TEXT = "middle of a room"  # the anchor's location then
NOTHING = "nothing"  # empty hands
_NUMBER = re.compile(r" \d+")


def status_text(words: Iterable[str]) -> str:
    """Status words in canonical form: sorted, "+"-joined ("" for none)."""
    return "+".join(sorted(words))


def with_status(name: str, status: str) -> str:
    """``tomato 1(hot)``; the bare name when the status is ""."""
    return f"{name}({status})" if status else name


def moved_entry(name: str, status: str, start: str, now: str) -> str:
    """One ``moved`` item of h(s): ``tomato 1(hot):fridge 1>countertop 1``."""
    return f"{with_status(name, status)}:{start}>{now}"


def coarse(value: str) -> str:
    """A field's identity-free form: instance numbers dropped, the list re-sorted."""
    return ",".join(sorted(_NUMBER.sub("", value).split(",")))


def state_keys(
    location: str,
    held: str,
    opened: Iterable[str],
    lit: Iterable[str],
    moved: Iterable[str],
) -> tuple[str, str]:
    """(h(s), coarse h(s)); ``location`` "" is the middle, ``held`` "" empty hands."""
    fields = (
        ("loc", location or NOWHERE),
        ("hold", held or NOTHING),
        ("open", ",".join(sorted(opened))),
        ("on", ",".join(sorted(lit))),
        ("moved", ",".join(sorted(moved))),
    )
    exact = ";".join(f"{key}={value}" for key, value in fields)
    return exact, ";".join(f"{key}={coarse(value)}" for key, value in fields)


def anchor(text: str, location: str, held: str, actions: Iterable[str]) -> str:
    """The exact observation key; ``actions`` are the sorted admissible commands."""
    where, hands = location or NOWHERE_TEXT, held or NOTHING
    return f"{text}\nLocation: {where}. Held: {hands}.\nActions: {' | '.join(actions)}"


def step_info(
    *,
    won: bool,
    action_valid: bool,
    turn: int,
    truncated: bool,
    score: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The ``StepResult.info`` dict; ``score`` defaults to 1.0 once won, else 0.0."""
    return {
        "won": won,
        "score": (1.0 if won else 0.0) if score is None else score,
        "action_valid": action_valid,
        "turn": turn,
        "truncated": truncated,
        **extra,
    }
