"""The server's sessions: each one an environment in a worker process, with a step timeout.

A session is one slot of a :class:`~mcgpo.envs.workers.WorkerSet` of one worker process
(``sessions_per_worker`` slots, default 1), so a session's environment gets exactly what
:meth:`EnvPool.in_workers <mcgpo.envs.pool.EnvPool.in_workers>` gives a slot: a reset or
step past ``step_timeout`` seconds, or one that kills its process, fails that call only;
the worker is restarted and the other sessions of that worker (if it holds several) are
rebuilt by replaying their actions. A session whose environment failed in any way (raised,
timed out, crashed, or lost in a restart) is ended: its trajectory is lost, and the next
request on it is answered ``410 session_ended`` naming what happened.

At most ``max_sessions`` sessions are open at once; a session left idle for
``idle_timeout`` seconds (a client that vanished) is closed by :meth:`SessionTable.reap`.
Worker processes are kept when their sessions close and reused by the next sessions, so a
process start is paid once per slot, not per episode. After :meth:`drain` (the server got
SIGTERM) no session is opened; the open ones go on until the server stops. A worker process
whose sessions have all closed is stopped after ``idle_timeout`` seconds unused (the first
one is kept), so an idle server shrinks back.

**One lock discipline.** A session's environment is used by exactly the session that opened
it: whether a session is open, busy (a request holds it) or ended is decided and changed only
under the table's lock, in the same hold as the check it depends on. A request *claims* its
session (open, not busy: then busy) before it touches the environment and checks again, under
the worker's lock, that nothing ended it meanwhile; :meth:`close` and :meth:`reap` end only a
session that is open and not busy at that moment (a lookup made before the lock is checked
again under it). A slot is given back to the free list only once no request holds its
session: by the ender when the session was idle, else by the request when it lets go. Locks
are taken in one order, a worker's lock before the table's, never the other way.

A reset that the environment refuses with a ``ValueError`` (an unknown split, a bad seed: its
caller's mistake) is answered ``400 bad_reset`` and the session stays open: reset it again.
Every stored or echoed text (why a session ended, an environment's message) is cut to
:data:`~mcgpo.envs.serving.wire.MAX_MESSAGE` characters.

Every method here blocks (worker round trips): the server calls them from threads. Calls
on different worker processes run in parallel; calls on sessions of the same worker take
turns.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mcgpo.envs.protocol import Observation, StepResult
from mcgpo.envs.serving.wire import WireError, clipped
from mcgpo.envs.workers import BadInput, WorkerError, WorkerSet

__all__ = ["EnvFailure", "Session", "SessionTable"]

_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # fullmatch: no trailing newline


class EnvFailure(RuntimeError):
    """The environment of a session failed; the session is ended.

    ``kind`` is ``error`` (it raised or returned something wrong), ``timeout`` or ``crash``
    (its worker died, or could not be restarted)."""

    STATUS: ClassVar[dict[str, int]] = {"error": 500, "crash": 502, "timeout": 504}

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(clipped(message))
        self.kind = kind
        self.status = self.STATUS[kind]
        self.code = f"env_{kind}"


def failure_kind(message: str) -> str:
    """What a WorkerSet failure message says: 'timeout', 'crash' or 'error'."""
    if message.startswith("timed out after "):
        return "timeout"
    if message.startswith(("worker died", "its worker could not be restarted")):
        return "crash"
    if message.startswith("replay after a worker restart"):
        return "crash"
    return "error"


@dataclass(eq=False)
class _Group:
    """One worker process and its slots."""

    workers: WorkerSet
    free: list[int]
    lock: threading.Lock = field(default_factory=threading.Lock)
    sessions: dict[int, Session] = field(default_factory=dict)  # slot -> session holding it
    idle_since: float = field(default_factory=time.monotonic)  # when its last session left


@dataclass(eq=False)
class Session:
    """One client's environment: a slot of a group."""

    id: str
    group: _Group
    slot: int
    max_turns: int
    state: str = "new"  # "new" (reset it first), "live", "done"
    turns: int = 0
    busy: bool = False
    last_used: float = field(default_factory=time.monotonic)


class SessionTable:
    """The open sessions of one environment; see the module docstring."""

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        env_name: str,
        options: Mapping[str, Any],
        max_sessions: int,
        sessions_per_worker: int,
        step_timeout: float,
        idle_timeout: float,
    ) -> None:
        self.factory = factory
        self.env_name = env_name
        self.options = dict(options)
        self.max_sessions = int(max_sessions)
        self.sessions_per_worker = int(sessions_per_worker)
        self.step_timeout = float(step_timeout)
        self.idle_timeout = float(idle_timeout)
        self.max_turns = 0
        self.draining = False
        self.ended: dict[str, str] = {}  # session id -> why it ended (recent ones)
        self._sessions: dict[str, Session] = {}
        self._groups: list[_Group] = []
        self._pending_slots = 0  # slots of groups being built
        self._lock = threading.Condition()

    # ------------------------------------------------------------------ lifetime
    def start(self) -> None:
        """Build the first worker (its environment is the server's check); WorkerError."""
        group = self._build_group()
        self.max_turns = group.workers.max_turns[0]
        with self._lock:
            self._groups.append(group)

    def drain(self) -> None:
        """Open no more sessions (SIGTERM); the open ones go on."""
        self.draining = True

    def shutdown(self) -> None:
        """Stop every worker process."""
        with self._lock:
            groups, self._groups = self._groups, []
            self._sessions.clear()
        for group in groups:
            group.workers.close()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "sessions": len(self._sessions),
                "busy": sum(s.busy for s in self._sessions.values()),
                "max_sessions": self.max_sessions,
                "workers": len(self._groups),
            }

    # ------------------------------------------------------------------ sessions
    def open(self, session_id: str | None = None) -> tuple[Session, bool]:
        """A new session (or the open one of that id: opening is idempotent); (session, new).

        WireError 400 for a malformed id, 409 for an id already used by an ended session,
        503 when the server is full or draining."""
        if session_id is not None and not _SESSION_ID.fullmatch(session_id):
            raise WireError(
                400, "bad_request", "field 'session': 1 to 64 letters, digits, '-' or '_'"
            )
        sid = session_id or uuid.uuid4().hex
        with self._lock:
            if sid in self._sessions:
                if self._sessions[sid].slot < 0:
                    raise WireError(409, "session_busy", f"session {sid} is being opened")
                return self._sessions[sid], False
            if sid in self.ended:
                raise WireError(409, "session_ended", f"session {sid} ended: {self.ended[sid]}")
            if self.draining:
                raise WireError(503, "draining", "the server is shutting down; no new sessions")
            if len(self._sessions) >= self.max_sessions:
                raise WireError(
                    503,
                    "server_full",
                    f"{len(self._sessions)} of {self.max_sessions} sessions are open; "
                    "close one or retry later",
                )
            placeholder = Session(sid, _Group(None, []), -1, 0)  # type: ignore[arg-type]
            self._sessions[sid] = placeholder  # holds the place while a slot is found
        try:
            group, slot = self._take_slot()
        except BaseException:
            with self._lock:
                self._sessions.pop(sid, None)
            raise
        session = Session(sid, group, slot, group.workers.max_turns[slot])
        with self._lock:
            self._sessions[sid] = session
            group.sessions[slot] = session
        return session, True

    def _take_slot(self) -> tuple[_Group, int]:
        """A free slot, building a new worker when none is free and capacity is left."""
        with self._lock:
            while True:
                for group in self._groups:
                    if group.free:
                        return group, group.free.pop()
                capacity = sum(len(g.workers.max_turns) for g in self._groups)
                if capacity + self._pending_slots < self.max_sessions:
                    self._pending_slots += self.sessions_per_worker
                    break
                self._lock.wait(1.0)  # a group being built, or a slot about to be freed
        try:
            group = self._build_group()
        except WorkerError as err:
            raise EnvFailure("error", f"building the environment failed: {err}") from None
        finally:
            with self._lock:
                self._pending_slots -= self.sessions_per_worker
                self._lock.notify_all()
        with self._lock:
            self._groups.append(group)
            slot = group.free.pop()
            self._lock.notify_all()
        return group, slot

    def _build_group(self) -> _Group:
        n = self.sessions_per_worker
        workers = WorkerSet(self.factory, n, 1, self.step_timeout)
        return _Group(workers, list(range(n - 1, -1, -1)))

    def get(self, sid: str) -> Session:
        """The open session ``sid``; WireError 404 (unknown) or 410 (ended).

        A lookup only: what it returns may be ended by the time the caller acts on it, so
        every act checks again under the lock (:meth:`_check_open`)."""
        with self._lock:
            session = self._sessions.get(sid)
            if session is not None and session.slot >= 0:
                return session
            why = self.ended.get(sid)
        if why is not None:
            raise WireError(410, "session_ended", f"session {sid} ended: {why}")
        raise WireError(404, "unknown_session", f"no session {sid!r} on this server")

    def close(self, sid: str, why: str = "closed by the client") -> None:
        """End a session and free its slot; WireError 404/410 for an unknown or ended one,
        409 while a request holds it."""
        session = self.get(sid)
        with self._lock:  # checked and ended in one hold of the lock
            self._check_open(session)
            if session.busy:
                raise WireError(409, "session_busy", f"session {sid} is answering another request")
            self._unlist(session, why)
        self._free(session)

    def reap(self) -> list[str]:
        """Close the sessions idle for more than ``idle_timeout`` seconds, and stop the worker
        processes left without a session that long (all but one); the sessions' ids."""
        now = time.monotonic()
        cutoff = now - self.idle_timeout
        with self._lock:
            idle = [
                s
                for s in self._sessions.values()
                if s.slot >= 0 and not s.busy and s.last_used < cutoff
            ]
        why = f"idle for more than {self.idle_timeout:g} s"
        reaped = [s.id for s in idle if self._end(s, why, idle_before=cutoff)]
        with self._lock:
            unused = [
                g
                for g in self._groups
                if not g.sessions
                and len(g.free) == len(g.workers.max_turns)
                and g.idle_since < cutoff
            ][: max(0, len(self._groups) - 1)]  # one worker is kept warm
            for group in unused:
                self._groups.remove(group)
        for group in unused:
            group.workers.close()
        return reaped

    def _check_open(self, session: Session) -> None:
        """Under the lock: WireError 410 unless ``session`` is still the open one of its id."""
        if self._sessions.get(session.id) is not session:
            why = self.ended.get(session.id, "closed")
            raise WireError(410, "session_ended", f"session {session.id} ended: {why}")

    def _unlist(self, session: Session, why: str) -> None:
        """Under the lock: ``session`` is ended (no request can claim it from now on)."""
        del self._sessions[session.id]
        self.ended[session.id] = clipped(why)
        while len(self.ended) > 4 * self.max_sessions:  # remember the recent ones
            del self.ended[next(iter(self.ended))]

    def _end(self, session: Session, why: str, *, idle_before: float | None = None) -> bool:
        """End ``session`` if it is still open (and, with ``idle_before``, still idle since
        then and not held); True when it was ended here. Its slot is freed now when no request
        holds the session, else by that request's :meth:`_release`."""
        with self._lock:
            if self._sessions.get(session.id) is not session:
                return False
            if idle_before is not None and (session.busy or session.last_used >= idle_before):
                return False  # a request used it since it was found idle
            self._unlist(session, why)
            held = session.busy
        if not held:
            self._free(session)
        return True

    def _free(self, session: Session) -> None:
        """Give an ended session's slot back (or retire its worker if it cannot be restarted)."""
        group = session.group
        with group.lock:
            group.workers.forget(session.slot)
        retire = False
        with self._lock:
            if group.sessions.get(session.slot) is session:
                del group.sessions[session.slot]
            if group.workers.broken(session.slot) is not None:  # its slots are unusable
                if group in self._groups:
                    self._groups.remove(group)
                retire = not group.sessions
            elif group in self._groups:
                group.free.append(session.slot)
                if not group.sessions:
                    group.idle_since = time.monotonic()
            self._lock.notify_all()
        if retire:
            group.workers.close()

    # ------------------------------------------------------------------ environment calls
    def reset(self, sid: str, seed: int, split: str) -> Observation:
        session = self._claim(sid)
        try:
            value = self._call(session, ("reset", seed, split), Observation)
            session.state, session.turns = "live", 0
            return value
        finally:
            self._release(session)

    def step(self, sid: str, action: str) -> StepResult:
        session = self._claim(sid, need="live")
        try:
            value = self._call(session, ("step", action), StepResult)
            session.turns += 1
            session.state = "done" if value.done else "live"
            return value
        finally:
            self._release(session)

    def expert(self, sid: str) -> str:
        session = self._claim(sid, need="live")
        try:
            return self._call(session, ("expert",), str)
        finally:
            self._release(session)

    def _claim(self, sid: str, need: str | None = None) -> Session:
        """The session ``sid``, now held by this request (busy); WireError 404/409/410."""
        session = self.get(sid)
        with self._lock:  # the lookup is checked again: it may have ended since
            self._check_open(session)
            if session.busy:
                raise WireError(409, "session_busy", f"session {sid} is answering another request")
            if need == "live" and session.state != "live":
                why = "reset it first" if session.state == "new" else "its episode is done"
                raise WireError(409, f"session_{session.state}", f"session {sid}: {why}")
            session.busy = True
        return session

    def _release(self, session: Session) -> None:
        """This request lets go of ``session``; frees its slot if it was ended meanwhile."""
        with self._lock:
            session.last_used = time.monotonic()
            session.busy = False
            ended = self._sessions.get(session.id) is not session
        if ended:
            self._free(session)

    def _call(self, session: Session, job: tuple, kind: type) -> Any:
        """Run one job in the session's worker; EnvFailure (session ended) if it fails,
        WireError 400 (session kept) for a reset the environment refused as bad input."""
        group = session.group
        lost_here: list[Session] = []
        with group.lock:
            with self._lock:  # ended while this request waited for the worker (a restart)?
                self._check_open(session)
            try:
                ok, value = group.workers.run({session.slot: job})[session.slot]
            except WorkerError as err:  # the workers were closed under us (shutdown)
                ok, value = False, f"its worker could not be restarted: {err}"
            with self._lock:  # sessions a restart could not rebuild end before anyone waits
                for slot, message in group.workers.lost.items():
                    other = group.sessions.get(slot)
                    if other is not None and self._sessions.get(other.id) is other:
                        self._unlist(other, f"lost in a worker restart: {message}")
                        if not other.busy:  # else its request frees it when it lets go
                            lost_here.append(other)
        for other in lost_here:
            self._free(other)
        if ok and not isinstance(value, kind):
            ok = False
            value = f"TypeError: {job[0]} returned {type(value).__name__}, not {kind.__name__}"
        if not ok and job[0] == "reset" and isinstance(value, BadInput):
            session.state = "new"  # the worker and its environment go on: reset again
            raise WireError(400, "bad_reset", clipped(f"reset: {value}"))
        if not ok:
            phase = f"{job[0]} turn {session.turns + 1}" if job[0] == "step" else job[0]
            message = clipped(f"{phase}: {value}")
            self._end(session, message)
            raise EnvFailure(failure_kind(str(value)), message)
        return value
