"""The static sampler's single-token decode step, and its compiled form.

:func:`eager_step` is one decode step of every row; :func:`compiled_step` is the process's
one ``torch.compile`` of it (``COMPILE_OPTIONS``: dynamic shapes, so one graph serves every
cache length and length bucket of a row count; :mod:`mcgpo.rollout.static_decode` says
why). It runs under :func:`step_limits` (at most ``RECOMPILE_LIMIT`` graphs instead of
dynamo's 8), and :func:`decode_compile_stats` reports how many graphs it holds
(``rollout/compile_graphs``) and whether the limit was reached (``rollout/compile_limit_hit``,
after which dynamo runs new shapes eagerly).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "COMPILE_OPTIONS",
    "RECOMPILE_LIMIT",
    "compiled_step",
    "decode_compile_stats",
    "eager_step",
    "step_limits",
]

RECOMPILE_LIMIT = 64  # graphs the decode step may compile (dynamo's default: 8)
# torch.compile's arguments for the decode step (the tests count graphs with backend "eager")
COMPILE_OPTIONS: dict[str, Any] = {"mode": "reduce-overhead", "dynamic": True}


def eager_step(
    model: Any, cache: Any, cache_kw: str, token, pos, mask, column, columns: int | None
) -> torch.Tensor:
    """One decode step of every row: feed ``token`` at the next cache column; logits [B, V].
    ``columns``: attend to the first ``columns`` cache columns only (gqa's length buckets)."""
    extra = {"cache_position": column} if column is not None else {}
    if columns is not None:
        extra["decode_columns"] = columns
    out = model(
        input_ids=token[:, None], attention_mask=mask, position_ids=pos[:, None],
        use_cache=True, **{cache_kw: cache}, **extra,
    )  # fmt: skip
    return out.logits[:, -1].float()


_STEP: list[Callable[..., torch.Tensor]] = []  # the compiled step, made at the first use


def compiled_step() -> Callable[..., torch.Tensor]:
    """The one compiled decode step of the process (dynamo keeps its graphs on ``eager_step``'s
    code object, whichever ``torch.compile`` wrapper calls it)."""
    if not _STEP:
        _STEP.append(torch.compile(eager_step, **COMPILE_OPTIONS))
    return _STEP[0]


def step_limits() -> Any:
    return torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT)


def _step_graphs() -> int:
    """Graphs dynamo holds for the decode step (its cache entries on ``eager_step``'s code)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(eager_step.__code__))


def decode_compile_stats() -> dict[str, float]:
    """``rollout/compile_graphs``: graphs compiled for the static sampler's decode step in
    this process; ``rollout/compile_limit_hit``: 1 when they reached ``RECOMPILE_LIMIT``,
    after which dynamo runs new shapes eagerly (with one warning). Empty when the step was
    never compiled."""
    if not _STEP:
        return {}
    graphs = _step_graphs()
    return {
        "rollout/compile_graphs": float(graphs),
        "rollout/compile_limit_hit": float(graphs >= RECOMPILE_LIMIT),
    }
