"""The learner of W > 1 processes: DDP, or FSDP2 with or without a full replica for
generation (:mod:`mcgpo.training.distributed` explains the layout), and what the update and
the checkpoints need of it: gradient sync on the last micro-batch, zero-loss passes, the
replica following the sharded steps, the full optimiser state and weights."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import torch

from mcgpo.policy.logprobs import PolicyForward
from mcgpo.training.config import ConfigError
from mcgpo.training.world import World

__all__ = [
    "copy_full_weights",
    "distributed_learner",
    "distributed_reference",
    "follow_learner",
    "full_model_state",
    "full_optimizer_state",
    "gradient_sync",
    "load_optimizer_state",
    "mixed_precision",
    "shard_policy",
    "sharded",
    "zero_backward",
]


def distributed_learner(
    model: Any, sharding: str, world: World, *, replica: bool = True, precision: str = "fp32"
) -> Any:
    """What the update runs on W > 1 ranks: DDP around ``PolicyForward(model)``, or
    (``"fsdp2"``) a sharded copy of it (:func:`shard_policy`, in ``precision``), or with
    ``replica`` false ``model`` itself sharded in place (no full copy is left on any rank);
    ``model`` itself when W = 1."""
    if world.size == 1:
        return model
    if sharding == "fsdp2":
        return shard_policy(model, copy_model=replica, precision=precision)
    if sharding != "ddp":
        raise ConfigError(f"train.sharding must be ddp or fsdp2, got {sharding!r}")
    from torch.nn.parallel import DistributedDataParallel

    device = next(model.parameters()).device
    device_ids = [device.index] if device.type == "cuda" else None
    # buffers (rotary tables) are equal everywhere; broadcasting them at every forward
    # would be a collective per micro-batch, and ranks run different numbers of those
    wrapped = PolicyForward(model)
    return DistributedDataParallel(wrapped, device_ids=device_ids, broadcast_buffers=False)


def shard_policy(model: Any, *, copy_model: bool = True, precision: str = "fp32") -> Any:
    """``PolicyForward`` around a copy of ``model`` (``model`` itself, sharded in place, when
    ``copy_model`` is false), with ``fully_shard`` on each transformer block and on the
    wrapper (the root, whose forward also runs the chunked head).

    The blocks are the modules whose class is in the model's ``_no_split_modules`` (Hugging
    Face names its decoder layer there, e.g. ``Qwen2DecoderLayer``); the root unit holds the
    rest (embeddings, final norm, a tied or untied head). The mesh is every rank, on the
    model's device type. Each rank keeps ``1/W`` of every parameter (dim 0, padded).

    ``precision`` (``train.precision``) "bf16-mixed": FSDP2's mixed-precision policy
    (:func:`mixed_precision`): the fp32 shards are all-gathered as bf16 and the gradients
    reduce-scattered in fp32, verl's FSDP convention; without it both went in fp32 (twice
    the bytes) and autocast re-cast every weight at every micro-batch.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    learner = PolicyForward(copy.deepcopy(model) if copy_model else model)
    device = next(learner.parameters()).device
    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    blocks = set(getattr(learner.policy, "_no_split_modules", None) or ())
    policy = mixed_precision(precision)
    for module in list(learner.modules())[1:]:
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh, **policy)
    fully_shard(learner, mesh=mesh, **policy)
    return learner


def mixed_precision(precision: str) -> dict[str, Any]:
    """``fully_shard``'s ``mp_policy`` for ``train.precision``: bf16 parameters in the
    forward and backward, fp32 gradient reduction (and accumulation across micro-batches
    without a sync) for "bf16-mixed"; nothing otherwise (fp32 is fp32; pure bf16 weights
    are bf16 already)."""
    if precision != "bf16-mixed":
        return {}
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return {
        "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    }


def distributed_reference(
    ref_model: Any, sharding: str, world: World, precision: str = "fp32"
) -> Any:
    """The KL reference the update runs beside the learner: with ``"fsdp2"`` on W > 1
    ranks sharded like it, in place (each rank keeps ``1/W`` of the frozen fp32 weights
    instead of all of them; its forwards become collectives, which :func:`zero_backward`'s
    padding passes join); otherwise ``ref_model`` unchanged (a whole copy per rank, as with
    DDP). Sharded as soon as it is copied, so that setup never holds three full copies."""
    if ref_model is None or world.size == 1 or sharding != "fsdp2":
        return ref_model
    sharded_ref = shard_policy(ref_model, copy_model=False, precision=precision)
    return sharded_ref.eval().requires_grad_(False)


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


def full_model_state(model: Any) -> dict[str, Any] | None:
    """The whole weights of a policy sharded in place (``train.fsdp_replica false``), for
    saving: a collective (every rank calls it); rank 0 gets them on the CPU, by the
    policy's own names, the others an empty dict. None when ``model`` holds whole tensors
    (a replica, DDP, one process): save its own state dict then. A LoRA policy's are its
    adapters only, gathered on every rank (:func:`mcgpo.policy.lora.adapter_state`: what
    its checkpoint and final folder hold; the frozen base is the run's ``--model``)."""
    from mcgpo.policy.loading import holds_shards
    from mcgpo.policy.lora import adapter_state, has_lora

    if not holds_shards(model):
        return None
    if has_lora(model):
        return adapter_state(model)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    # as save_pretrained writes a whole model: a tied head once, under the embedding's name
    keep = {name for name, _ in model.named_parameters()}
    keep |= {name for name, _ in model.named_buffers()}
    return {name: tensor for name, tensor in state.items() if name in keep}


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


def zero_backward(model: Any, device: torch.device, ref_model: Any = None) -> None:
    """A backward with zero loss, so a rank with no rows in a step (or, FSDP2, fewer
    micro-batches than another rank) joins the collectives of the others' passes: the
    learner's forward, then (a sharded reference, :func:`distributed_reference`) the
    reference's forward, then the backward, in the order of a real micro-batch. A LoRA
    policy sharded in place: the reference is the learner with its adapters off
    (:class:`mcgpo.policy.lora.AdaptersOff`), whose forward is as much a collective."""
    from mcgpo.policy.lora import reference_forward

    ids = torch.zeros((1, 1), dtype=torch.long, device=device)
    mask = torch.ones_like(ids)
    out = model(input_ids=ids, attention_mask=mask)
    if ref_model is not None:
        with torch.no_grad(), reference_forward(ref_model) as reference:
            if sharded(reference):
                reference(input_ids=ids, attention_mask=mask)
    (out.logits.float().sum() * 0.0).backward()
