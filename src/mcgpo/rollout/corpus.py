"""Text the environments generate, for training the tiny model's tokenizer offline.

Episodes are played on the training split by the environment's expert, with a share of
uniformly random admissible actions (``explore``) so that failure texts ("Nothing
happens.", unchanged pages) and off-path objects appear too. Every decision contributes the
prompt exactly as the rollout layer renders it (alternating the two response formats, so
the template words and the ``<think>``/``<action>`` tags are in the corpus) and the response
text in both formats. Only the training split is read: words that appear only in held-out
tasks are left to the byte-level fallback of the tokenizer.

An episode whose environment raises (in ``reset`` or ``step``) is skipped: none of its texts
are kept, the environment is rebuilt for the next episode, and the returned
:class:`Corpus` counts it (``skipped``, with one line per episode in ``errors``). Only when
every episode of an environment fails is it an error (``ValueError``).

Deterministic: the same arguments give the same list of texts.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from mcgpo.envs.protocol import Env
from mcgpo.rollout.prompts import RESPONSE_FORMATS, format_response, render_prompt

__all__ = ["Corpus", "environment_corpus"]


class Corpus(list[str]):
    """The corpus texts (a plain list of strings), and the episodes skipped because their
    environment raised: ``errors`` holds one line per skipped episode."""

    def __init__(self, texts: Sequence[str] = (), errors: Sequence[str] = ()) -> None:
        super().__init__(texts)
        self.errors: list[str] = list(errors)

    @property
    def skipped(self) -> int:
        """Episodes left out because their environment raised."""
        return len(self.errors)


def environment_corpus(
    env_names: Sequence[str] = ("household",),
    *,
    episodes: int = 64,
    seed: int = 0,
    explore: float = 0.25,
    history: int = 2,
    make: Callable[[str], Env] | None = None,
) -> Corpus:
    """Prompts and responses from the training tasks 0..episodes-1 of each environment.

    ``seed`` drives the exploratory actions only.
    ``make`` builds an environment from its name (default :func:`mcgpo.make_env`).
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if not 0.0 <= explore <= 1.0:
        raise ValueError(f"explore must be in [0, 1], got {explore}")
    if make is None:
        from mcgpo.envs import make_env as make
    corpus = Corpus()
    for name in env_names:
        env = make(name)
        failed = 0
        for episode in range(episodes):
            rng = random.Random(f"corpus:{name}:{seed}:{episode}")
            try:
                texts = _episode(env, episode, rng, explore, history)
            except Exception as exc:  # a broken episode is skipped, never the whole corpus
                failed += 1
                detail = " ".join(str(exc).split())
                corpus.errors.append(f"{name} episode {episode}: {type(exc).__name__}: {detail}")
                env = make(name)  # its state is unknown after the failure
                continue
            corpus.extend(texts)
        if failed == episodes:
            raise ValueError(
                f"every corpus episode of {name!r} raised; first: {corpus.errors[-failed]}"
            )
    return corpus


def _episode(env: Env, episode: int, rng: random.Random, explore: float, history: int) -> list[str]:
    """The texts of one episode of training task ``episode``."""
    texts: list[str] = []
    obs = env.reset(seed=episode, split="train")
    past: list[tuple[str, str]] = []
    for turn in range(env.max_turns):
        fmt = RESPONSE_FORMATS[turn % 2]
        texts.append(render_prompt(obs, past, history=history, response_format=fmt))
        if obs.admissible_actions and rng.random() < explore:
            action = rng.choice(obs.admissible_actions)
        else:
            action = env.expert_action()
        texts.append(format_response(action, "action"))
        texts.append(format_response(action, "think", thought=obs.text))
        result = env.step(action)
        past.append((obs.text, action))
        obs = result.observation
        if result.done:
            texts.append(obs.text)
            break
    return texts
