"""Training across processes on torch.distributed: the world, the batch split, collectives.

A run on W processes (``torchrun --nproc-per-node W -m mcgpo train ...`` or
``mcgpo train --nproc W``) splits each update's ``G`` task groups into W contiguous blocks of
``G/W`` whole groups: rank r plays global groups ``r*G/W .. (r+1)*G/W - 1`` on the task
numbers the single-process run would give them, so the ranks' StepTables, laid end to end
with :func:`union_tables`, are the single-process StepTable. Every estimator is group-local,
so each rank computes advantages and pairs on its own groups (docs/scale-out.md lists each;
progress_gpo's batch-wide fail share is summed over the ranks, :func:`whole_batch_algo`).
The update is DDP by default, or FSDP2 with ``train.sharding = "fsdp2"``
(:func:`distributed_learner`; the maths is :mod:`mcgpo.training.update`); rank 0 writes
every file. Either wraps the policy in :class:`~mcgpo.policy.logprobs.PolicyForward`, whose
one forward also runs the chunked LM head (``train.logits_chunk``), so DDP's reducer and
FSDP2's root all-gather see it; the wrapper adds the prefix ``policy.`` to parameter names,
which nothing saved carries (checkpoints hold ``Run.model``; the optimiser state is keyed by
the policy's own names).

FSDP2: the learner is a copy of the policy with ``fully_shard`` on every transformer block
and on the root, so its gradients and AdamW state are sharded over the ranks. Generation
does not use it: a sharded forward is a collective, and the ranks' rollouts run different
numbers of sampler forwards. The policy itself (``Run.model``) stays a full local replica
that the sampler, evaluation and checkpoint writing use; after every optimiser step the
learner's new parameters are all-gathered into it (:func:`follow_learner`), so it always
holds the learner's weights. With ``train.fsdp_replica false`` (the default with
``rollout.engine vllm``) there is no replica: the policy is sharded in place and is the
learner's own module, vLLM samples and evaluates from its own copy of the weights (synced
by all-gathering one parameter at a time), and saving gathers the weights to rank 0
(:func:`full_model_state`). Each rank then holds 1/W of the fp32 weights instead of all of
them (30.5 GB less per GPU at 7B).

W = 1 is the single-process reference: no process group, no collective, nothing changes.

Modules: this one launches the processes and joins the process group;
:mod:`mcgpo.training.world` is a rank's place (:class:`World`, :func:`rank_block`),
:mod:`mcgpo.training.collectives` the collectives, :mod:`mcgpo.training.learner` the DDP /
FSDP2 learner. Their names are importable from here too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator
from typing import NoReturn

import torch

from mcgpo.training.collectives import (
    SUMMED,
    all_sum,
    barrier,
    exchange_objects,
    gather_objects,
    merge_metrics,
    union_tables,
    whole_batch_algo,
)
from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.learner import (
    copy_full_weights,
    distributed_learner,
    distributed_reference,
    follow_learner,
    full_model_state,
    full_optimizer_state,
    gradient_sync,
    load_optimizer_state,
    shard_policy,
    sharded,
    zero_backward,
)
from mcgpo.training.world import SINGLE, World, current_world, rank_block

# This module is the launch and the process group; the names of mcgpo.training.world,
# .collectives and .learner are re-exported so that one import line serves the trainer.
__all__ = [
    "SINGLE",
    "SUMMED",
    "World",
    "all_sum",
    "barrier",
    "check_world",
    "copy_full_weights",
    "current_world",
    "distributed_learner",
    "distributed_reference",
    "exchange_objects",
    "follow_learner",
    "full_model_state",
    "full_optimizer_state",
    "gather_objects",
    "gradient_sync",
    "init_world",
    "joined_world",
    "launch_local",
    "launched_world_size",
    "leave_launched_process",
    "load_optimizer_state",
    "merge_metrics",
    "rank_block",
    "shard_policy",
    "sharded",
    "union_tables",
    "whole_batch_algo",
    "zero_backward",
]


def launched_world_size() -> int:
    """``WORLD_SIZE`` as torchrun sets it; 1 outside a launched process."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number") from None


def check_world(cfg: RunConfig, size: int, kind: str = "train") -> None:
    """One-line :class:`ConfigError` for a world size the run cannot be split over
    (``kind`` "sft" or "eval": the warm start and the evaluation split no task groups)."""
    if cfg.nproc < 1:
        raise ConfigError(f"nproc must be >= 1, got {cfg.nproc}")
    if size > 1 and cfg.nproc not in (1, size):
        raise ConfigError(f"--nproc {cfg.nproc} but the launcher started {size} processes")
    if kind == "train" and cfg.rollout.groups % size:
        raise ConfigError(
            f"rollout.groups ({cfg.rollout.groups}) must be divisible by the world size ({size})"
        )
    if size > 1 and cfg.train.pair_probe:
        raise ConfigError("train.pair_probe runs in one process only (--nproc 1)")
    if cfg.backend not in ("auto", "gloo", "nccl"):
        raise ConfigError(f"backend must be auto, gloo or nccl; got {cfg.backend!r}")
    if cfg.backend == "nccl" and not cfg.device.startswith("cuda"):
        raise ConfigError("backend nccl needs device cuda; use gloo on CPU")


def init_world(cfg: RunConfig, kind: str = "train") -> tuple[RunConfig, World]:
    """Join the process group torchrun set up (gloo on CPU, NCCL on CUDA) when W > 1
    (``kind``: "train", "sft" or "eval", for :func:`check_world`).

    Returns the config with ``nproc`` set to the world size (so config.toml records it and a
    resume with another world size is refused) and, on CUDA, ``device`` = ``cuda:LOCAL_RANK``.
    """
    size = launched_world_size()
    check_world(cfg, size, kind)
    if size == 1:
        return cfg, SINGLE
    dist = torch.distributed
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = cfg.device
    if device.startswith("cuda"):
        device = f"cuda:{local}"
        torch.cuda.set_device(local)
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device != "cpu" else "gloo")
    if not dist.is_initialized():
        dist.init_process_group(backend)
    cfg = dataclasses.replace(cfg, nproc=size, device=device)
    return cfg, current_world()


@contextlib.contextmanager
def joined_world(cfg: RunConfig, kind: str = "train") -> Iterator[tuple[RunConfig, World]]:
    """:func:`init_world` for the length of a command; the process group (W > 1) is
    destroyed at its end, also when the command fails."""
    cfg, world = init_world(cfg, kind)
    done = False
    try:
        yield cfg, world
        done = True
    finally:
        if world.size > 1:
            if done:  # every rank's queued collectives have run before any rank tears down
                torch.distributed.barrier()
            torch.distributed.destroy_process_group()


def leave_launched_process(code: int) -> NoReturn:
    """End a torchrun-launched rank with ``code`` without Python's interpreter shutdown.

    Gloo's worker threads release the work objects of finished collectives (which hold
    tensors) on their own schedule; when a rank's interpreter is already finalising,
    such a release takes the GIL from a dying interpreter and the process aborts with
    "terminate called without an active exception" (SIGABRT) after its work is done
    (seen about 1 run in 30 with one rank idle, core dump: ``AsyncAllgatherWork``
    destroyed in ``ProcessGroupGloo::runLoop`` during ``Py_FinalizeEx``; the same race
    as pytorch/pytorch#179291). Every file the command writes is closed by then (atomic
    writes), so the rank flushes its streams and exits at once.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launch_local(nproc: int, argv: list[str]) -> int:
    """``python -m mcgpo <argv>`` in ``nproc`` processes on this machine, started by torch's
    own launcher (torch.distributed.launcher, what ``torchrun --standalone`` runs); returns
    the exit status (1 if a rank failed: each failing rank has printed its own error)."""
    import sys
    import uuid

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
    )
    try:
        elastic_launch(config, sys.executable)("-m", "mcgpo", *argv)
    except ChildFailedError:
        return 1
    return 0
