"""The same seeds and actions give the same episodes through `mcgpo env serve` as locally:
observations, admissible actions, rewards, info and the context MCGPO matches on."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from mcgpo.envs import make_env  # noqa: E402
from mcgpo.envs.pool import EnvPool  # noqa: E402
from mcgpo.envs.serving.launch import ServedEnv  # noqa: E402
from mcgpo.envs.workers import EnvSpec  # noqa: E402

pytestmark = pytest.mark.serve


def play_both(local, remote, seeds, split: str, turns: int, rng: random.Random) -> int:
    """Play each seed on both envs with the same actions (expert, random admissible, one
    inadmissible); assert every observation, step result and expert action equal. Steps."""
    steps = 0
    for seed in seeds:
        obs = local.reset(seed=seed, split=split)
        assert remote.reset(seed=seed, split=split) == obs
        assert obs.context.anchor and obs.context.state  # a context to match on arrives
        for turn in range(turns):
            expert = local.expert_action()
            assert remote.expert_action() == expert
            pick = rng.random()
            if pick < 0.5:
                action = expert
            elif pick < 0.9:
                action = rng.choice(obs.admissible_actions)
            else:
                action = "juggle the moon"  # invalid: info['action_valid'] is False
            res = local.step(action)
            got = remote.step(action)
            # info crosses as JSON: a tuple inside it arrives as a list (docs/envs/serving.md)
            assert got == replace(res, info=json.loads(json.dumps(res.info))), (seed, turn)
            assert got.observation == res.observation and got.reward == res.reward
            assert type(got.observation.admissible_actions) is tuple
            steps += 1
            obs = res.observation
            if res.done:
                break
    return steps


@pytest.mark.parametrize(
    ("name", "options", "seeds"),
    [
        ("household", {}, [0, 1, 2, 7]),
        ("household", {"n_receptacles": 12}, [3]),
        ("webshop", {}, [0, 1, 5]),
    ],
)
def test_served_episodes_equal_local_ones(name, options, seeds):
    with ServedEnv(EnvSpec(name, options), name, options, max_sessions=2) as url:
        remote = make_env("remote", url=url, remote_name=name, **options)
        assert remote.max_turns == make_env(name, **options).max_turns
        steps = play_both(make_env(name, **options), remote, seeds, "train", 12, random.Random(0))
        assert steps >= 3 * len(seeds)
        held_out = play_both(
            make_env(name, **options), remote, [11], "valid_unseen", 6, random.Random(1)
        )
        assert held_out >= 1
        remote.close()


def test_a_pool_of_remote_envs_steps_as_a_local_pool():
    """EnvPool steps remote envs at once from threads; results by slot as in process."""
    with ServedEnv(EnvSpec("household"), "household", max_sessions=8) as url:
        remote = EnvPool([make_env("remote", url=url, remote_name="household") for _ in range(6)])
        local = EnvPool([make_env("household") for _ in range(6)])
        seeds = [0, 0, 1, 2, 3, 3]
        assert remote.reset(seeds, "train") == local.reset(seeds, "train")
        rng = random.Random(2)
        while local.live():
            acts = {i: local.envs[i].expert_action() if rng.random() < 0.7 else "look"
                    for i in local.live()}  # fmt: skip
            assert remote.step(acts) == local.step(acts)
        assert remote.stats() == local.stats()
        assert httpx.get(f"{url}/health").json()["sessions"] == 6
        remote.close()  # closes the sessions (synchronous DELETEs)
        assert httpx.get(f"{url}/health").json()["sessions"] == 0


def _alfworld_ready() -> bool:
    try:
        from mcgpo.envs.alfworld.engine import require_alfworld

        require_alfworld()
    except ImportError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.alfworld
@pytest.mark.skipif(not _alfworld_ready(), reason="needs the alfworld extra")
def test_served_alfworld_episodes_equal_local_ones(alfworld_cache):
    options = {"source": "generated", "cache_dir": str(alfworld_cache)}
    with ServedEnv(EnvSpec("alfworld", options), "alfworld", options, max_sessions=2) as url:
        remote = make_env("remote", url=url, remote_name="alfworld", **options)
        local = make_env("alfworld", **options)
        steps = play_both(local, remote, [0, 3], "train", 8, random.Random(0))
        assert steps >= 8
        remote.close()
