"""Test-only (tests/training/test_fsdp.py): ``rollout.engine vllm`` served by a stand-in.

A folder holding this file is put on ``PYTHONPATH`` of a ``mcgpo train --nproc 2`` run, so
that every process of the run imports it at start-up. It replaces the run's vLLM engine by
:class:`hf_engine.HFEngine` (see there), which samples with mcgpo's HF sampler from its own
whole copy of the policy and takes weights through the vLLM engine's weight iterators.
"""

from __future__ import annotations

from hf_engine import HFEngine

import mcgpo.training.setup as _setup

_setup.check_engine_installed = lambda: None
_setup.rollout_engine = lambda cfg, model, tokenizer, folder, world: HFEngine(model)
