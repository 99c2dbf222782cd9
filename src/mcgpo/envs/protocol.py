"""The environment protocol: what every environment gives the rollout layer.

Environments know nothing of models. ``reset`` returns an :class:`Observation`; ``step``
takes the action text (already parsed out of the model's response) and returns a
:class:`StepResult`. Both carry the MCGPO :class:`Context` of the state the agent is now in,
whose fields become the StepTable columns of the next decision row.

Rewards are defined in each environment's own module and documented there; nothing
rescales them elsewhere.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["SPLITS", "Context", "Env", "Observation", "StepResult", "closest", "unknown_option"]

SPLITS = ("train", "valid_seen", "valid_unseen")


@dataclass(frozen=True)
class Context:
    """The state keys of one decision point, as canonical strings (StepTable fields).

    anchor        exact observation key (GiGPO / HGPO anchor state, GraphGPO node)
    state         h(s): state summary including identity fields (instance numbers, ids)
    state_coarse  h(s) with the identity fields dropped
    progress      C: rubric progress, the rubric items that hold now (canonical string)
    enabled       F: rubric criteria the rules let the agent advance now (canonical string)
    progress_value  C as a number in [0, 1] (fraction of rubric items that hold)
    """

    anchor: str = ""
    state: str = ""
    state_coarse: str = ""
    progress: str = ""
    enabled: str = ""
    progress_value: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Observation:
    """What the agent sees before a decision."""

    text: str  # the observation text shown to the agent
    task: str  # the task instruction, e.g. "Your task is to: put a hot tomato in countertop."
    admissible_actions: tuple[str, ...]  # the commands the environment accepts now
    context: Context = field(default_factory=Context)
    task_type: str = ""  # task family (ALFWorld task type, WebShop category, ...)


@dataclass(frozen=True)
class StepResult:
    """The outcome of one ``step``.

    ``info`` holds at least ``won`` (bool), ``score`` (float, graded score of the episode
    so far; WebShop's task score at Buy Now) and ``action_valid`` (bool: the command was
    understood by the environment).
    """

    observation: Observation
    reward: float
    done: bool
    info: dict[str, Any]


@runtime_checkable
class Env(Protocol):
    """A text environment. One instance plays one episode at a time."""

    max_turns: int

    def reset(self, seed: int = 0, split: str = "train") -> Observation:
        """Start the task determined by (seed, split); the same pair gives the same task."""
        ...

    def step(self, action: str) -> StepResult:
        """Apply an action text. Never raises on bad text: it is marked invalid instead."""
        ...

    def expert_action(self) -> str:
        """The expert's next action from the current state."""
        ...


def closest(word: str, known: Collection[str]) -> str:
    """``" (did you mean 'x'?)"`` naming the closest of ``known`` to ``word`` (difflib's ratio
    >= 0.6, as :func:`mcgpo.options.did_you_mean`, which this layer may not import), or ``""``."""
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_option(env: str, unknown: Collection[str], takes: Callable[..., Any]) -> str:
    """The one line an environment's constructor raises for options it does not take: the
    first unknown one (sorted), the closest of the named parameters of ``takes`` (its class or
    factory: the signature is the one list of its options), then all of them, e.g. ``unknown
    household option 'max_turn' (did you mean 'max_turns'?); known: max_turns, ...``."""
    known = [
        p.name
        for p in inspect.signature(takes).parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
    ]
    word = sorted(unknown)[0]
    return f"unknown {env} option {word!r}{closest(word, known)}; known: {', '.join(known)}"
