"""Shared fixtures of the training tests: CLI helpers (``micro_model`` is tests/conftest.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


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
