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
holds the learner's weights.

W = 1 is the single-process reference: no process group, no collective, nothing changes.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import torch

from mcgpo.policy.logprobs import PolicyForward
from mcgpo.steps import StepTable
from mcgpo.training.config import AlgoConfig, ConfigError, RunConfig

__all__ = [
    "World",
    "all_sum",
    "barrier",
    "check_world",
    "copy_full_weights",
    "current_world",
    "distributed_learner",
    "exchange_objects",
    "follow_learner",
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


def launched_world_size() -> int:
    """``WORLD_SIZE`` as torchrun sets it; 1 outside a launched process."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number") from None


def current_world() -> World:
    """The world of an initialised process group, else the single process."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return SINGLE
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


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
    if size > 1 and cfg.train.pair_grad_probe:
        raise ConfigError("train.pair_grad_probe runs in one process only (--nproc 1)")
    if cfg.backend not in ("auto", "gloo", "nccl"):
        raise ConfigError(f"backend must be auto, gloo or nccl; got {cfg.backend!r}")
    if cfg.backend == "nccl" and not cfg.device.startswith("cuda"):
        raise ConfigError("backend nccl needs device cuda; use gloo on CPU")


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


def rank_block(total: int, world: World) -> range:
    """The contiguous block of ``range(total)`` that rank ``world.rank`` takes (sizes differ
    by at most one when ``total`` is not divisible; trailing ranks may get one fewer)."""
    base, extra = divmod(total, world.size)
    start = world.rank * base + min(world.rank, extra)
    return range(start, start + base + (world.rank < extra))


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


_LARGEST = ("time/", "memory/", "pi_old/max_", "pi_old/ratio_max_")


def merge_metrics(records: list[dict[str, float]]) -> dict[str, float]:
    """One update record from the ranks' records: counts summed, other values averaged over
    the ranks that report them; maxima and peaks take the largest rank's (``time/*``: the
    slowest rank; ``memory/*`` peaks and ``pi_old/max_*``, ``pi_old/ratio_max_*``)."""
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


# ---- the learner of W > 1 processes: DDP, or FSDP2 with a full replica for generation ----


def distributed_learner(model: Any, sharding: str, world: World) -> Any:
    """What the update runs on W > 1 ranks: DDP around ``PolicyForward(model)``, or
    (``"fsdp2"``) a sharded copy of it (:func:`shard_policy`); ``model`` itself when W = 1."""
    if world.size == 1:
        return model
    if sharding == "fsdp2":
        return shard_policy(model)
    if sharding != "ddp":
        raise ConfigError(f"train.sharding must be ddp or fsdp2, got {sharding!r}")
    from torch.nn.parallel import DistributedDataParallel

    device = next(model.parameters()).device
    device_ids = [device.index] if device.type == "cuda" else None
    # buffers (rotary tables) are equal everywhere; broadcasting them at every forward
    # would be a collective per micro-batch, and ranks run different numbers of those
    wrapped = PolicyForward(model)
    return DistributedDataParallel(wrapped, device_ids=device_ids, broadcast_buffers=False)


def shard_policy(model: Any) -> Any:
    """``PolicyForward`` around a copy of ``model``, with ``fully_shard`` on each transformer
    block and on the wrapper (the root, whose forward also runs the chunked head).

    The blocks are the modules whose class is in the model's ``_no_split_modules`` (Hugging
    Face names its decoder layer there, e.g. ``Qwen2DecoderLayer``); the root unit holds the
    rest (embeddings, final norm, a tied or untied head). The mesh is every rank, on the
    model's device type. Each rank keeps ``1/W`` of every parameter (dim 0, padded).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    learner = PolicyForward(copy.deepcopy(model))
    device = next(learner.parameters()).device
    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    blocks = set(getattr(learner.policy, "_no_split_modules", None) or ())
    for module in list(learner.modules())[1:]:
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(learner, mesh=mesh)
    return learner


def sharded(model: Any) -> bool:
    """Whether ``model`` is an FSDP2 module (its forwards and backwards are collectives)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def copy_full_weights(learner: Any, replica: Any) -> None:
    """Every rank: all-gather each sharded parameter of ``learner`` into ``replica`` (one
    collective per parameter, so only one full parameter is in flight at a time)."""
    from torch.distributed.tensor import DTensor

    mine = dict(replica.named_parameters())
    with torch.no_grad():
        for name, param in _policy_of(learner).named_parameters():
            full = param.full_tensor() if isinstance(param, DTensor) else param
            mine[name].copy_(full)


def follow_learner(replica: Any, learner: Any, optimizer: torch.optim.Optimizer) -> None:
    """Keep ``replica`` equal to a sharded ``learner``: after every optimiser step (which
    every rank takes together: the skip test is on the global gradient norm) copy the new
    weights into it. No-op for DDP (the replica is the module DDP wraps)."""
    if not sharded(learner):
        return
    optimizer.register_step_post_hook(lambda *_: copy_full_weights(learner, replica))


def full_optimizer_state(learner: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimiser state to checkpoint. FSDP2: gathered from every rank's shards (a
    collective: every rank calls it; rank 0 gets the full state, keyed by parameter name,
    on the CPU; the others an empty dict). Otherwise ``optimizer.state_dict()``."""
    if not sharded(learner):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(_policy_of(learner), optimizer, options=options)


def load_optimizer_state(
    learner: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Inverse of :func:`full_optimizer_state`; FSDP2: every rank holds the full ``state``
    (read from the checkpoint) and keeps its own shard of it."""
    if not sharded(learner):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(
        _policy_of(learner), optimizer, optim_state_dict=state, options=options
    )


def _policy_of(learner: Any) -> Any:
    """The policy inside a learner's :class:`PolicyForward` (parameter names without its
    prefix: the policy's own, as the checkpoints and the replica name them)."""
    inner = getattr(learner, "module", learner)  # DDP
    return inner.policy if isinstance(inner, PolicyForward) else inner


def gradient_sync(model: Any, *, last: bool) -> Any:
    """The gradients are reduced over the ranks in the backward of a step's last micro-batch
    only: DDP's ``no_sync`` before it; FSDP2's ``set_requires_gradient_sync(False)`` (each
    rank then accumulates unsharded gradients until the last pass reduce-scatters them)."""
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()
    if last or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


def zero_backward(model: Any, device: torch.device) -> None:
    """A backward with zero loss, so a rank with no rows in a step (or, FSDP2, fewer
    micro-batches than another rank) joins the collectives of the others' passes."""
    ids = torch.zeros((1, 1), dtype=torch.long, device=device)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    (out.logits.float().sum() * 0.0).backward()
