"""The weights the static sampler runs on under autocast: a copy in autocast's dtype.

``train.precision bf16-mixed`` keeps fp32 master weights and samples inside
``torch.autocast(bfloat16)`` (:func:`mcgpo.policy.precision.compute`). The dynamic sampler
runs there as it is. The static sampler cannot, and should not:

- it does not run: under autocast a Qwen2 layer's keys leave RoPE in float32 (the cosine
  table follows the fp32 residual stream) while its values are bf16, and transformers'
  ``StaticCache`` holds both in one dtype (its ``index_copy_`` refuses the other), so the
  first prefill failed (found for issue 43; no GPU run had used this combination);
- its compiled decode step would cast every fp32 weight to bf16 at every step (autocast's
  casts are graph operations): reading 4 bytes and writing 2 per parameter before the
  matmul reads the 2, about 4 times the weight bytes of a bf16 step in a step that is bound
  by those bytes.

So under autocast, with weights in another dtype, :func:`sampling_model` gives the sampler
a copy of the policy whose floating-point parameters are in autocast's dtype (buffers, e.g.
the rotary table, as they are), made once per policy (parameter by parameter, never a whole
fp32 copy) and brought up to date in place when the policy's weights have changed since
(their version counters: an optimiser step, a weight load), so that a compiled step's
CUDA graphs keep their addresses. The sampler then runs without autocast: the matmuls see
the very bf16 weights autocast would have made, the rest (norms, residual stream) runs in
bf16 too. Memory: 2 bytes per parameter, the "bf16 autocast copy" that the memory plan
(:func:`mcgpo.policy.memory.memory_plan`) already counts for the rollout phase.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import torch

__all__ = ["sampling_model"]

# policy -> (the version counters its parameters had at the last refresh, the copy)
_COPIES: weakref.WeakKeyDictionary[Any, tuple[tuple[int, ...], Any]] = weakref.WeakKeyDictionary()


def sampling_model(model: Any) -> tuple[Any, bool]:
    """(the model to sample from, whether autocast must be switched off for it): ``model``
    itself unless autocast is on for its device and its weights are in another floating
    dtype; then its copy in autocast's dtype, up to date (module docstring)."""
    first = next(model.parameters())
    kind = first.device.type
    if not torch.is_autocast_enabled(kind) or not first.is_floating_point():
        return model, False
    dtype = torch.get_autocast_dtype(kind)
    if first.dtype == dtype:
        return model, False
    params = list(model.parameters())
    versions = tuple(p._version for p in params)
    held = _COPIES.get(model)
    if held is None:
        memo = {id(p): _cast(p, dtype) for p in params}  # shared (tied) weights stay shared
        half = copy.deepcopy(model, memo).eval()
        _COPIES[model] = (versions, half)
        return half, True
    seen, half = held
    if seen != versions:
        with torch.no_grad():
            for mine, source in zip(half.parameters(), params):
                mine.copy_(source)
        _COPIES[model] = (versions, half)
    return half, True


def _cast(param: torch.nn.Parameter, dtype: torch.dtype) -> torch.nn.Parameter:
    if not param.is_floating_point():
        return torch.nn.Parameter(param.detach().clone(), requires_grad=False)
    return torch.nn.Parameter(param.detach().to(dtype), requires_grad=False)
