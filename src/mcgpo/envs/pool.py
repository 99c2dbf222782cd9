"""EnvPool: step many environments as one batch, isolating failures.

One slot per environment. An exception raised inside an environment's ``reset`` or
``step`` (or a ``step`` that returns something other than a StepResult) marks that slot
*errored*: its trajectory is kept in the records up to the failure, is excluded from
learning by the caller (``pool.errored``), is counted in ``stats()``, and is never stepped
again until the next ``reset``. The other slots are untouched: a failure neither stops nor
changes them (each environment owns its state; the pool shares nothing between slots).

Two ways to step, the same results for the same seeds and actions:

* ``EnvPool(envs)``, the default: sequential, in this process. The built-in environments are
  pure Python and step in tens of microseconds, far less than a round trip to another
  process. Slots are stepped in increasing index order, so a run is reproducible. A step
  that hangs hangs the run, and one that kills the process kills the run.
* ``EnvPool.in_workers(factory, n, workers=W, step_timeout=T)``: the environments live in W
  worker processes (:mod:`mcgpo.envs.workers`), built there from a picklable factory
  (:class:`~mcgpo.envs.workers.EnvSpec`), stepped in parallel. A step that runs past ``T``
  seconds or kills its worker also marks just that slot errored; the worker is restarted and
  its other slots are rebuilt by replaying their actions. Close the pool (``close()`` or a
  ``with`` block) to stop the workers. A pool may be kept for many rollouts: ``reset``
  starts again a worker that died between them (or could not be restarted before).

Environments that wait on I/O rather than compute, such as a served environment's client
(:class:`~mcgpo.envs.serving.client.RemoteEnv`, which says ``concurrent_steps = True``), are
stepped in process but at once, from up to ``MAX_THREADS`` threads: the same results, by
slot, as sequential stepping (each environment owns its state), for one round trip per turn
instead of one per slot. ``close()`` also closes in-process environments that have a
``close`` method (a served environment's session).

Two ``step`` calls on disjoint slots may run at once (from two threads) where
:attr:`EnvPool.steps_at_once` says so (such I/O-bound environments in process); a worker
pool's calls must come one at a time (``collect``'s ``overlap_env`` holds a lock then).

Errors the *caller* makes (stepping a slot that is done, errored or out of range; a wrong
number of seeds) raise ``PoolError`` before any environment is touched.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any

from mcgpo.envs.protocol import Env, Observation, StepResult
from mcgpo.envs.workers import WorkerSet, describe

__all__ = ["DEFAULT_STEP_TIMEOUT", "EnvPool", "PoolError"]

_MAX_MESSAGE = 300
# Seconds a step in a worker may take: real ALFWorld steps take about 0.06 s and its resets
# (game loading) a few seconds, so a minute only catches what is truly stuck.
DEFAULT_STEP_TIMEOUT = 60.0
MAX_THREADS = 64  # threads stepping I/O-bound environments (``concurrent_steps``) at once


class PoolError(ValueError):
    """The caller used the pool wrongly (bad slot index, wrong number of seeds, ...)."""


def _one_line(phase: str, text: str) -> str:
    """'step turn 3: KeyError: detail', at most _MAX_MESSAGE characters."""
    text = f"{phase}: {text}"
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def _run_one(env: Env, job: tuple) -> tuple[bool, Any]:
    """One slot's job ("reset", seed, split) or ("step", action)."""
    try:
        if job[0] == "reset":
            return True, env.reset(seed=job[1], split=job[2])
        return True, env.step(job[1])
    except Exception as exc:  # isolate the slot; the message is kept in .errors
        return False, describe(exc)


def _run_here(
    envs: Sequence[Env], jobs: dict[int, tuple], threads: ThreadPoolExecutor | None
) -> dict[int, tuple[bool, Any]]:
    """Each slot's job, in slot order; at once from ``threads`` when given (remote envs)."""
    if threads is None or len(jobs) < 2:
        return {i: _run_one(envs[i], jobs[i]) for i in sorted(jobs)}
    futures = {i: threads.submit(_run_one, envs[i], jobs[i]) for i in sorted(jobs)}
    return {i: futures[i].result() for i in sorted(futures)}


class EnvPool:
    """A batch of environments stepped together; see the module docstring.

    ``envs`` holds the environments of an in-process pool (None for a worker pool);
    ``max_turns[i]`` is slot i's environment's own turn limit.
    """

    def __init__(self, envs: Sequence[Env]) -> None:
        if len(envs) == 0:
            raise PoolError("EnvPool needs at least one environment")
        self.envs: list[Env] | None = list(envs)
        self._workers: WorkerSet | None = None
        self.max_turns = [int(env.max_turns) for env in self.envs]
        # environments that wait on I/O (a served env's HTTP calls) step at once from threads
        concurrent = all(getattr(env, "concurrent_steps", False) for env in self.envs)
        self._threads = (
            ThreadPoolExecutor(min(len(self.envs), MAX_THREADS), thread_name_prefix="mcgpo-pool")
            if concurrent and len(self.envs) > 1
            else None
        )
        self._setup(len(self.envs))

    @classmethod
    def in_workers(
        cls,
        factory: Callable[[], Env],
        n_envs: int,
        *,
        workers: int,
        step_timeout: float = DEFAULT_STEP_TIMEOUT,
    ) -> EnvPool:
        """``n_envs`` environments built by ``factory`` (picklable) in ``workers`` processes.

        Raises PoolError for bad sizes or timeout, WorkerError when a worker cannot build
        its environments."""
        if isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1:
            raise PoolError(f"EnvPool needs at least one environment, got n_envs={n_envs!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise PoolError(f"workers must be an integer >= 1, got {workers!r}")
        if not (isinstance(step_timeout, numbers.Real) and math.isfinite(step_timeout)) or not (
            step_timeout > 0
        ):
            raise PoolError(f"step_timeout must be a finite number > 0, got {step_timeout!r}")
        pool = cls.__new__(cls)
        pool.envs = None
        pool._threads = None
        pool._workers = WorkerSet(factory, n_envs, workers, float(step_timeout))
        pool.max_turns = list(pool._workers.max_turns)
        pool._setup(n_envs)
        return pool

    def _setup(self, n: int) -> None:
        self._n = n
        self.errored: list[bool] = [False] * n
        self.errors: dict[int, str] = {}
        self.done: list[bool] = [True] * n  # nothing to step before reset
        self.turns: list[int] = [0] * n
        self._reset_errors = 0
        self._step_errors = 0
        self._steps = 0
        self._restarts_before = 0
        self._counting = threading.Lock()  # two steps of disjoint slots may count at once

    def __len__(self) -> int:
        return self._n

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker processes, or close the environments that have a ``close``
        (a served env's session); safe to call twice."""
        if self._workers is not None:
            self._workers.close()
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None
        for env in self.envs or []:
            close = getattr(env, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):  # best effort: nothing is lost
                    close()

    def processes(self) -> list[Any]:
        """The live worker processes (``multiprocessing.Process``); [] in process."""
        return [] if self._workers is None else self._workers.processes()

    def reset(self, seeds: Sequence[int], split: str) -> list[Observation | None]:
        """Reset slot i to the task (seeds[i], split); None where that reset raised."""
        n = self._n
        if len(seeds) != n:
            raise PoolError(f"reset got {len(seeds)} seeds for {n} environments")
        self._setup(n)
        self._restarts_before = self._restarts()
        if self._workers is not None:  # a kept pool: workers that died since run again
            self._workers.revive()
        results = self._run({i: ("reset", seed, split) for i, seed in enumerate(seeds)})
        out: list[Observation | None] = []
        for i, seed in enumerate(seeds):
            ok, value = results[i]
            if not ok:
                self._fail(i, _one_line(f"reset seed {seed}", value))
                self._reset_errors += 1
                out.append(None)
                continue
            out.append(value)
        for i, message in self._lost().items():
            self._fail(i, _one_line(f"after reset seed {seeds[i]}", message))
            self._reset_errors += 1
            out[i] = None
        self.done = [False] * n
        return out

    def step(self, actions: Mapping[int, str]) -> dict[int, StepResult]:
        """Step the given live slots; a slot that raises is marked errored and left out."""
        todo = self._checked(actions)
        done = self._run({i: ("step", action) for i, action in todo.items()})
        with self._counting:
            return self._step_results(todo, done)

    def _step_results(
        self, todo: dict[int, str], done: dict[int, tuple[bool, Any]]
    ) -> dict[int, StepResult]:
        results: dict[int, StepResult] = {}
        for i in sorted(todo):
            phase = f"step turn {self.turns[i] + 1}"
            ok, res = done[i]
            if ok and not isinstance(res, StepResult):
                ok, res = False, f"TypeError: step returned {type(res).__name__}, not StepResult"
            if not ok:
                self._fail(i, _one_line(phase, res))
                self._step_errors += 1
                continue
            self.turns[i] += 1
            self._steps += 1
            self.done[i] = bool(res.done)
            results[i] = res
        for i, message in self._lost().items():
            self._fail(i, _one_line(f"after step turn {self.turns[i]}", message))
            self._step_errors += 1
        return results

    def _checked(self, actions: Mapping[int, str]) -> dict[int, str]:
        """The actions by slot, or PoolError for a slot that is unknown, done or errored."""
        n = self._n
        todo: dict[int, str] = {}
        for key, action in actions.items():
            if isinstance(key, bool) or not isinstance(key, numbers.Integral) or not 0 <= key < n:
                raise PoolError(f"action for slot {key!r}: no such slot (pool has {n})")
            i = int(key)
            if self.errored[i] or self.done[i]:
                state = "errored" if self.errored[i] else "done"
                raise PoolError(f"action for slot {i}: that slot is {state}, not live")
            todo[i] = action
        return todo

    def _run(self, jobs: dict[int, tuple]) -> dict[int, tuple[bool, Any]]:
        if self._workers is None:
            assert self.envs is not None
            return _run_here(self.envs, jobs, self._threads)
        return self._workers.run(jobs)

    def _lost(self) -> dict[int, str]:
        """Live slots of a restarted worker whose state could not be rebuilt."""
        if self._workers is None:
            return {}
        return {i: m for i, m in self._workers.lost.items() if not self.errored[i]}

    def _restarts(self) -> int:
        return 0 if self._workers is None else self._workers.restarts

    @property
    def steps_at_once(self) -> bool:
        """Whether two ``step`` calls on disjoint slots may run at once (in-process
        environments that say ``concurrent_steps``: each call steps its slots from threads)."""
        return self._threads is not None

    def live(self) -> list[int]:
        """Slots neither done nor errored, in increasing order."""
        return [i for i in range(self._n) if not (self.done[i] or self.errored[i])]

    def stats(self) -> dict[str, float]:
        """Counts since the last reset (errored slots are excluded from learning)."""
        n = self._n
        errored = sum(self.errored)
        return {
            "envs": float(n),
            "errored": float(errored),
            "errored_rate": errored / n,
            "reset_errors": float(self._reset_errors),
            "step_errors": float(self._step_errors),
            "done": float(sum(d and not e for d, e in zip(self.done, self.errored))),
            "live": float(len(self.live())),
            "steps": float(self._steps),
            "worker_restarts": float(self._restarts() - self._restarts_before),
        }

    def _fail(self, i: int, message: str) -> None:
        self.errored[i] = True
        self.errors[i] = message
