"""The run commands ``mcgpo sft | train | eval``: which config fields and sections each takes.

One table read by the CLI (its flags and ``--help``) and by ``mcgpo bench`` (which ``--set``
keys the warm start, an ``mcgpo sft`` run, also gets). It lives in the training layer so that
both can read it without importing each other.
"""

from __future__ import annotations

from typing import NamedTuple

from mcgpo.training.config import RunConfig
from mcgpo.training.config_layout import scalar_fields

__all__ = ["COMMANDS", "RunCommand"]


class RunCommand(NamedTuple):
    """What one run command takes from :class:`~mcgpo.training.config.RunConfig`."""

    tops: tuple[str, ...]  # top-level fields, e.g. ("model", "out", ...) -> --model, --out
    sections: tuple[str, ...]  # sections, e.g. ("env", "rollout") -> --env.*, --rollout.*
    summary: str  # the command's one-line description in --help


# The top-level fields of the commands that run a policy without training it (sft, eval):
# the model, where to write, the preset, the machine and the processes.
_POLICY_RUN = (
    "model",
    "corpus_episodes",
    "out",
    "preset",
    "device",
    "seed",
    "threads",
    "progress",
    "nproc",
    "backend",
)

COMMANDS: dict[str, RunCommand] = {
    "sft": RunCommand(
        (*_POLICY_RUN, "deterministic"),
        ("env", "rollout", "sft", "eval"),
        "warm start: fine-tune the policy on the environment's expert demonstrations",
    ),
    "train": RunCommand(
        tuple(f.name for f in scalar_fields(RunConfig)),
        ("env", "rollout", "algo", "train", "eval"),
        "reinforcement learning: collect, advantages, update, log, evaluate, checkpoint",
    ),
    "eval": RunCommand(
        _POLICY_RUN,
        ("env", "rollout", "eval"),
        "evaluate a policy on held-out tasks (success per task type, score)",
    ),
}
