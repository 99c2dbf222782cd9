"""environment_corpus survives an episode whose environment raises: skipped and counted."""

from __future__ import annotations

import random

import pytest
from rollout_fakes import CounterEnv

from mcgpo.rollout.corpus import Corpus, _episode, environment_corpus


def episode_texts(k: int) -> list[str]:
    """The texts of episode k alone, with the corpus's own RNG rule for it."""
    return _episode(CounterEnv(), k, random.Random(f"corpus:counter:0:{k}"), 0.25, 2)


def test_a_clean_corpus_is_every_episode_in_order():
    corpus = environment_corpus(("counter",), episodes=4, make=lambda name: CounterEnv())
    assert isinstance(corpus, Corpus) and isinstance(corpus, list)
    assert list(corpus) == [t for k in range(4) for t in episode_texts(k)]
    assert corpus.skipped == 0 and corpus.errors == []


def test_failing_episodes_are_skipped_counted_and_the_env_rebuilt():
    built = []

    def make(name: str) -> CounterEnv:
        built.append(name)  # episode 2 fails at its second step, episode 4 at reset
        return CounterEnv(fail_seed=2, fail_turn=2, fail_reset_seed=4)

    corpus = environment_corpus(("counter",), episodes=6, make=make)
    assert list(corpus) == [t for k in (0, 1, 3, 5) for t in episode_texts(k)]
    assert corpus.skipped == 2
    assert corpus.errors == [
        "counter episode 2: RuntimeError: step failed for seed 2 at turn 2",
        "counter episode 4: RuntimeError: reset failed for seed 4",
    ]
    assert len(built) == 3  # the first environment, and a fresh one after each failure


def test_an_environment_whose_every_episode_fails_is_an_error():
    with pytest.raises(
        ValueError,
        match=r"every corpus episode of 'counter' raised; first: "
        r"counter episode 0: RuntimeError: reset failed for seed 0",
    ):
        environment_corpus(
            ("counter",), episodes=1, make=lambda name: CounterEnv(fail_reset_seed=0)
        )
