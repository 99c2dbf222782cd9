"""Test-only: a stand-in for the vLLM rollout engine (``rollout.engine vllm``) without vLLM.

:class:`HFEngine` keeps its own whole copy of the policy, samples from it with mcgpo's HF
sampler and takes new weights through the vLLM engine's own weight iterators
(``mcgpo.rollout.engine_weights.policy_tensors``, which all-gathers a sharded
policy's parameters, and ``snapshot_tensors`` for a snapshot). With the same weights it samples
exactly what the HF engine samples from a replica, so a run on the engine can be compared
with one on mcgpo's samplers. Used in-process (tests/training/test_async_engine.py) and,
through ``sitecustomize``, by the runs of ``mcgpo train --nproc 2``.

``MCGPO_TEST_EXPECT_SHARDED=1``: every sync checks that the policy it is given is sharded
(no full replica is left on the rank); ``0``: that it is whole. A LoRA policy: the engine
holds a plain model and takes the merged weights, as vLLM does.
``MCGPO_TEST_ENGINE_WEIGHTS=FILE``: rank 0 writes the weights of each sync it received to
FILE (safetensors, the last sync's at the end).
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch

from mcgpo.policy.loading import holds_shards
from mcgpo.policy.lora import has_lora, merged_model
from mcgpo.rollout.engine_weights import policy_tensors, snapshot_tensors
from mcgpo.rollout.sampler import sample


class HFEngine:
    """The rollout-engine interface of :class:`mcgpo.rollout.vllm_engine.VLLMEngine`."""

    def __init__(self, model: Any) -> None:
        assert not holds_shards(model), "the engine must be built from the whole policy"
        self.model = merged_model(model) if has_lora(model) else copy.deepcopy(model)
        self.loads = 0  # snapshots loaded (update_weights_from)
        self.closed = False

    def sample(self, prompts: Any, **kwargs: Any) -> Any:
        return sample(self.model, prompts, **kwargs)

    def sleep(self) -> None:
        pass

    def update_weights(self, model: Any) -> float:
        expect = os.environ.get("MCGPO_TEST_EXPECT_SHARDED")
        if expect is not None and holds_shards(model) != (expect == "1"):
            raise AssertionError(f"HFEngine: policy sharded {holds_shards(model)}, want {expect}")
        mine = dict(self.model.named_parameters())
        seen = set()
        with torch.no_grad():
            for name, tensor in policy_tensors(model, torch.float32):
                mine[name].copy_(tensor)
                seen.add(name)
        assert seen == set(mine), "HFEngine: the sync missed parameters"
        target = os.environ.get("MCGPO_TEST_ENGINE_WEIGHTS")
        if target and int(os.environ.get("RANK", "0")) == 0:
            from safetensors.torch import save_file

            save_file({k: v.detach().clone() for k, v in mine.items()}, target)
        return 0.0

    def update_weights_from(self, weights: dict[str, torch.Tensor]) -> float:
        """A snapshot (``weight_snapshot``), through the engine's own snapshot iterator."""
        mine = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in snapshot_tensors(weights, torch.float32):
                mine[name].copy_(tensor)
        assert weights.keys() == mine.keys(), "HFEngine: the snapshot missed parameters"
        self.loads += 1
        return 0.0

    def close(self) -> None:
        self.closed = True
