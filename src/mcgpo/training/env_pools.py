"""The environment pools a run keeps across its rollouts.

Building a pool per rollout starts its worker processes per rollout (``env.workers`` > 0:
an import of the environment package and the environments' construction in each, seconds
for the real ALFWorld engine, more than the rollout's own steps). A run keeps one pool per
role instead, built at its first rollout and closed at the run's end (:meth:`RunPools.close`,
in the trainer's ``finally``, so also on an error or Ctrl-C):

* ``"train"``: the training rollouts, played by the loop (``train.async_lag 0``) or by the
  rollout producer (``>= 1``), never by both;
* ``"eval"``: the evaluation's episodes, played by the learner beside the producer.

Every rollout resets every slot (:meth:`~mcgpo.envs.pool.EnvPool.reset`), and an environment
is fully defined by ``reset(seed, split)`` (the protocol asks it; tested for the built-in
environments), so a kept pool gives the rollouts of fresh ones. A worker killed in one
rollout is restarted by the pool and serves the next.

Served environments (``env.name remote``, or environments that say ``concurrent_steps``)
are not kept: their pool holds one server session per slot, and a kept training pool beside
a kept evaluation pool would hold G x N + ``eval.tasks`` sessions for the whole run, where
with ``train.async_lag 0`` the server is sized for max(G x N, ``eval.tasks``)
(docs/async.md), and sessions idle through the update would meet the server's idle timeout.
Their pool is built per rollout, as before (it costs HTTP session openings, no processes).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from mcgpo.envs.pool import EnvPool
from mcgpo.rollout.group_rollout import CollectOptions, open_pool

__all__ = ["ROLES", "RunPools"]

ROLES = ("train", "eval")


class RunPools:
    """One kept :class:`~mcgpo.envs.pool.EnvPool` per role (module docstring)."""

    def __init__(self) -> None:
        self._pools: dict[str, tuple[tuple, EnvPool]] = {}
        self._lock = threading.Lock()  # the producer and the learner may ask at once
        self._closed = False

    @contextlib.contextmanager
    def lease(
        self, role: str, make_env: Callable[[], Any], n_env: int, options: CollectOptions
    ) -> Iterator[EnvPool]:
        """The pool of ``role`` for one rollout of ``n_env`` environments: the kept one
        (built at the first call; rebuilt if the size or the workers changed), or, for
        served environments, one built now and closed when the block ends."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
        if self._closed:
            raise RuntimeError("the run's environment pools are closed")
        shape = (n_env, options.workers, options.step_timeout)
        with self._lock:
            kept = self._pools.get(role)
            if kept is not None and kept[0] != shape:
                self._pools.pop(role)[1].close()
                kept = None
            if kept is None:
                pool = open_pool(make_env, n_env, options)
                if not _served(pool):
                    kept = self._pools[role] = (shape, pool)
        if kept is None:  # served: this rollout's sessions only
            with pool:
                yield pool
            return
        yield kept[1]

    def close(self) -> None:
        """Stop every kept pool's worker processes (idempotent); later leases fail."""
        with self._lock:
            self._closed = True
            pools, self._pools = list(self._pools.values()), {}
        for _, pool in pools:
            pool.close()

    def processes(self) -> list[Any]:
        """The live worker processes of the kept pools (for tests and monitoring)."""
        with self._lock:
            return [p for _, pool in self._pools.values() for p in pool.processes()]


def _served(pool: EnvPool) -> bool:
    """In-process environments that wait on a server (``concurrent_steps``, RemoteEnv)."""
    return pool.envs is not None and all(
        getattr(env, "concurrent_steps", False) for env in pool.envs
    )
