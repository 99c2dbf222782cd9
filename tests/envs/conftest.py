"""Fixtures shared by the environment tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcgpo.envs.alfworld_keys import TASK_TYPES


@pytest.fixture(scope="session")
def games_root(tmp_path_factory) -> Path:
    """Seeds 0-5 of train: one generated, planner-checked ALFWorld game of each task type
    (the alfworld extra; generated once per test session)."""
    from mcgpo.envs.alfworld import generate_games

    root = tmp_path_factory.mktemp("alfworld-games")
    paths = generate_games(root, n_per_type=1, seed=0, split="train")
    assert [p.parent.parent.name for p in paths] == list(TASK_TYPES)
    return root


@pytest.fixture(scope="session")
def alfworld_cache(games_root: Path) -> Path:
    """A cache folder holding the session's games (root/<GENERATOR_VERSION>/json_2.1.1/...)."""
    from mcgpo.envs.alfworld.problem import GENERATOR_VERSION

    cache = games_root.parent / f"cache-{games_root.name}"
    link = cache / GENERATOR_VERSION
    if not link.exists():
        cache.mkdir(exist_ok=True)
        link.symlink_to(games_root)
    return cache
