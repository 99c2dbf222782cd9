"""This process's place in a run of W processes: :class:`World`, and the block of a
batch it plays (:func:`rank_block`). The launch and the process group are
:mod:`mcgpo.training.distributed`; collectives :mod:`mcgpo.training.collectives`; the
learner's sharding :mod:`mcgpo.training.learner`."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

__all__ = ["SINGLE", "World", "current_world", "rank_block"]


@dataclass(frozen=True)
class World:
    """This process's place in the run: ``rank`` of ``size`` processes."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0: the process that writes files, metrics and the progress bar."""
        return self.rank == 0


SINGLE = World()


def current_world() -> World:
    """The world of an initialised process group, else the single process."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return SINGLE
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def rank_block(total: int, world: World) -> range:
    """The contiguous block of ``range(total)`` that rank ``world.rank`` takes (sizes differ
    by at most one when ``total`` is not divisible; trailing ranks may get one fewer)."""
    base, extra = divmod(total, world.size)
    start = world.rank * base + min(world.rank, extra)
    return range(start, start + base + (world.rank < extra))
