"""Batches sampled ahead of the update (``train.async_lag`` >= 1), kept in a checkpoint.

A checkpoint after update ``u`` of a run with lag ``k`` holds batches ``u + 1 .. u + k``:
they were sampled with weights older than ``θ_u`` (:mod:`mcgpo.training.pipeline`), which the
checkpoint no longer has, so a resume could not sample them again; it reads them back from
``pending.pt`` in the checkpoint folder. The file is written inside the checkpoint's
temporary folder (so it is renamed into place with the rest, atomically) and loads with
``torch.load(weights_only=True)``: the StepTable as its columns (numbers as tensors, text as
lists of str), the TokenBatch as its tensors, the stats and texts as plain types.

With W > 1 processes every rank samples its own block of groups; rank 0 writes every rank's
batches (``ranks[r]``) and each rank reads back its own.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mcgpo.rollout.records import Rollout
from mcgpo.rollout.tokens import TokenBatch
from mcgpo.steps import StepTable
from mcgpo.training.checkpoint import CheckpointError
from mcgpo.training.config import ConfigError

__all__ = ["PENDING_FILE", "Batch", "read_pending", "write_pending"]

PENDING_FILE = "pending.pt"
_TOKENS = ("input_ids", "attention_mask", "response_mask", "old_log_probs", "behaviour_log_probs")


@dataclass(frozen=True, eq=False)
class Batch:
    """The rollouts that update ``number`` learns from, all sampled with ``θ_version``."""

    number: int  # v: the update that trains on it (1-based)
    version: int  # s(v): updates done on the weights that sampled every row of it
    rollout: Rollout
    stats: dict[str, float]  # the collection's own (peak memory, waits)


def write_pending(folder: Path, lag: int, ranks: list[list[Batch]]) -> None:
    """``folder/pending.pt``: every rank's pending batches of a run with lag ``lag``."""
    payload = {"async_lag": lag, "ranks": [[_batch_state(b) for b in bs] for bs in ranks]}
    torch.save(payload, Path(folder) / PENDING_FILE)


def read_pending(checkpoint: Path, lag: int, rank: int, world_size: int) -> list[Batch]:
    """This rank's pending batches of ``checkpoint`` (none in a checkpoint without the
    file, i.e. of a run with lag 0); a checkpoint of another lag is a one-line
    :class:`ConfigError` (its batches were sampled for that lag, and the next one would be
    sampled with other weights than the saved ones promise)."""
    file = Path(checkpoint) / PENDING_FILE
    saved_lag, ranks = 0, [[] for _ in range(world_size)]
    if file.is_file():
        try:
            payload = torch.load(file, map_location="cpu", weights_only=True)
            saved_lag, ranks = int(payload["async_lag"]), payload["ranks"]
        except Exception as err:  # a damaged file: the caller may fall back to an older one
            raise CheckpointError(f"{file} cannot be read ({type(err).__name__})") from None
    if saved_lag != lag:
        raise ConfigError(
            f"--resume: train.async_lag is {lag} but the checkpoint {Path(checkpoint).name} "
            f"was written with {saved_lag}; resume with --train.async_lag {saved_lag}"
        )
    if len(ranks) != world_size:
        raise ConfigError(
            f"--resume: the checkpoint's pending batches are of {len(ranks)} processes, "
            f"this run has {world_size}"
        )
    return [_batch_from_state(s) for s in ranks[rank]]


def _batch_state(batch: Batch) -> dict[str, Any]:
    table = {}
    for name, column in batch.rollout.table.columns().items():
        table[name] = column.tolist() if column.dtype == object else torch.from_numpy(column)
    tokens = {name: getattr(batch.rollout.tokens, name) for name in _TOKENS}
    return {
        "number": batch.number,
        "version": batch.version,
        "table": table,
        "tokens": tokens,
        "stats": dict(batch.rollout.stats),
        "responses": list(batch.rollout.responses),
        "errors": {int(k): str(v) for k, v in batch.rollout.errors.items()},
        "collect_stats": dict(batch.stats),
    }


def _batch_from_state(state: dict[str, Any]) -> Batch:
    columns = {}
    for f in fields(StepTable):
        value = state["table"][f.name]
        if isinstance(value, torch.Tensor):
            columns[f.name] = value.numpy()
        else:
            column = np.empty(len(value), dtype=object)
            column[:] = value
            columns[f.name] = column
    rollout = Rollout(
        StepTable(**columns),
        TokenBatch(**state["tokens"]),
        dict(state["stats"]),
        tuple(state["responses"]),
        dict(state["errors"]),
    )
    return Batch(int(state["number"]), int(state["version"]), rollout, state["collect_stats"])
