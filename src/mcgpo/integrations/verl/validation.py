"""mcgpo's ``eval/*`` metrics from verl's validation.

verl's validation (``trainer_base._validate``) keeps, per episode, the ``reward_extra_info``
of its final output in ``reward_extra_infos_dict`` (one list per key, one entry per episode,
None where an episode lacks the key) and logs ``val-core/<data source>/reward/mean@N``:
the mean return, not the numbers the papers report. The ``mcgpo_env`` agent loop puts
:func:`episode_info` into each trajectory's ``reward_extra_info``, and the ``mcgpo``
trainer adds :func:`validation_metrics` to verl's: the keys of
:func:`mcgpo.training.evaluate.episode_summary` with the prefix ``eval`` (success and score
over the episodes that did not error, turns, valid actions, errored episodes, success per
task type), so a verl run and mcgpo's own trainer log the same names.

One difference: a session whose reset failed returns no output, so verl has no entry for
it; with ``expected`` (the sessions verl started) those count as errored episodes here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["EPISODE_KEYS", "episode_info", "validation_metrics"]

# the reward_extra_info keys of one episode (numbers, except task_type)
EPISODE_KEYS = ("success", "score", "errored", "turns", "valid_turns", "task_type")


def episode_info(
    *, success: float, score: float, errored: bool, turns: int, valid_turns: int,
    task_type: str,
) -> dict[str, Any]:  # fmt: skip
    """One trajectory's ``reward_extra_info``: outcome, turns, turns with a valid action
    (verl also logs each key's mean as ``val-aux/<data source>/<key>/mean@N``)."""
    return {
        "success": float(success), "score": float(score), "errored": float(bool(errored)),
        "turns": float(turns), "valid_turns": float(valid_turns), "task_type": str(task_type),
    }  # fmt: skip


def validation_metrics(
    infos: Mapping[str, Sequence[Any]], expected: int | None = None
) -> dict[str, float]:
    """``eval/*`` of the episodes in verl's ``reward_extra_infos_dict`` (module docstring);
    ``expected``: the sessions validation started (the missing ones count as errored)."""
    success = list(infos.get("success", ()))
    rows = [i for i, value in enumerate(success) if value is not None]
    missing = max(int(expected or 0) - len(rows), 0)

    def column(key: str) -> np.ndarray:
        values = list(infos.get(key, ()))
        return np.asarray(
            [float(values[i] or 0.0) if i < len(values) else 0.0 for i in rows], np.float64
        )

    errored = column("errored") > 0
    out = {
        "eval/episodes": float(len(rows) + missing),
        "eval/errored": float(errored.sum() + missing),
    }
    ok = ~errored
    if not ok.any():
        return out
    turns = column("turns")
    out["eval/success"] = float(column("success")[ok].mean())
    out["eval/score"] = float(column("score")[ok].mean())
    out["eval/turns"] = float(turns[ok].mean())
    out["eval/valid_actions"] = float(column("valid_turns")[ok].sum() / turns[ok].sum())
    types_given = list(infos.get("task_type", ()))
    types = np.asarray(
        [str(types_given[i] or "") if i < len(types_given) else "" for i in rows], dtype=object
    )
    wins = column("success")
    for name in sorted(set(types[ok].tolist())):
        if name:
            sel = ok & (types == name)
            out[f"eval/success/{name}"] = float(wins[sel].mean())
    return out
