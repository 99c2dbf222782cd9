"""Faults and load on loopback: a hung step (timed out, its session ended, the others
served), a crash, the server killed in the middle of a rollout (the lost trajectories
counted, the recorded rows kept, the next rollout on a new server plays), SIGTERM (the step
in flight finishes, no new session), and 1,000 steps from 64 concurrent sessions."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from pool_fakes import FaultSpec  # noqa: E402

from mcgpo.envs import make_env  # noqa: E402
from mcgpo.envs.serving.client import (  # noqa: E402
    EnvCrashed,
    EnvServerError,
    EnvStepTimeout,
    RemoteEnv,
    RemoteEnvError,
)
from mcgpo.envs.serving.launch import ServedEnv  # noqa: E402
from mcgpo.envs.workers import EnvSpec  # noqa: E402

pytestmark = pytest.mark.serve
HERE = Path(__file__).parent
WAIT = 120.0  # seconds: wide margins for a busy 2-core machine (never a speed assertion)


def test_a_hung_step_times_out_ends_its_session_and_others_are_served():
    faults = {(5, 2): "hang"}
    with ServedEnv(FaultSpec(faults), "fault", step_timeout=10, max_sessions=4) as url:
        hung, other, local = RemoteEnv(url, "fault"), RemoteEnv(url, "fault"), make_env("household")
        hung.reset(seed=5)
        hung.step("look")
        hung_sid = hung._session
        assert other.reset(seed=1) == local.reset(seed=1)  # its worker is up before the hang
        outcome: dict[str, object] = {}
        other_done = threading.Event()

        def hang() -> None:
            try:
                hung.step("look")
            except EnvServerError as err:
                outcome["error"] = err
            outcome["other_done_first"] = other_done.is_set()

        thread = threading.Thread(target=hang)
        thread.start()
        try:
            for _ in range(3):  # served while the other session's step hangs
                action = local.expert_action()
                assert other.step(action) == local.step(action)
            other_done.set()
        finally:
            thread.join(WAIT)
        assert isinstance(outcome["error"], EnvStepTimeout)
        assert str(outcome["error"]) == (
            "env_timeout: step turn 2: timed out after 10 s; worker restarted"
        )
        assert outcome["other_done_first"] is True
        r = httpx.post(f"{url}/v1/sessions/{hung_sid}/step", json={"action": "look"})
        assert r.status_code == 410 and "timed out after 10 s" in r.json()["error"]["message"]
        with pytest.raises(RemoteEnvError, match="step before reset"):
            hung.step("look")  # the client knows its session ended
        assert hung.reset(seed=1) == local.reset(seed=1)  # a new session plays


@pytest.mark.parametrize(
    ("kind", "error", "message"),
    [
        ("exit", EnvCrashed, "env_crash: step turn 1: worker died (exit code 3); worker restarted"),
        ("raise", EnvServerError, "env_error: step turn 1: RuntimeError: simulated fault at seed 6 turn 1"),
    ],
)  # fmt: skip
def test_a_failing_step_costs_its_session_only(kind, error, message):
    with ServedEnv(FaultSpec({(6, 1): kind}), "fault", max_sessions=4) as url:
        bad, good, local = RemoteEnv(url, "fault"), RemoteEnv(url, "fault"), make_env("household")
        bad.reset(seed=6)
        assert good.reset(seed=2) == local.reset(seed=2)
        with pytest.raises(error) as caught:
            bad.step("look")
        assert str(caught.value) == message
        action = local.expert_action()
        assert good.step(action) == local.step(action)
        assert httpx.get(f"{url}/health").json()["sessions"] == 1


def test_sessions_sharing_a_worker_survive_its_crash_by_replay():
    """Two sessions in one worker process: one crashes it, the other is rebuilt (EnvPool's
    replay) and goes on exactly as the local environment."""
    with ServedEnv(FaultSpec({(8, 3): "exit"}), "fault", sessions_per_worker=2) as url:
        bad, good, local = RemoteEnv(url, "fault"), RemoteEnv(url, "fault"), make_env("household")
        assert httpx.get(f"{url}/health").json()["workers"] == 1
        bad.reset(seed=8)
        assert good.reset(seed=4) == local.reset(seed=4)
        crashed = []
        for turn in range(5):
            action = local.expert_action()
            assert good.step(action) == local.step(action)
            if turn < 3:
                try:
                    bad.step("look")
                except EnvCrashed:
                    crashed.append(turn)
        assert crashed == [2]  # its third step killed the worker the two sessions share
        assert httpx.get(f"{url}/health").json()["workers"] == 1


def start_server(*args: str) -> tuple[subprocess.Popen, str]:
    """`mcgpo env serve --env household --port 0 ...` in a process; (process, url)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcgpo", "env", "serve", "--env", "household", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()  # "serving household on http://127.0.0.1:PORT"
    if not line.startswith("serving household on http://127.0.0.1:"):
        proc.kill()
        raise AssertionError(f"server did not start: {line!r} {proc.stderr.read()}")
    return proc, line.split()[-1]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(WAIT)
    proc.stdout.close()
    proc.stderr.close()


class KillingEnv:
    """A remote env whose K-th step (over all of them) first kills the server."""

    concurrent_steps = True
    count = 0
    lock = threading.Lock()

    def __init__(self, url: str, proc: subprocess.Popen | None, kill_at: int) -> None:
        self.env = RemoteEnv(url, "household", retries=1)
        self.max_turns = self.env.max_turns
        self.proc, self.kill_at = proc, kill_at

    def reset(self, seed: int = 0, split: str = "train"):
        return self.env.reset(seed=seed, split=split)

    def step(self, action: str):
        with KillingEnv.lock:
            KillingEnv.count += 1
            if self.proc is not None and KillingEnv.count == self.kill_at:
                self.proc.kill()
                self.proc.wait(WAIT)
        return self.env.step(action)

    def expert_action(self) -> str:
        return self.env.expert_action()

    def close(self) -> None:
        self.env.close()


@pytest.mark.slow
def test_the_server_killed_mid_rollout_costs_the_live_trajectories_only():
    from mcgpo.policy import build_tiny_policy
    from mcgpo.rollout import CollectOptions, collect, environment_corpus

    model, tok = build_tiny_policy(
        environment_corpus(("household",), episodes=4), seed=0, hidden_size=32, num_layers=1,
        num_heads=2, num_kv_heads=1,
    )  # fmt: skip
    options = CollectOptions(
        group_size=2, split="train", temperature=1.0, history=1, max_turns=4,
        max_new_tokens=12, seed=3, response_format="action",
    )  # fmt: skip
    tasks = [0, 1, 2, 3]
    reference = collect(model, tok, EnvSpec("household"), tasks, options)
    assert len(reference.table) == 32  # 4 tasks x 2 siblings x 4 turns, none errored
    proc, url = start_server()
    try:
        KillingEnv.count = 0
        out = collect(model, tok, lambda: KillingEnv(url, proc, kill_at=12), tasks, options)
    finally:
        stop(proc)
    ref = reference.table.to_records()
    got = out.table.to_records()
    errored = {int(e) for e in out.errors}
    assert errored and out.stats["errored_trajectories"] == len(errored)
    assert all("EnvServerLost" in m for m in out.errors.values()), out.errors
    for e in range(8):  # nothing recorded is lost: every row kept is the reference's row
        mine = [
            {k: v for k, v in r.items() if k not in ("errored",)} for r in got if r["traj"] == e
        ]
        theirs = [
            {k: v for k, v in r.items() if k not in ("errored",)} for r in ref if r["traj"] == e
        ]
        if e in errored:
            assert len(mine) < len(theirs)
            strip = ("success", "score")  # the trajectory's outcome is unknown
            assert [{k: v for k, v in r.items() if k not in strip} for r in mine] == [
                {k: v for k, v in r.items() if k not in strip} for r in theirs[: len(mine)]
            ]
        else:
            assert mine == theirs
    assert len(got) >= 8  # turn 1 (8 steps) finished before step 12 (in turn 2) began
    # training goes on: the next rollout, on a new server, plays in full
    with ServedEnv(EnvSpec("household"), "household", max_sessions=8) as new_url:
        again = collect(model, tok, lambda: KillingEnv(new_url, None, 0), tasks, options)
    assert again.errors == {} and again.table.to_records() == ref


def test_sigterm_finishes_the_step_in_flight_and_opens_no_session():
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "from pool_fakes import FaultSpec\n"
        "from mcgpo.envs.serving.launch import serve\n"
        "sys.exit(serve('fault', {}, port=0, factory=FaultSpec({(4, 1): 'slow'}),"
        " announce=lambda url: print(url, flush=True)))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read()
        env, local = RemoteEnv(url, "fault"), make_env("household")
        assert env.reset(seed=4) == local.reset(seed=4)
        result: dict[str, object] = {}
        thread = threading.Thread(target=lambda: result.update(res=env.step("look")))
        thread.start()
        deadline = time.monotonic() + WAIT
        while httpx.get(f"{url}/health").json()["busy"] == 0:  # the step is in flight
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        thread.join(WAIT)
        assert result["res"] == local.step("look")  # the step in flight finished
        with pytest.raises(EnvServerError, match=r"draining|Connect"):
            RemoteEnv(url, "fault", retries=0).reset(seed=0)  # refused, or nobody listens
        # the workers are stopped; uvicorn then ends the process by the signal it caught
        assert proc.wait(WAIT) in (0, -signal.SIGTERM)
    finally:
        stop(proc)


def test_1000_steps_from_64_concurrent_sessions_without_error():
    sessions, steps_each = 64, 16  # 64 x 16 = 1,024 steps
    with ServedEnv(
        EnvSpec("household"), "household", max_sessions=sessions, sessions_per_worker=8
    ) as url:
        ready = threading.Barrier(sessions + 1, timeout=WAIT)
        logs: dict[int, list] = {}
        errors: list[BaseException] = []

        def play(i: int) -> None:
            try:
                env, rng, log = RemoteEnv(url, "household"), random.Random(i), []
                obs = env.reset(seed=i)
                ready.wait()
                episodes, taken = [(i, obs, log)], 0
                while taken < steps_each:
                    action = rng.choice(obs.admissible_actions)
                    res = env.step(action)
                    log.append((action, res))
                    taken += 1
                    obs = res.observation
                    if res.done:
                        seed = 1000 + i * steps_each + taken
                        log = []
                        obs = env.reset(seed=seed)
                        episodes.append((seed, obs, log))
                logs[i] = episodes
                env.close()
            except BaseException as err:  # collected; the test fails below naming it
                errors.append(err)
                ready.abort()

        threads = [threading.Thread(target=play, args=(i,)) for i in range(sessions)]
        for t in threads:
            t.start()
        ready.wait()  # every session is open and reset
        assert httpx.get(f"{url}/health").json()["sessions"] == sessions
        for t in threads:
            t.join(WAIT * 3)
        assert errors == []
        total = sum(len(log) for eps in logs.values() for _, _, log in eps)
        assert total == sessions * steps_each >= 1000
        local = make_env("household")
        for episodes in logs.values():  # every answer was the right one
            for seed, obs, log in episodes:
                assert local.reset(seed=seed) == obs
                for action, res in log:
                    assert local.step(action) == res
        assert httpx.get(f"{url}/health").json()["sessions"] == 0
