"""Test-only (tests/training/test_fsdp.py): ``rollout.engine vllm`` served by a stand-in.

A folder holding this file is put on ``PYTHONPATH`` of a ``mcgpo train --nproc 2`` run, so
that every process of the run imports it at start-up. It replaces the run's vLLM engine by
:class:`HFEngine`, which keeps its own whole copy of the policy, samples from it with
mcgpo's HF sampler and takes new weights through the vLLM engine's own in-memory weight
iterator (``mcgpo.rollout.vllm_engine._named_weights``, which all-gathers a sharded
policy's parameters). With the same weights it samples exactly what the HF engine samples
from a replica, so a run without a replica can be compared with one that has it.

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

import mcgpo.training.setup as _setup
from mcgpo.policy.loading import holds_shards
from mcgpo.policy.lora import has_lora, merged_model
from mcgpo.rollout.sampler import sample
from mcgpo.rollout.vllm_engine import _named_weights


class HFEngine:
    """The rollout-engine interface of :class:`mcgpo.rollout.vllm_engine.VLLMEngine`."""

    def __init__(self, model: Any) -> None:
        assert not holds_shards(model), "the engine must be built from the whole policy"
        self.model = merged_model(model) if has_lora(model) else copy.deepcopy(model)

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
            for name, tensor in _named_weights(model, torch.float32):
                mine[name].copy_(tensor)
                seen.add(name)
        assert seen == set(mine), "HFEngine: the sync missed parameters"
        target = os.environ.get("MCGPO_TEST_ENGINE_WEIGHTS")
        if target and int(os.environ.get("RANK", "0")) == 0:
            from safetensors.torch import save_file

            save_file({k: v.detach().clone() for k, v in mine.items()}, target)
        return 0.0

    def close(self) -> None:
        pass


_setup.check_engine_installed = lambda: None
_setup.rollout_engine = lambda cfg, model, tokenizer, folder, world: HFEngine(model)
