"""A run keeps its environment pools across rollouts (training/env_pools.py): worker
processes start once per run and role (training rollouts, evaluation), never per rollout,
and none is left running when the run ends, also on an error or Ctrl-C; the run learns
what a run with a pool per rollout learns."""

from __future__ import annotations

import multiprocessing

import pytest
import torch
from safetensors.torch import load_file

from mcgpo.cli import main
from mcgpo.training import env_pools, trainer
from mcgpo.training.env_pools import RunPools
from mcgpo.training.metrics import read_metrics

# 3 updates, an evaluation after each: 3 training rollouts and 4 evaluations per run
ARGS = ("--train.updates", "3", "--eval.tasks", "2", "--eval.every", "1", "--threads", "1")
ARGS += ("--deterministic", "--env.workers", "1", "--train.save_every", "0")


@pytest.fixture
def opened(monkeypatch):
    """The roles whose pool was built, in order."""
    built: list[int] = []
    real = env_pools.open_pool

    def counting(make_env, n_env, options):
        built.append(n_env)
        return real(make_env, n_env, options)

    monkeypatch.setattr(env_pools, "open_pool", counting)
    return built


@pytest.mark.slow
@pytest.mark.parametrize("lag", ["0", "1"])
def test_worker_pools_start_once_per_run_and_stop_at_its_end(smoke_args, tmp_path, opened, lag):
    assert main(smoke_args(tmp_path / "kept", *ARGS, "--train.async_lag", lag)) == 0
    assert sorted(opened) == [2, 8]  # 2 tasks x 4 siblings; 2 evaluation episodes
    assert multiprocessing.active_children() == []
    records = read_metrics(tmp_path / "kept" / "metrics.jsonl")
    assert sum("eval/success" in r for r in records) == 4


@pytest.mark.slow
def test_kept_pools_learn_what_pools_per_rollout_learn(smoke_args, tmp_path, monkeypatch):
    assert main(smoke_args(tmp_path / "kept", *ARGS)) == 0

    class PoolPerRollout(RunPools):  # the old way: a pool per collect
        def lease(self, role, make_env, n_env, options):
            return env_pools.open_pool(make_env, n_env, options)

    monkeypatch.setattr(trainer, "setup_run", _with_pools(trainer.setup_run, PoolPerRollout))
    assert main(smoke_args(tmp_path / "fresh", *ARGS)) == 0
    a, b = (load_file(str(tmp_path / d / "model" / "model.safetensors")) for d in ("kept", "fresh"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    def outcomes(folder):
        keys = ("rollout/success_rate", "eval/success", "adv/std")
        return [{k: r[k] for k in keys if k in r} for r in read_metrics(folder / "metrics.jsonl")]

    assert outcomes(tmp_path / "kept") == outcomes(tmp_path / "fresh")


def _with_pools(setup_run, pools):
    def setup(*args, **kwargs):
        run = setup_run(*args, **kwargs)
        run.env_pools = pools()
        return run

    return setup


@pytest.mark.slow
@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_no_worker_is_left_after_an_interrupted_run(smoke_args, tmp_path, monkeypatch, error):
    real = trainer.update_policy
    calls: list[int] = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the pools are open: two rollouts and evaluations so far
            raise error("stopped")
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "update_policy", failing)
    try:  # the command line answers Ctrl-C with its exit code
        code = main(smoke_args(tmp_path / "run", *ARGS))
    except error:
        code = None
    assert code != 0 and len(calls) == 2
    assert multiprocessing.active_children() == []


def test_a_closed_set_of_pools_refuses_a_lease():
    pools = RunPools()
    pools.close()
    with pytest.raises(RuntimeError, match="closed"), pools.lease("train", None, 1, None):
        pass
    role = r"^role must be one of train, eval; got 'x'$"
    with pytest.raises(ValueError, match=role), pools.lease("x", None, 1, None):
        pass


class _Env:
    max_turns = 3
    closed = 0

    def reset(self, seed=0, split="train"):
        raise NotImplementedError

    def step(self, action):
        raise NotImplementedError

    def close(self):
        type(self).closed += 1


class _ServedEnv(_Env):
    concurrent_steps = True  # as RemoteEnv: one server session per environment
    closed = 0


def _options(workers=0):
    from mcgpo.rollout import CollectOptions

    return CollectOptions(group_size=1, split="train", temperature=1.0, history=0, workers=workers)


def test_a_pool_is_kept_per_role_and_a_served_one_per_rollout():
    pools = RunPools()
    leased = []
    for role in ("train", "eval", "train", "eval"):
        with pools.lease(role, _Env, 3, _options()) as pool:
            leased.append(pool)
    assert leased[0] is leased[2] and leased[1] is leased[3] and leased[0] is not leased[1]
    assert _Env.closed == 0  # kept open between rollouts
    served = []
    for _ in range(2):
        with pools.lease("train", _ServedEnv, 2, _options()) as pool:
            served.append(pool)
            assert _ServedEnv.closed == 2 * (len(served) - 1)  # open during its rollout
    assert served[0] is not served[1] and _ServedEnv.closed == 4  # its sessions closed
    with pools.lease("train", _Env, 4, _options()) as pool:  # another size: rebuilt
        assert len(pool) == 4 and pool is not leased[0]
    assert _Env.closed == 3  # the 3-environment training pool, replaced
    pools.close()
    assert _Env.closed == 3 + 3 + 4  # the evaluation's and the new training pool
