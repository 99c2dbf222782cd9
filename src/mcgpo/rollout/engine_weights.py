"""The weights a rollout engine takes (:mod:`mcgpo.rollout.vllm_engine`): from the policy as
it is now, or from a snapshot taken earlier.

Both name the tensors as ``save_pretrained`` does (a tied head once, under the embedding's
name; a LoRA policy's merged into its base's names) and cast each to the engine's dtype
only when the engine asks for it: one converted tensor alive at a time.

Weight sync (:meth:`VLLMEngine.update_weights`):

- in memory wherever the engine shares the trainer's process (CUDA; a CPU engine built with
  ``in_process=True``): the policy's parameters, one tensor at a time cast to the engine's
  dtype, go to vLLM's in-place reload (``collective_rpc("reload_weights",
  weights_iterator=...)``: the model's ``load_weights`` per tensor, then each layer's
  post-load processing). Under FSDP2 the policy passed is either the full replica that the
  trainer all-gathers from the sharded learner after every step
  (:func:`mcgpo.training.learner.follow_learner`), or (``train.fsdp_replica false``) the
  sharded policy itself, whose parameters are then all-gathered one at a time as vLLM
  takes them (:func:`mcgpo.policy.full_parameters`: every rank syncs its own engine, in
  step).
- through the engine's folder for the CPU engine in vLLM's processes, the one layout that
  has no other way in (tensors cross vLLM's process boundary only pickled, measured slower
  than the disk): the weights written into the folder (:func:`mcgpo.policy.write_weights`:
  from any rank, as transformers' ``save_pretrained`` writes on rank 0 only; a sharded
  policy's gathered first), then ``reload_weights(weights_path=folder)``.
- from a snapshot (:meth:`VLLMEngine.update_weights_from`, ``train.async_lag`` >= 1): the
  same two paths, fed from :func:`weight_snapshot`, a copy of the tensors the policy would
  send taken after an update (gathered in the learner's thread), loaded later by the
  rollout producer between two batches while the policy has moved on.
- with ``sleep`` (GPU): the engine sleeps at level 2 during the update (weights and KV cache
  freed, nothing copied to the host); the sync wakes the weights, loads them, frees the
  trainer's cached blocks (``torch.cuda.empty_cache``), then wakes the KV cache.

- a LoRA policy (``train.lora_rank``) is served merged: the parameters taken are
  :func:`mcgpo.policy.full_parameters`, which for adapters are ``W + (alpha / r) B A``
  under the base model's names (:func:`mcgpo.policy.lora.merged_parameters`), so vLLM
  sees a plain model of the base's class, through either path.

then two fixes, each with a switch that the tests turn off to show that it is needed:

- ``reset_prefix_cache``: the prefix cache keeps the KV of prompts computed with the old
  weights and would serve them again for a repeated prompt (measured: log-probs off by
  0.2-0.4 for a repeated prompt longer than one 128-token block);
- ``reprocess_tied_head``: with tied embeddings vLLM's CPU backend keeps a packed copy of
  the LM head that the reload leaves stale (log-probs off by ~0.2); the worker re-runs the
  head's ``process_weights_after_loading`` (a no-op on GPUs).
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
