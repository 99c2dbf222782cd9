"""The weights a rollout engine takes (:mod:`mcgpo.rollout.vllm_engine`): from the policy as
it is now, or from a snapshot taken earlier.

Both name the tensors as ``save_pretrained`` does (a tied head once, under the embedding's
name; a LoRA policy's merged into its base's names) and cast each to the engine's dtype
only when the engine asks for it: one converted tensor alive at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from mcgpo.policy.loading import full_parameters

__all__ = ["policy_tensors", "snapshot_tensors", "weight_snapshot"]


def policy_tensors(model: Any, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's parameters by their checkpoint names (a tied head once, under the
    embedding's name, as ``save_pretrained`` writes it), each gathered (a sharded policy)
    and cast to ``dtype`` only when vLLM asks for it: one converted tensor alive at a time."""
    for name, param in full_parameters(model):
        yield name, param.to(dtype)


def weight_snapshot(model: Any) -> dict[str, torch.Tensor]:
    """A copy of the tensors :func:`policy_tensors` gives for ``model`` (what
    ``VLLMEngine.update_weights`` sends), whole, on the policy's device and in its dtype,
    for ``VLLMEngine.update_weights_from`` to load later, whatever the policy is by then.
    A sharded policy's are all-gathered: a collective, every rank calls it, in the thread
    that runs the update."""
    from torch.distributed.tensor import DTensor

    # a gathered (or merged) tensor is a fresh one already; a whole parameter is copied
    live = {
        p.untyped_storage().data_ptr() for p in model.parameters() if not isinstance(p, DTensor)
    }
    return {
        name: t.clone() if t.untyped_storage().data_ptr() in live else t
        for name, t in full_parameters(model)
    }


def snapshot_tensors(
    weights: Mapping[str, torch.Tensor], dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """A snapshot's tensors cast to ``dtype`` one at a time, as vLLM asks for them."""
    for name, tensor in weights.items():
        yield name, tensor.to(dtype)
