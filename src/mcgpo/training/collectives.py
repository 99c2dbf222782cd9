"""Collectives of a run on W processes (each the values themselves when W = 1): sums,
object gathers and exchanges, the ranks' StepTables joined, their metrics merged, and the
one estimator option that needs batch-wide counts (:func:`whole_batch_algo`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from mcgpo.steps import StepTable
from mcgpo.training.config import AlgoConfig
from mcgpo.training.world import World

__all__ = [
    "SUMMED",
    "all_sum",
    "barrier",
    "exchange_objects",
    "gather_objects",
    "merge_metrics",
    "union_tables",
    "whole_batch_algo",
]


def whole_batch_algo(algo: AlgoConfig, table: StepTable, world: World) -> AlgoConfig:
    """The resolved ``algo`` for this rank's part of a batch (``table``): unchanged, except
    progress_gpo with ``scale_by_fail_share`` on W > 1, the one estimator option that is not
    group-local (lam is scaled by the share of all-fail groups of the *whole* batch). There
    the two counts (all-fail groups, groups) are summed over the ranks and the scaled lam is
    passed on as a fixed one, so every rank computes the single process's advantages (the
    same float: count / groups, times lam)."""
    options = algo.estimator
    if world.size == 1 or algo.name != "progress_gpo" or not options["scale_by_fail_share"]:
        return algo
    from mcgpo.advantages.progress_gpo import all_fail_groups

    fails = all_fail_groups(table) if len(table) else np.zeros(0, dtype=bool)
    n_fail, n_groups = all_sum([float(fails.sum()), float(len(fails))], world)
    share = float(n_fail / n_groups) if n_groups else 0.0
    fixed = {**options, "lam": options["lam"] * share, "scale_by_fail_share": False}
    return dataclasses.replace(algo, estimator=fixed)


def all_sum(values: np.ndarray | list[float], world: World) -> np.ndarray:
    """Element-wise sum over the ranks (float64; the values themselves when W = 1)."""
    array = np.asarray(values, dtype=np.float64)
    if world.size == 1:
        return array
    tensor = torch.as_tensor(array, dtype=torch.float64)
    if torch.distributed.get_backend() == "nccl":
        tensor = tensor.cuda()
    torch.distributed.all_reduce(tensor)
    return tensor.cpu().numpy()


def gather_objects(obj: Any, world: World) -> list[Any]:
    """Every rank's ``obj`` in rank order (pickled; for small things: tables, metric dicts)."""
    if world.size == 1:
        return [obj]
    out: list[Any] = [None] * world.size
    torch.distributed.all_gather_object(out, obj)
    return out


def exchange_objects(outgoing: list[Any], world: World) -> list[Any]:
    """All-to-all of picklable objects: ``outgoing[d]`` goes to rank ``d``; returns what
    every rank sent to this one, in rank order (W scatters, one from each rank, so each
    object travels only to the rank it is for; ``outgoing`` itself when W = 1)."""
    if len(outgoing) != world.size:
        raise ValueError(f"outgoing has {len(outgoing)} entries for {world.size} ranks")
    if world.size == 1:
        return list(outgoing)
    received: list[Any] = []
    for source in range(world.size):
        slot: list[Any] = [None]
        mine = outgoing if source == world.rank else None
        torch.distributed.scatter_object_list(slot, mine, src=source)
        received.append(slot[0])
    return received


def barrier(world: World) -> None:
    if world.size > 1:
        torch.distributed.barrier()


def union_tables(tables: list[StepTable], group_size: int) -> StepTable:
    """The ranks' StepTables end to end, as one process would have numbered them.

    Rank r's groups are numbered from 0 on that rank; here they continue after the groups of
    ranks < r (``group`` and ``traj`` shifted; ``traj = group * N + slot`` as collect does).
    """
    if len(tables) == 1:
        return tables[0]
    parts, offset = [], 0
    for table in tables:
        cols = dict(table.columns())
        cols["group"] = cols["group"] + offset
        cols["traj"] = cols["traj"] + offset * group_size
        parts.append(cols)
        offset += int(table.group.max()) + 1 if len(table) else 0
    if not parts:
        raise ValueError("union_tables needs at least one table")
    joined = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return StepTable.from_columns(joined)


# Metric keys that count things over the batch (summed over ranks); the rest are per-rank
# rates and means, averaged over the ranks (equal-size blocks of whole groups).
SUMMED = {
    "rollout/trajectories",
    "rollout/errored_trajectories",
    "rollout/rows",
    "rollout/tokens_generated",
    "rollout/responses_truncated",
    "rollout/prompts_no_history",
    "rollout/prompts_cut",
    "update/rows",
    "update/tokens",
    "pairs/given",
    "pairs/split_mini",
    "pairs/split_micro",
    "pairs/used",
}


_LARGEST = ("time/", "memory/", "pi_old/max_", "pi_old/ratio_max_", "rollout_correction/ratio_max")


def merge_metrics(records: list[dict[str, float]]) -> dict[str, float]:
    """One update record from the ranks' records: counts summed, other values averaged over
    the ranks that report them; maxima and peaks take the largest rank's (``time/*``: the
    slowest rank; ``memory/*`` peaks and ``pi_old/max_*``, ``pi_old/ratio_max_*``,
    ``rollout_correction/ratio_max``)."""
    if len(records) == 1:
        return records[0]
    keys = list(dict.fromkeys(k for r in records for k in r))
    out: dict[str, float] = {}
    for key in keys:
        values = [r[key] for r in records if key in r]
        if key in SUMMED:
            out[key] = float(np.sum(values))
        elif key.startswith(_LARGEST):
            out[key] = float(np.max(values))
        else:
            out[key] = float(np.mean(values))
    return out
