"""Shared fixtures: a micro policy folder (seconds to build once) and CLI helpers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def micro_model(tmp_path_factory) -> Path:
    """A 1-layer, 32-wide tiny policy (about 40 k parameters) saved as a --model folder."""
    from mcgpo.policy import build_tiny_policy, save_policy
    from mcgpo.rollout import environment_corpus

    model, tokenizer = build_tiny_policy(
        environment_corpus(("household",), episodes=8), seed=0, hidden_size=32, num_layers=1,
        num_heads=2, num_kv_heads=1,
    )  # fmt: skip
    return save_policy(model, tokenizer, tmp_path_factory.mktemp("policy") / "micro")


@pytest.fixture(autouse=True)
def _restore_torch_globals():
    """CLI runs in-process set threads and deterministic mode; put them back afterwards."""
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


@pytest.fixture
def smoke_args(micro_model):
    """``mcgpo train`` arguments of a smoke run (2 tasks x 4 siblings, 3 turns, 2 updates)."""

    def args(out: Path, *extra: str) -> list[str]:
        return [
            "train", "--preset", "household-smoke", "--model", str(micro_model),
            "--out", str(out), "--train.weight_decay", "0", *extra,
        ]  # fmt: skip

    return args
