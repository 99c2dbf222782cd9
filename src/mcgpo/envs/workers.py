"""Environment worker processes for :class:`~mcgpo.envs.pool.EnvPool`, with a step timeout.

Each worker is a ``multiprocessing`` process that owns the environments of its slots (slot
``i`` lives in worker ``i % workers``), built there from a picklable factory
(:class:`EnvSpec`). The parent sends a worker the list of its slots' jobs (reset, step, expert) and
the worker answers slot by slot, so the parent knows which slot a worker is busy with.

A slot's job fails when its environment raises (the worker goes on), when it runs past
``step_timeout`` seconds (counted from the moment the parent receives the worker's previous
answer; the worker is killed), or when the worker dies (``os._exit``, a segfault). After a
kill or a death the worker is restarted and its *other* live slots are rebuilt by replaying
their (seed, split, actions) from the start, then their pending jobs are run: this needs
environments that are deterministic in (seed, split, actions), as the protocol asks. A slot
whose replay fails is reported lost. Nothing of the other workers is touched.

Why ``multiprocessing`` and not Ray: no extra dependency, one machine is the case here, and a
killed process is the only sure way to stop a step that hangs in C code. Why the ``spawn``
start method: a fresh interpreter inherits no threads, locks or CUDA context from a parent
that already runs torch (``fork`` after that can deadlock, and CUDA cannot be forked), and it
behaves the same on Linux and macOS; its cost is an import of :mod:`mcgpo.envs` per start
(about half a second), paid once per pool and once per restart.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

__all__ = ["BUILD_TIMEOUT", "BadInput", "EnvSpec", "WorkerError", "WorkerSet", "describe"]

BUILD_TIMEOUT = 300.0  # seconds a worker may take to import and build its environments
_JOIN_TIMEOUT = 5.0  # seconds close() waits for a worker to stop before killing it


class WorkerError(RuntimeError):
    """A worker could not build its environments (one line naming the error)."""


class BadInput(str):
    """A failed job's one-line message when the environment refused the job's input: a
    ``reset`` that raised ``ValueError`` (an unknown split, a bad seed). A plain ``str``
    everywhere else; the environment server answers it as the client's mistake (4xx)."""


def describe(exc: BaseException) -> str:
    """'KeyError: detail' on one line (white space folded)."""
    detail = " ".join(str(exc).split())
    return f"{type(exc).__name__}" + (f": {detail}" if detail else "")


@dataclass(frozen=True)
class EnvSpec:
    """A picklable environment factory: ``EnvSpec(name, options)()`` is
    ``mcgpo.make_env(name, **options)``; what a worker process receives."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self) -> Any:
        from mcgpo.envs import make_env

        return make_env(self.name, **dict(self.options))


def _worker_main(conn: Connection, factory: Callable[[], Any], slots: list[int]) -> None:
    """The worker loop: build the slots' environments, then answer jobs until told to stop."""
    # Started as a daemon (the parent's exit stops it), it may still start processes of its
    # own: an environment may need one (ALFWorld's generated games check a new game's plan
    # in a child, which a daemon may not start). The flag only matters to the parent.
    multiprocessing.current_process().daemon = False
    try:
        envs = {slot: factory() for slot in slots}
        conn.send(("built", {slot: int(env.max_turns) for slot, env in envs.items()}))
    except Exception as exc:  # reported to the parent as one line
        conn.send(("build_failed", describe(exc)))
        return
    while True:
        jobs = conn.recv()
        if jobs is None:
            return
        for slot, job in jobs:
            try:
                value = _run_job(envs[slot], job)
                conn.send((slot, True, value))  # pickling fails before anything is written
            except Exception as exc:  # isolate the slot; the parent marks it errored
                refused = job[0] == "reset" and isinstance(exc, ValueError)
                conn.send((slot, False, (BadInput if refused else str)(describe(exc))))


def _run_job(env: Any, job: tuple) -> Any:
    kind = job[0]
    if kind == "reset":
        return env.reset(seed=job[1], split=job[2])
    if kind == "step":
        return env.step(job[1])
    if kind == "expert":
        return env.expert_action()
    _, seed, split, actions = job  # "replay": rebuild the state after a restart
    env.reset(seed=seed, split=split)
    for action in actions:
        env.step(action)
    return None


class _Worker:
    """One worker process and the parent's end of its pipe; :meth:`ready` waits for the build."""

    def __init__(self, ctx: Any, factory: Callable[[], Any], slots: list[int]) -> None:
        self.slots = slots
        parent, child = ctx.Pipe()
        self.conn = parent
        self.process = ctx.Process(target=_worker_main, args=(child, factory, slots), daemon=True)
        try:
            self.process.start()
        except Exception as exc:  # typically a factory that cannot be pickled
            parent.close()
            raise WorkerError(
                "the environment factory cannot be sent to a worker process (use "
                f"mcgpo.envs.workers.EnvSpec(name, options)): {describe(exc)}"
            ) from None
        finally:
            child.close()
        self.max_turns: dict[int, int] = {}

    def ready(self) -> None:
        """Wait for the worker's environments; WorkerError (one line) if it cannot build them."""
        if not self.conn.poll(BUILD_TIMEOUT):
            self.kill()
            raise WorkerError(f"worker did not build its environments in {BUILD_TIMEOUT:.0f} s")
        try:
            tag, payload = self.conn.recv()
        except (EOFError, OSError):
            code = self.kill()
            raise WorkerError(f"worker died while building its environments ({code})") from None
        if tag != "built":
            self.kill()
            raise WorkerError(f"building an environment in a worker failed: {payload}")
        self.max_turns = payload

    def kill(self) -> str:
        """Stop the process now; returns 'exit code N' (negative: killed by signal -N)."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()
        return f"exit code {self.process.exitcode}"

    def stop(self) -> None:
        """Ask the process to finish, kill it if it does not."""
        with contextlib.suppress(OSError, ValueError):  # the pipe may already be gone
            self.conn.send(None)
        self.process.join(_JOIN_TIMEOUT)
        self.kill()


def _stop_all(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.stop()


class WorkerSet:
    """``workers`` processes holding ``n_envs`` environments; see the module docstring.

    :meth:`run` takes one job per slot and returns ``{slot: (ok, value)}``, where a failed job
    has ``ok = False`` and a one-line ``value``; ``lost`` collects slots that were not in the
    call but whose state a restart could not rebuild. Workers stop at :meth:`close` (also
    when the set is garbage collected or the interpreter exits).
    """

    def __init__(
        self, factory: Callable[[], Any], n_envs: int, workers: int, step_timeout: float
    ) -> None:
        self.factory = factory
        self.step_timeout = float(step_timeout)
        self.restarts = 0
        self.lost: dict[int, str] = {}
        self._ctx = multiprocessing.get_context("spawn")
        self._slots = [list(range(w, n_envs, workers)) for w in range(min(workers, n_envs))]
        # slot -> (seed, split, actions so far) for every slot live in its worker
        self._history: dict[int, tuple[int, str, list[str]]] = {}
        self._workers: list[_Worker] = []
        self._broken: dict[int, str] = {}  # worker -> why it could not be restarted
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)
        try:
            for slots in self._slots:
                self._workers.append(_Worker(self._ctx, factory, slots))
            for worker in self._workers:
                worker.ready()
        except WorkerError:
            self.close()
            raise
        self.max_turns = [0] * n_envs
        for worker in self._workers:
            for slot, turns in worker.max_turns.items():
                self.max_turns[slot] = turns

    def close(self) -> None:
        """Stop every worker process (idempotent)."""
        self._finalizer()

    def processes(self) -> list[Any]:
        """The current worker processes (for tests and monitoring)."""
        return [worker.process for worker in self._workers]

    def forget(self, slot: int) -> None:
        """Drop a slot's history: a restart will not replay it (its episode was abandoned)."""
        self._history.pop(slot, None)
        self.lost.pop(slot, None)

    def broken(self, slot: int) -> str | None:
        """Why the worker of ``slot`` could not be restarted, or None while it works."""
        return self._broken.get(slot % len(self._workers))

    def revive(self) -> None:
        """Before every slot is reset (a kept pool's next rollout): start again the workers
        that died while idle or could not be restarted (counted in ``restarts``); one that
        still cannot start stays broken, its slots failing with the reason."""
        if self._finalizer.alive is False:
            raise WorkerError("the worker processes were closed")
        for w, worker in enumerate(self._workers):
            if w not in self._broken and worker.process.is_alive():
                continue
            if w not in self._broken:
                worker.kill()
            self.restarts += 1
            try:
                fresh = _Worker(self._ctx, self.factory, self._slots[w])
                fresh.ready()
            except WorkerError as err:
                self._broken[w] = f"its worker could not be restarted: {err}"
                continue
            self._workers[w] = fresh
            self._broken.pop(w, None)

    def run(self, jobs: dict[int, tuple]) -> dict[int, tuple[bool, Any]]:
        """Run each slot's job in its worker, all workers at once; see the class docstring."""
        if self._finalizer.alive is False:
            raise WorkerError("the worker processes were closed")
        self.lost = {}
        for slot, job in jobs.items():
            if job[0] == "reset":
                self._history.pop(slot, None)
        results: dict[int, tuple[bool, Any]] = {}
        pending: dict[int, list[tuple[int, tuple]]] = {}
        for slot in sorted(jobs):
            w = slot % len(self._workers)
            if w in self._broken:
                results[slot] = (False, self._broken[w])
            else:
                pending.setdefault(w, []).append((slot, jobs[slot]))
        since = {w: time.monotonic() for w in pending}
        for w, todo in pending.items():
            with contextlib.suppress(OSError):  # a worker that died idle: seen as EOF below
                self._workers[w].conn.send(todo)
        while pending:
            self._wait_round(pending, since, results)
        return results

    def _wait_round(
        self,
        pending: dict[int, list[tuple[int, tuple]]],
        since: dict[int, float],
        results: dict[int, tuple[bool, Any]],
    ) -> None:
        """Receive what is ready, or fail the slot of a worker past its deadline."""
        now = time.monotonic()
        deadline = {w: since[w] + self._budget(pending[w][0][1]) for w in pending}
        by_conn = {self._workers[w].conn: w for w in pending}
        ready = wait(list(by_conn), timeout=max(0.0, min(deadline.values()) - now))
        for conn in ready:
            w = by_conn[conn]
            try:
                slot, ok, value = conn.recv()
            except (EOFError, OSError):
                code = self._workers[w].kill()
                self._fail_and_restart(w, pending, since, results, f"worker died ({code})")
                continue
            self._accept(pending[w].pop(0)[1], slot, ok, value, results)
            since[w] = time.monotonic()
            if not pending[w]:
                del pending[w]
        answered = {by_conn[conn] for conn in ready}
        now = time.monotonic()
        for w in [w for w in pending if w not in answered]:
            if now >= deadline[w]:
                self._workers[w].kill()
                limit = self._budget(pending[w][0][1])
                message = f"timed out after {limit:g} s"
                self._fail_and_restart(w, pending, since, results, message)

    def _budget(self, job: tuple) -> float:
        """Seconds a job may take: one step timeout, one per replayed action for a replay."""
        return self.step_timeout * (1 + len(job[3]) if job[0] == "replay" else 1)

    def _accept(
        self, job: tuple, slot: int, ok: bool, value: Any, results: dict[int, tuple[bool, Any]]
    ) -> None:
        """Book one answer: the slot's history grows, or the slot leaves the live set."""
        if job[0] == "replay":
            if not ok:
                self._history.pop(slot, None)
                self.lost[slot] = f"replay after a worker restart: {value}"
            return
        if slot in self.lost:  # its state was lost in a restart: this answer means nothing
            ok, value = False, self.lost.pop(slot)
        results[slot] = (ok, value)
        if not ok:
            self._history.pop(slot, None)
        elif job[0] == "expert":  # reads the state, changes nothing
            return
        elif job[0] == "reset":
            self._history[slot] = (job[1], job[2], [])
        elif getattr(value, "done", True) is False:
            self._history[slot][2].append(job[1])
        else:
            self._history.pop(slot, None)  # done (or not a StepResult): never stepped again

    def _fail_and_restart(
        self,
        w: int,
        pending: dict[int, list[tuple[int, tuple]]],
        since: dict[int, float],
        results: dict[int, tuple[bool, Any]],
        reason: str,
    ) -> None:
        """The worker's current job failed: report it, restart, replay the others, go on."""
        (slot, job), rest = pending[w][0], pending[w][1:]
        message = f"{reason}; worker restarted"
        self._accept(job, slot, False, message, results)
        self.restarts += 1
        try:
            self._workers[w] = _Worker(self._ctx, self.factory, self._slots[w])
            self._workers[w].ready()
        except WorkerError as err:  # the worker's slots are all lost
            self._broken[w] = f"its worker could not be restarted: {err}"
            for other, other_job in rest:
                self._accept(other_job, other, False, str(err), results)
            for other in [s for s in self._slots[w] if s in self._history]:
                self._history.pop(other)
                self.lost[other] = self._broken[w]
            del pending[w]
            return
        resetting = {s for s, j in rest if j[0] == "reset"}
        replays = [
            (s, ("replay", *self._history[s][:2], list(self._history[s][2])))
            for s in self._slots[w]
            if s in self._history and s not in resetting
        ]
        todo = replays + rest
        if not todo:
            del pending[w]
            return
        pending[w] = todo
        since[w] = time.monotonic()
        self._workers[w].conn.send(todo)
