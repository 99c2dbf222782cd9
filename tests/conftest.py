"""Fixtures shared by every test package: a micro policy folder (seconds to build once)."""

from __future__ import annotations

from pathlib import Path

import pytest


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
