"""The same smoke run on a CUDA device (skipped without one)."""

from __future__ import annotations

import math

import pytest
import torch

from mcgpo.cli import main
from mcgpo.training.metrics import read_metrics

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_two_mcgpo_updates_on_cuda(smoke_args, tmp_path):
    out = tmp_path / "cuda"
    args = smoke_args(out, "--device", "cuda", "--train.logits_chunk", "16")
    assert main([*args, "--train.gradient_checkpointing", "true"]) == 0
    updates = [r for r in read_metrics(out / "metrics.jsonl") if "loss/task" in r]
    assert [r["update"] for r in updates] == [1, 2]
    assert all(math.isfinite(r["loss/task"]) for r in updates)


def test_compiled_layers_and_the_static_gqa_sampler_on_cuda(smoke_args, tmp_path):
    """Issue 33's switches on: the update's decoder layers compiled (train.compile true) and
    rollouts from the static sampler with its compiled step and GQA-native decode attention
    (rollout.decode_attention gqa); the graphs compiled are counted in the metrics."""
    out = tmp_path / "compiled"
    args = smoke_args(out, "--device", "cuda", "--train.precision", "bf16-mixed")
    flags = ["--train.compile", "true", "--rollout.sampler", "static",
             "--rollout.decode_attention", "gqa"]  # fmt: skip
    assert main([*args, *flags]) == 0
    updates = [r for r in read_metrics(out / "metrics.jsonl") if "loss/task" in r]
    assert [r["update"] for r in updates] == [1, 2]
    assert all(math.isfinite(r["loss/task"]) for r in updates)
    assert updates[0]["compile/graphs"] >= 1
