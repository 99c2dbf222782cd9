"""EnvPool.in_workers: the same batch as in process; a hang, raise or crash costs one slot."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest
from pool_fakes import FaultSpec, ForkingSpec

from mcgpo.envs.pool import EnvPool, PoolError
from mcgpo.envs.workers import EnvSpec, WorkerError

N = 8
SEEDS = [100 + i for i in range(N)]  # one task per slot, so a fault keyed by seed hits one slot
FAULTY = 5  # worker 1 of 2 holds slots 1, 3, 5, 7: slots 1, 3 step before 5 in a round, 7 after
TURN = 3


def run(pool: EnvPool, seeds: list[int]) -> dict[int, list]:
    """Random admissible play (one RNG per slot); each slot's records in order."""
    first = pool.reset(seeds, "train")
    records: dict[int, list] = {i: [obs] for i, obs in enumerate(first) if obs is not None}
    current = {i: obs for i, obs in enumerate(first) if obs is not None}
    rngs = [random.Random(i) for i in range(len(seeds))]
    while pool.live():
        actions = {i: rngs[i].choice(current[i].admissible_actions) for i in pool.live()}
        for i, res in pool.step(actions).items():
            records[i].append(res)
            current[i] = res.observation
    return records


@pytest.fixture(scope="module")
def clean() -> dict[int, list]:
    return run(EnvPool([FaultSpec()() for _ in range(N)]), SEEDS)


def gone(pid: int) -> bool:
    """No process and no zombie with this id (a zombie keeps its /proc entry)."""
    return not Path(f"/proc/{pid}").exists() if sys.platform == "linux" else True


def test_workers_give_the_in_process_records_and_stats(clean):
    with EnvPool.in_workers(EnvSpec("household"), N, workers=3) as pool:
        assert len(pool) == N and pool.envs is None and pool.max_turns == [50] * N
        assert run(pool, SEEDS) == clean
        here = EnvPool([FaultSpec()() for _ in range(N)])
        run(here, SEEDS)
        assert pool.stats() == here.stats()
        assert pool.stats()["worker_restarts"] == 0.0
        assert len(pool.processes()) == 3
        # a second batch on the same workers
        assert run(pool, SEEDS) == clean


# kind -> the error after "step turn 3: ", and whether the worker is replaced
FAULTS = {
    "raise": ("RuntimeError: simulated fault at seed 105 turn 3", False),
    "hang": ("timed out after 3 s; worker restarted", True),
    "exit": ("worker died (exit code 3); worker restarted", True),
    "segfault": ("worker died (exit code -11); worker restarted", True),
}


@pytest.mark.parametrize("kind", list(FAULTS))
def test_a_fault_costs_its_slot_only(clean, kind):
    message, restarted = FAULTS[kind]
    spec = FaultSpec({(SEEDS[FAULTY], TURN): kind})
    with EnvPool.in_workers(spec, N, workers=2, step_timeout=3.0) as pool:
        before = [p.pid for p in pool.processes()]
        records = run(pool, SEEDS)
        after = [p.pid for p in pool.processes()]
        assert pool.errored == [i == FAULTY for i in range(N)]
        assert pool.errors == {FAULTY: f"step turn {TURN}: {message}"}
        # kept up to the failure; the first observation and TURN - 1 steps
        assert records[FAULTY] == clean[FAULTY][:TURN]
        for i in range(N):
            if i != FAULTY:
                assert records[i] == clean[i], i
        stats = pool.stats()
        assert (stats["errored"], stats["step_errors"], stats["reset_errors"]) == (1, 1, 0)
        assert stats["done"] == N - 1 and stats["worker_restarts"] == float(restarted)
        assert after[0] == before[0]  # the other worker was never touched
        assert (after[1] != before[1]) == restarted
        assert all(p.is_alive() for p in pool.processes())
        if restarted:
            assert gone(before[1])
        if kind != "hang":  # (a hang would cost its timeout again)
            # the next batch starts clean on the new worker (and meets the fault again)
            assert run(pool, SEEDS) == records and list(pool.errors) == [FAULTY]


def test_two_faults_in_one_worker_and_a_hanging_reset(clean):
    faults = {(SEEDS[1], 2): "exit", (SEEDS[7], 2): "hang", (SEEDS[4], 0): "hang"}
    with EnvPool.in_workers(FaultSpec(faults), N, workers=2, step_timeout=3.0) as pool:
        records = run(pool, SEEDS)
        assert sorted(pool.errors) == [1, 4, 7]
        assert pool.errors[4] == "reset seed 104: timed out after 3 s; worker restarted"
        assert pool.errors[1] == "step turn 2: worker died (exit code 3); worker restarted"
        assert pool.errors[7] == "step turn 2: timed out after 3 s; worker restarted"
        assert 4 not in records and records[1] == clean[1][:2] and records[7] == clean[7][:2]
        for i in (0, 2, 3, 5, 6):
            assert records[i] == clean[i], i
        stats = pool.stats()
        assert (stats["reset_errors"], stats["step_errors"], stats["worker_restarts"]) == (1, 2, 3)


def test_a_worker_killed_while_idle_costs_the_slot_it_steps_first(clean):
    with EnvPool.in_workers(EnvSpec("household"), N, workers=2) as pool:
        rngs = [random.Random(i) for i in range(N)]
        first = pool.reset(SEEDS, "train")
        current = dict(enumerate(first))
        records = {i: [obs] for i, obs in current.items()}
        pool.processes()[0].kill()  # worker 0 holds slots 0, 2, 4, 6
        while pool.live():
            actions = {i: rngs[i].choice(current[i].admissible_actions) for i in pool.live()}
            for i, res in pool.step(actions).items():
                records[i].append(res)
                current[i] = res.observation
        assert pool.errors == {0: "step turn 1: worker died (exit code -9); worker restarted"}
        assert all(records[i] == clean[i] for i in range(1, N))


def test_a_replay_that_fails_marks_its_slot_errored(clean, monkeypatch):
    spec = FaultSpec({(SEEDS[FAULTY], TURN): "exit"})
    with EnvPool.in_workers(spec, N, workers=2) as pool:
        monkeypatch.setenv("POOL_FAKES_FAIL_RESETS", f"{SEEDS[1]},{SEEDS[7]}")
        records = run(pool, SEEDS)  # slot 1 stepped before slot 5 in the round, slot 7 after
    refused = "replay after a worker restart: RuntimeError: reset of seed {} refused"
    assert pool.errors == {
        1: f"after step turn {TURN}: " + refused.format(SEEDS[1]),
        5: f"step turn {TURN}: worker died (exit code 3); worker restarted",
        7: f"step turn {TURN}: " + refused.format(SEEDS[7]),
    }
    # slot 1's third step was returned before its state was lost; slot 7's was not
    assert records[1] == clean[1][: TURN + 1] and records[7] == clean[7][:TURN]
    assert all(records[i] == clean[i] for i in (0, 2, 3, 4, 6))
    assert pool.stats()["step_errors"] == 3


def test_close_stops_every_worker_and_leaves_no_zombie():
    pool = EnvPool.in_workers(EnvSpec("household"), 4, workers=2)
    processes = pool.processes()
    assert all(p.is_alive() for p in processes)
    pool.close()
    assert all(p.exitcode is not None for p in processes)
    assert all(gone(p.pid) for p in processes)
    pool.close()  # twice is fine
    with pytest.raises(WorkerError, match="the worker processes were closed"):
        pool.reset([0, 1, 2, 3], "train")
    with EnvPool.in_workers(EnvSpec("household"), 2, workers=4) as small:  # one slot each
        processes = small.processes()
        assert len(processes) == 2
    assert all(gone(p.pid) for p in processes)


def test_a_factory_that_cannot_build_or_be_sent_is_one_line():
    with pytest.raises(
        WorkerError, match=r"^building an environment in a worker failed: OSError: no game files"
    ):
        EnvPool.in_workers(FaultSpec(fail_build=True), 2, workers=2)
    with pytest.raises(WorkerError, match=r"cannot be sent to a worker process \(use .*EnvSpec"):
        EnvPool.in_workers(lambda: FaultSpec()(), 2, workers=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_envs": 0}, r"needs at least one environment, got n_envs=0"),
        ({"workers": 0}, r"workers must be an integer >= 1, got 0"),
        ({"workers": True}, r"workers must be an integer >= 1, got True"),
        ({"step_timeout": 0}, r"step_timeout must be a finite number > 0, got 0"),
        ({"step_timeout": math.inf}, r"step_timeout must be a finite number > 0, got inf"),
        ({"step_timeout": "5"}, r"step_timeout must be a finite number > 0, got '5'"),
    ],
)
def test_bad_sizes_are_refused_before_any_process_starts(kwargs, message):
    args = {"n_envs": 2, "workers": 1, "step_timeout": 5.0, **kwargs}
    n = args.pop("n_envs")
    with pytest.raises(PoolError, match=message):
        EnvPool.in_workers(EnvSpec("household"), n, **args)


def test_env_spec_builds_like_make_env_and_in_process_pools_close_quietly():
    env = EnvSpec("household", {"max_turns": 7})()
    assert env.max_turns == 7
    with EnvPool([env]) as pool:
        assert pool.processes() == [] and pool.max_turns == [7]


@pytest.mark.slow
def test_environments_in_workers_may_start_processes_of_their_own():
    """ALFWorld's generated games check a new game in a child process: a worker (not a
    daemon for that reason) lets its environments start one, at every reset."""
    with EnvPool.in_workers(ForkingSpec(), 2, workers=1) as pool:
        for seeds in ([0, 1], [2, 3]):
            assert all(obs is not None for obs in pool.reset(seeds, "train")), pool.errors
