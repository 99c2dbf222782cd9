"""Environment steps overlapped with decoding inside one rollout (``overlap_env``).

The environments are cut into P fixed pieces (:func:`env_pieces`). A piece's environments
step (in a thread) while other pieces decode; the decoder takes the pieces in the order
their steps finish. A piece's turn is one sampler call holding exactly that piece's live
rows, so the company a row is decoded in, and with it the last bits of its log-probs, never
depends on the timing. Each environment's turn reads only its own observation, history and
generator, so the rollout is the sequential one, token for token, but for rare near ties
(the other company's rounding moves a draw to the neighbouring token; tests/rollout/
test_rollout_overlap.py), and bit for bit with ``batch_invariant`` (every row decoded alone:
tests/rollout/test_batch_invariant.py); docs/async.md says what it saves and where.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import pairwise
from typing import Any, Protocol

__all__ = ["Turns", "env_pieces", "play_overlapped"]


class Turns(Protocol):
    """What :func:`play_overlapped` plays with (the rollout's turns, turns.py):
    ``decode`` one sampler call for some live environments, ``step`` their environments,
    ``record`` the turn's rows and ``prepare`` their next prompts (each thread-safe for
    disjoint environments)."""

    pool: Any
    trajs: list[Any]

    def live(self, envs: Iterable[int], report: bool = False) -> list[int]: ...

    def decode(self, live: list[int]) -> Any: ...

    def step(self, d: Any) -> dict[int, Any]: ...

    def record(self, d: Any, results: dict[int, Any]) -> None: ...

    def prepare(self, envs: Iterable[int]) -> None: ...


def env_pieces(n_env: int, pieces: int) -> list[range]:
    """Environments ``0 .. n_env - 1`` cut into ``pieces`` contiguous blocks whose sizes
    differ by at most one (block p starts at ``n_env * p // pieces``); empty blocks (more
    pieces than environments) are left out."""
    bounds = [n_env * p // pieces for p in range(pieces + 1)]
    return [range(a, b) for a, b in pairwise(bounds) if b > a]


def play_overlapped(turns: Turns, pieces: list[range]) -> None:
    """The pieces' turns overlapped: a piece's environments step (in a thread) while
    other pieces decode. The decoder takes the pieces in the order their steps finish
    (a queue, so it never waits while a piece is ready); a piece decodes only after its
    own last step is recorded, in one sampler call holding exactly its live rows (the
    same company whatever the timing). Where the pool allows it
    (``EnvPool.steps_at_once``: I/O-bound environments) several pieces' steps may also
    overlap each other; otherwise they take turns on a lock (worker processes).
    """
    one_at_a_time = contextlib.nullcontext() if turns.pool.steps_at_once else threading.Lock()

    def step(d: Any, p: int) -> None:
        """Piece p's step, its rows recorded and its next prompts built, all in the
        stepper's thread (beside other pieces' decoding)."""
        with one_at_a_time:
            results = turns.step(d)
        turns.record(d, results)
        turns.prepare(pieces[p])

    ready: queue.SimpleQueue[int] = queue.SimpleQueue()
    for p in range(len(pieces)):
        ready.put(p)  # the first turns in piece order
    in_flight: dict[int, Future] = {}
    playing = len(pieces)
    with ThreadPoolExecutor(len(pieces), thread_name_prefix="env-step") as stepper:
        while playing:
            p = ready.get()
            if p in in_flight:  # its step ran beside other pieces' decodes
                in_flight.pop(p).result()  # its error, if any, is raised here
                turns.live(range(len(turns.trajs)), report=True)
            live = turns.live(pieces[p])
            if not live:
                playing -= 1
                continue
            future = stepper.submit(step, turns.decode(live), p)
            future.add_done_callback(lambda _, p=p: ready.put(p))
            in_flight[p] = future
