"""The session table's lock discipline, under injected interleavings: a pause stands in for a
thread switch between a check and the act that depends on it (a step's lookup and its claim,
the reaper's idle scan and its end, a close's check and its end), and the other side of the
race runs inside that pause. A session's environment is used by the session that opened it
only; a close and a step of one session never both succeed; a session used during the
reaper's pause is not reaped. Also: a bad reset is the client's mistake (the session stays
usable), stored reasons are cut, idle worker processes are stopped."""

from __future__ import annotations

import threading
import time

import pytest

from mcgpo.envs import make_env
from mcgpo.envs.serving.sessions import SessionTable
from mcgpo.envs.serving.wire import MAX_MESSAGE, WireError
from mcgpo.envs.workers import EnvSpec

pytestmark = pytest.mark.serve
WAIT = 120.0  # seconds: wide margins for a busy 2-core machine (never a speed assertion)


def table_of(max_sessions: int = 1, idle_timeout: float = 600.0) -> SessionTable:
    table = SessionTable(
        EnvSpec("household"),
        env_name="household",
        options={},
        max_sessions=max_sessions,
        sessions_per_worker=1,
        step_timeout=60.0,
        idle_timeout=idle_timeout,
    )
    table.start()
    return table


class Pause:
    """Called at a patched point: holds the thread named ``who`` there until :meth:`release`."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.reached = threading.Event()
        self.go = threading.Event()

    def __call__(self) -> None:
        if threading.current_thread().name == self.who:
            self.reached.set()
            assert self.go.wait(WAIT)

    def release(self) -> None:
        self.go.set()


def outcome(fn, *args, **kwargs):
    """What ``fn`` returned, or the exception it raised."""
    try:
        return fn(*args, **kwargs)
    except Exception as err:  # the test inspects it
        return err


def run_as(name: str, fn, *args) -> tuple[threading.Thread, dict]:
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(value=outcome(fn, *args)), name=name)
    thread.start()
    return thread, box


def wait_paused_or_done(pause: Pause, thread: threading.Thread) -> None:
    deadline = time.monotonic() + WAIT
    while not pause.reached.is_set() and thread.is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_step_whose_session_closes_during_its_lookup_never_runs_on_the_next_session():
    table = table_of(max_sessions=1)  # the next session gets the closed one's slot
    try:
        a = table.open()[0].id
        table.reset(a, 0, "train")
        pause, lookup = Pause("racer"), table.get

        def get(sid):  # the step's lookup, then a thread switch
            session = lookup(sid)
            pause()
            return session

        table.get = get
        racer, box = run_as("racer", table.step, a, "look")
        assert pause.reached.wait(WAIT)
        table.close(a)  # meanwhile: A closes, B opens on the same slot and resets seed 1
        b = table.open()[0].id
        local = make_env("household")
        assert table.reset(b, 1, "train") == local.reset(seed=1)
        pause.release()
        racer.join(WAIT)
        err = box["value"]
        assert isinstance(err, WireError) and (err.status, err.code) == (410, "session_ended")
        action = local.expert_action()  # B's environment is where B left it: turn 1 of seed 1
        assert table.step(b, action) == local.step(action)
    finally:
        table.shutdown()


def test_a_close_and_a_step_of_one_session_never_both_succeed():
    table = table_of(max_sessions=1)
    try:
        a = table.open()[0].id
        table.reset(a, 0, "train")
        pause, end = Pause("closer"), table._end

        def paused_end(*args, **kwargs):  # the close checked 'not busy', then a thread switch
            pause()
            return end(*args, **kwargs)

        table._end = paused_end
        closer, closed = run_as("closer", table.close, a)
        wait_paused_or_done(pause, closer)
        stepped = outcome(table.step, a, "look")  # the step slips in
        pause.release()
        closer.join(WAIT)
        results = [closed["value"], stepped]
        assert sum(not isinstance(r, WireError) for r in results) == 1, results
        assert table.stats()["sessions"] == 0 and table.stats()["busy"] == 0
    finally:
        table.shutdown()


def test_a_session_used_while_the_reaper_pauses_is_not_reaped():
    table = table_of(max_sessions=2, idle_timeout=0.2)
    try:
        a = table.open()[0].id
        local = make_env("household")
        assert table.reset(a, 3, "train") == local.reset(seed=3)
        time.sleep(0.5)  # idle past the timeout
        pause, end = Pause("reaper"), table._end

        def paused_end(*args, **kwargs):  # the reaper found A idle, then a thread switch
            pause()
            return end(*args, **kwargs)

        table._end = paused_end
        reaper, reaped = run_as("reaper", table.reap)
        assert pause.reached.wait(WAIT)
        action = local.expert_action()
        assert table.step(a, action) == local.step(action)  # A is used: no longer idle
        pause.release()
        reaper.join(WAIT)
        assert reaped["value"] == []
        action = local.expert_action()
        assert table.step(a, action) == local.step(action)  # still open, still A's episode
    finally:
        table.shutdown()


def test_an_unknown_split_is_the_clients_mistake_and_the_session_stays_usable():
    table = table_of(max_sessions=1)
    try:
        a = table.open()[0].id
        with pytest.raises(WireError) as caught:
            table.reset(a, 0, "no_such_split")
        assert (caught.value.status, caught.value.code) == (400, "bad_reset")
        assert "unknown split 'no_such_split'" in caught.value.message
        with pytest.raises(WireError, match="reset it first"):
            table.step(a, "look")
        assert table.reset(a, 2, "train") == make_env("household").reset(seed=2)
        assert table.stats()["workers"] == 1  # the worker was not restarted or replaced
    finally:
        table.shutdown()


def test_the_stored_reason_a_session_ended_is_cut():
    table = table_of(max_sessions=1)
    try:
        a = table.open()[0].id
        table.close(a, "x" * (1 << 20))
        assert len(table.ended[a]) < MAX_MESSAGE + 40
        with pytest.raises(WireError) as caught:
            table.get(a)
        assert caught.value.status == 410 and len(caught.value.message) < MAX_MESSAGE + 40
    finally:
        table.shutdown()


def test_idle_worker_processes_are_stopped_after_the_idle_timeout_but_one():
    table = table_of(max_sessions=3, idle_timeout=0.2)
    try:
        ids = [table.open()[0].id for _ in range(3)]
        assert table.stats()["workers"] == 3
        processes = [p for g in table._groups for p in g.workers.processes()]
        for sid in ids:
            table.close(sid)
        assert table.stats()["workers"] == 3  # kept for the next sessions, for now
        time.sleep(0.5)
        table.reap()
        assert table.stats()["workers"] == 1
        kept = table._groups[0].workers.processes()
        stopped = [p for p in processes if p not in kept]
        assert len(stopped) == 2
        for process in stopped:
            process.join(WAIT)
            assert not process.is_alive()
        assert all(p.is_alive() for p in kept)
        sid = table.open()[0].id  # the kept worker serves, a new one starts as needed
        assert table.reset(sid, 0, "train") == make_env("household").reset(seed=0)
    finally:
        table.shutdown()
