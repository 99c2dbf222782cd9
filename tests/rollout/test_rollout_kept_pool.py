"""collect(pool=...): one pool kept across consecutive rollouts gives the rollouts of fresh
pools (every slot is reset; an environment is fully defined by reset(seed, split)), in
process and in worker processes, also after an errored slot, a worker that died in a step
and one that died between rollouts. With ``overlap_env`` too."""

from __future__ import annotations

import pytest
from rollout_fakes import CounterEnv, CounterSpec
from test_rollout_overlap import assert_same_rollout

from mcgpo.envs import make_env
from mcgpo.envs.workers import EnvSpec
from mcgpo.policy import load_policy
from mcgpo.rollout import CollectOptions, collect
from mcgpo.rollout.group_rollout import open_pool

N = 2
ROLLOUTS = 3  # consecutive rollouts, each on the next tasks (as the training loop plays)


@pytest.fixture(scope="module")
def household_policy(micro_model):
    return load_policy(micro_model)


def options(**kw):
    base = {"split": "train", "temperature": 1.0, "history": 2, "max_new_tokens": 8}
    return CollectOptions(group_size=N, **{**base, **kw})


def consecutive(policy, factory, opts, tasks_of, *, kept: bool, between=None):
    """``ROLLOUTS`` rollouts of ``tasks_of(r)``; one kept pool or a fresh pool for each."""
    n_env = len(tasks_of(0)) * N
    pool = open_pool(factory, n_env, opts) if kept else None
    out = []
    try:
        for r in range(ROLLOUTS):
            out.append(collect(*policy, factory, tasks_of(r), opts, pool=pool))
            if between is not None and pool is not None:
                between(pool)
    finally:
        if pool is not None:
            pool.close()
    return out


def assert_same_rollouts(fresh, kept, ignore=()):
    for a, b in zip(fresh, kept, strict=True):
        assert len(a.table) > 0
        for name in ignore:  # a kept pool counts a restart the fresh pool never needed
            a.stats.pop(name, None), b.stats.pop(name, None)
        assert_same_rollout(a, b)


@pytest.mark.parametrize("env", ["household", "webshop"])
@pytest.mark.parametrize("overlap", [False, True])
def test_a_kept_in_process_pool_plays_as_fresh_pools(household_policy, env, overlap):
    spec = EnvSpec(env)
    make_env(env)  # built here: the environment exists in this installation
    opts = options(seed=4, overlap_env=overlap, overlap_pieces=3)
    # the same task again in rollout 2: a reset after another episode of it
    tasks_of = [[0, 5], [7, 1], [0, 2]].__getitem__
    fresh = consecutive(household_policy, spec, opts, tasks_of, kept=False)
    kept = consecutive(household_policy, spec, opts, tasks_of, kept=True)
    assert_same_rollouts(fresh, kept)


def test_a_kept_pool_with_an_errored_slot_plays_as_fresh_pools(counter_policy):
    """Task 4 fails at its second turn in every rollout that plays it: the slot is reset
    and plays again in the next rollout."""
    factory = lambda: CounterEnv(fail_seed=4, fail_turn=2)  # noqa: E731
    tasks_of = [[4, 1], [2, 4], [0, 3]].__getitem__
    opts = options(seed=1)
    fresh = consecutive(counter_policy, factory, opts, tasks_of, kept=False)
    kept = consecutive(counter_policy, factory, opts, tasks_of, kept=True)
    assert fresh[0].errors and fresh[1].errors
    assert_same_rollouts(fresh, kept)


@pytest.mark.slow
def test_a_kept_worker_pool_plays_as_fresh_pools_through_worker_deaths(counter_policy):
    """Task 1's environment exits its worker at turn 2 (the worker is restarted, its other
    slots replayed); between rollouts a worker is killed while idle: the next reset starts
    it again. The rollouts stay those of fresh pools."""
    factory = CounterSpec(exit_seed=1, exit_turn=2)
    tasks_of = [[1, 0], [2, 1], [3, 5]].__getitem__
    opts = options(seed=2, workers=2, overlap_env=True)
    fresh = consecutive(counter_policy, factory, opts, tasks_of, kept=False)
    killed: list[int] = []
    restarts: list[float] = []

    def kill_one(pool):
        restarts.append(pool.stats()["worker_restarts"])
        assert not set(killed) & {p.pid for p in pool.processes()}  # started again
        process = pool.processes()[len(killed) % 2]
        process.kill()
        process.join()
        killed.append(process.pid)

    kept = consecutive(counter_policy, factory, opts, tasks_of, kept=True, between=kill_one)
    assert fresh[0].errors and fresh[1].errors  # the exits cost their trajectories
    # task 1's two siblings (one per worker) exit; the idle death and both exits; the death
    assert restarts == [2, 3, 1]
    assert_same_rollouts(fresh, kept)


def test_a_pool_of_another_size_is_refused(counter_policy):
    needs = r"^pool has 3 environments, the rollout needs 4$"
    with open_pool(CounterEnv, 3, options()) as pool, pytest.raises(ValueError, match=needs):
        collect(*counter_policy, CounterEnv, [0, 1], options(), pool=pool)
