"""The verl end-to-end test's environment ``e2e_fork`` on its own (no verl): its rules, its
plugin registration, and, offline with mcgpo's own rollout, that the warm start of
verl_cpu_run.py gives the reward variance and the MCGPO pairs the end-to-end test needs."""

from __future__ import annotations

import numpy as np
import pytest
from e2e_fork_env import ACTIONS, NAME, ForkEnv, install

LEFT, RIGHT = ACTIONS


def other(k: int) -> str:
    return ACTIONS[1 - k]


def test_the_way_out_wins_at_either_fork_and_the_other_path_loses():
    env = ForkEnv()
    first = env.reset(seed=3)
    assert first.admissible_actions == ACTIONS and first.context.state == "fork=0;out=0"
    exits = env.exits
    assert env.expert_action() == ACTIONS[exits[0]]
    res = env.step(ACTIONS[exits[0]])  # out at the first fork
    assert (res.reward, res.done, res.info["won"], res.info["score"]) == (10.0, True, True, 1.0)
    assert res.observation.context.state == "fork=0;out=1"
    with pytest.raises(ValueError, match="after the episode ended"):
        env.step(LEFT)

    env.reset(seed=3)
    res = env.step(other(exits[0]))  # to the second fork
    assert (res.reward, res.done, res.info["won"]) == (0.0, False, False)
    assert res.observation.context.state == "fork=1;out=0"
    assert env.expert_action() == ACTIONS[exits[1]]
    res = env.step(ACTIONS[exits[1]])
    assert (res.reward, res.done, res.info["won"], res.info["turn"]) == (10.0, True, True, 2)

    env.reset(seed=3)
    env.step(other(exits[0]))
    res = env.step(other(exits[1]))  # wrong twice: the turn limit ends a lost episode
    assert (res.reward, res.done, res.info["won"]) == (0.0, True, False)


def test_other_text_changes_nothing_and_tasks_are_fixed_by_seed_and_split():
    env = ForkEnv(max_turns=3)
    env.reset(seed=0)
    res = env.step("go up")
    assert res.observation.text == "Nothing happens." and res.info["action_valid"] is False
    assert res.observation.context.state == "fork=0;out=0" and not res.done
    draws = []
    for seed in range(400):
        env.reset(seed=seed)
        draws.append(env.exits)
        env.reset(seed=seed, split="valid_seen")
        draws.append(env.exits)
    again = ForkEnv()
    again.reset(seed=7)
    env.reset(seed=7)
    assert again.exits == env.exits
    # both paths lead out about equally often (so cloned demos pick each about half the
    # time); the splits draw their own tasks
    share = np.mean([d[0] for d in draws])
    assert 0.4 < share < 0.6
    assert draws[0::2] != draws[1::2]
    with pytest.raises(ValueError, match="max_turns must be an integer >= 1, got 0"):
        ForkEnv(max_turns=0)


def test_installed_as_a_plugin_it_is_found_by_name(tmp_path, monkeypatch):
    import mcgpo

    monkeypatch.syspath_prepend(str(install(tmp_path / "site")))
    env = mcgpo.make_env(NAME, max_turns=2)
    assert env.reset(seed=1).task == "Your task is to: find the way out."
    assert NAME in mcgpo.ENVIRONMENTS


@pytest.mark.slow
def test_warm_start_gives_reward_variance_and_pairs_offline(tmp_path, monkeypatch):
    """verl_cpu_run.py's warm start, then one batch of its shape (8 tasks x 8) with mcgpo's
    own rollout: wins and losses in the groups, and MCGPO pairs (the end-to-end test asserts
    them through verl; offline, 40 such batches gave 3-22 pairs, never 0)."""
    import torch
    from verl_cpu_run import MAX_TURNS, PROMPTS, N, build_model

    from mcgpo.envs import make_env
    from mcgpo.policy import load_policy
    from mcgpo.preferences import build_preferences
    from mcgpo.rollout.group_rollout import CollectOptions, collect

    monkeypatch.syspath_prepend(str(install(tmp_path / "site")))
    threads = torch.get_num_threads()
    try:
        folder = build_model(tmp_path)
    finally:
        torch.set_num_threads(threads)
    model, tokenizer = load_policy(folder)
    opts = CollectOptions(
        group_size=N, split="train", temperature=1.0, history=1, max_turns=MAX_TURNS,
        max_new_tokens=8, response_format="action", max_prompt_tokens=512,
    )  # fmt: skip
    table = collect(model, tokenizer, lambda: make_env(NAME), list(range(PROMPTS)), opts).table
    assert PROMPTS * N <= len(table.reward) <= PROMPTS * N * MAX_TURNS
    assert 0 < table.success.mean() < 1
    assert len(build_preferences(table, group_size=N)) > 0
