"""collect(): G x N group rollouts on the counter env with the tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rollout_fakes import CounterEnv

from mcgpo.policy import token_log_probs
from mcgpo.rollout import CollectOptions, collect, encode_prompt, parse_action, render_prompt

TASKS = [0, 1, 2]  # targets 2, 3, 4
N = 4
# the recipe's training values (RolloutConfig's defaults); CollectOptions has none of its own
RECIPE = {"split": "train", "temperature": 1.0, "history": 2}


def run(policy, env_factory=CounterEnv, tasks=TASKS, **kw):
    model, tok = policy
    kw.setdefault("seed", 0)
    kw.setdefault("max_new_tokens", 6)
    return collect(model, tok, env_factory, tasks, CollectOptions(group_size=N, **RECIPE, **kw))


@pytest.fixture(scope="module")
def rollout(counter_policy):
    return run(counter_policy)


def test_ids_shapes_and_turn_contiguity(rollout):
    t, tb = rollout.table, rollout.tokens
    assert len(t) == len(tb) == tb.input_ids.shape[0] == len(rollout.responses)
    # environment e = g * N + slot plays tasks[g]; traj = e
    assert set(t.group) == {0, 1, 2}
    assert np.array_equal(t.traj, t.group * N + t.slot)
    assert set(map(tuple, np.stack([t.group, t.slot], 1))) == {
        (g, s) for g in range(3) for s in range(N)
    }
    # rows are ordered by (group, slot, turn) and turns are 0, 1, 2, ... per trajectory
    assert np.array_equal(np.lexsort((t.turn, t.slot, t.group)), np.arange(len(t)))
    for traj in np.unique(t.traj):
        turns = t.turn[t.traj == traj]
        assert turns.tolist() == list(range(len(turns)))
        assert len(turns) <= CounterEnv().max_turns
        done = t.done[t.traj == traj]
        assert not done[:-1].any()  # only the last turn can end the episode


def test_rows_carry_the_context_before_and_after_the_action(rollout):
    t = rollout.table
    for traj in np.unique(t.traj):
        rows = np.flatnonzero(t.traj == traj)
        assert t.anchor[rows[0]] == "count 0"  # reset observation
        # next_anchor of a turn is the anchor of the following turn
        assert t.next_anchor[rows[:-1]].tolist() == t.anchor[rows[1:]].tolist()
        assert t.next_progress_value[rows[:-1]].tolist() == t.progress_value[rows[1:]].tolist()
        target = TASKS[t.group[rows[0]]] % 3 + 2
        counts = [int(a.split()[1]) for a in t.anchor[rows]]
        assert t.progress_value[rows].tolist() == pytest.approx([c / target for c in counts])
        # success/score: the outcome of the last step, on every row of the trajectory
        won = int(t.next_anchor[rows[-1]].split()[1]) >= target
        assert set(t.success[rows]) == {float(won)} and set(t.score[rows]) == {float(won)}
        assert t.done[rows[-1]] == (won or len(rows) == 4)
        assert t.reward[rows].tolist() == [0.0] * (len(rows) - 1) + [10.0 * won]
        assert set(t.task_type[rows]) == {"even" if target % 2 == 0 else "odd"}


def test_actions_are_parsed_from_the_sampled_tokens(rollout, counter_policy):
    _, tok = counter_policy
    t, tb = rollout.table, rollout.tokens
    for i in range(len(t)):
        response_ids = tb.input_ids[i][tb.response_mask[i]].tolist()
        text = tok.decode(response_ids, skip_special_tokens=True)
        assert text == rollout.responses[i]
        assert parse_action(text, "action") == (t.action[i], t.action_valid[i])


def test_masks_cover_exactly_the_response_and_the_prompt_is_the_rendered_one(
    rollout, counter_policy
):
    _, tok = counter_policy
    t, tb = rollout.table, rollout.tokens
    i = int(np.flatnonzero(t.turn == 2)[0])  # a turn with history
    rows = np.flatnonzero(t.traj == t.traj[i])
    env = CounterEnv()
    obs = env.reset(seed=TASKS[t.group[i]])
    past = []
    for r in rows[:2]:  # replay the two earlier actions to rebuild the observation
        res = env.step(t.action[r])
        past.append((obs.text, t.action[r]))
        obs = res.observation
    prompt = encode_prompt(tok, render_prompt(obs, past, history=2))
    n_prompt = len(prompt)
    assert tb.input_ids[i, :n_prompt].tolist() == prompt
    assert not tb.response_mask[i, :n_prompt].any()  # observation/history tokens: no loss
    length = int(tb.attention_mask[i].sum())
    assert tb.response_mask[i, n_prompt:length].all()
    assert not tb.response_mask[i, length:].any() and not tb.attention_mask[i, length:].any()
    assert (tb.old_log_probs[~tb.response_mask] == 0).all()


def test_old_log_probs_match_the_trainer_forward_pass(rollout, counter_policy):
    model, _ = counter_policy
    tb = rollout.tokens
    with torch.no_grad():
        fresh = token_log_probs(model, tb.input_ids, tb.attention_mask)
    m = tb.response_mask
    assert torch.allclose(fresh[m], tb.old_log_probs[m], atol=1e-4, rtol=0)


def test_stats_agree_with_the_table(rollout):
    t, s = rollout.table, rollout.stats
    heads = np.flatnonzero(t.turn == 0)
    assert s["trajectories"] == 12 and s["errored_trajectories"] == 0 and s["rows"] == len(t)
    assert s["success_rate"] == pytest.approx(t.success[heads].mean())
    assert s["mean_turns"] == pytest.approx(len(t) / 12)
    assert s["invalid_rate"] == pytest.approx((~t.action_valid).mean())
    assert s["tokens_generated"] == float(rollout.tokens.response_lengths().sum())
    assert s["seconds"] >= s["sample_seconds"] > 0
    assert {"success_rate/even", "success_rate/odd"} <= set(s)


def test_same_seed_same_rollout_other_seed_other_rollout(counter_policy, rollout):
    again = run(counter_policy, seed=0)
    assert again.table.to_records() == rollout.table.to_records()
    assert torch.equal(again.tokens.input_ids, rollout.tokens.input_ids)
    assert torch.equal(again.tokens.old_log_probs, rollout.tokens.old_log_probs)
    other = run(counter_policy, seed=1)
    assert other.responses != rollout.responses


def test_errored_trajectory_is_kept_marked_and_excluded_from_learning(counter_policy):
    # task seed 1 fails at turn 2 in every sibling; task seed 2 fails at reset
    def factory():
        return CounterEnv(fail_seed=1, fail_turn=2, fail_reset_seed=2)

    out = run(counter_policy, env_factory=factory, max_turns=3)
    t = out.table
    bad = t.group == 1
    assert bad.any() and t.errored[bad].all() and not t.errored[~bad].any()
    assert (t.turn[bad] == 0).all()  # the completed turn is kept, the failed one dropped
    assert not (t.group == 2).any()  # failed at reset: no rows
    assert out.stats["errored_trajectories"] == 8
    assert sorted(out.errors) == list(range(4, 12))  # traj ids of groups 1 and 2
    assert "step failed for seed 1" in out.errors[4] and "reset failed" in out.errors[8]
    assert out.stats["trajectories"] == 12
    clean = out.learnable()
    assert not clean.table.errored.any() and len(clean.table) == (~bad).sum()
    assert torch.equal(clean.tokens.input_ids, out.tokens.select(np.flatnonzero(~bad)).input_ids)
    assert out.stats["mean_turns"] == pytest.approx((~bad).sum() / 4)  # only the 4 clean ones


def test_max_turns_truncates_without_done(counter_policy):
    out = run(counter_policy, max_turns=1, tasks=[2])  # target 4: never reached in 1 turn
    t = out.table
    assert len(t) == N and (t.turn == 0).all() and not t.done.any() and not t.success.any()


def test_prompt_budget_falls_back_to_no_history_then_cuts(counter_policy):
    _, tok = counter_policy
    env = CounterEnv()
    obs = env.reset(seed=2)
    short = len(encode_prompt(tok, render_prompt(obs, [], history=0)))
    out = run(counter_policy, tasks=[2], max_prompt_tokens=short + 2)
    assert out.stats["prompts_no_history"] > 0  # later turns drop the history
    assert out.stats["prompt_tokens_max"] <= short + 2
    out = run(counter_policy, tasks=[2], max_prompt_tokens=8)
    assert out.stats["prompts_cut"] > 0 and out.stats["prompt_tokens_max"] == 8


def test_bad_arguments(counter_policy):
    with pytest.raises(ValueError, match="unknown response_format 'json'"):
        run(counter_policy, response_format="json")
    with pytest.raises(ValueError, match="group_size must be >= 1, got 0"):
        collect(*counter_policy, CounterEnv, [0], CollectOptions(group_size=0, **RECIPE))
    with pytest.raises(ValueError, match="max_turns must be >= 1 or None, got 0"):
        run(counter_policy, max_turns=0)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1 or None, got 0"):
        run(counter_policy, max_new_tokens=0)
    with pytest.raises(ValueError, match="tasks is empty"):
        run(counter_policy, tasks=[])


def test_household_integration():
    import mcgpo
    from mcgpo.policy import build_tiny_policy
    from mcgpo.rollout import environment_corpus

    model, tok = build_tiny_policy(environment_corpus(("household",), episodes=8), seed=0)
    out = collect(
        model,
        tok,
        lambda: mcgpo.make_env("household"),
        [0, 1],
        CollectOptions(group_size=2, **RECIPE, max_turns=3, seed=0),
    )
    t = out.table
    assert len(t) == 12 and set(t.turn) == {0, 1, 2}  # an untrained model never wins in 3
    assert not t.done.any() and not t.errored.any()
    assert all(a for a in t.anchor) and all(a for a in t.next_anchor)
    # siblings start from the same task: the same first anchor and task type per group
    for g in (0, 1):
        first = (t.group == g) & (t.turn == 0)
        assert len(set(t.anchor[first])) == 1 and len(set(t.task_type[first])) == 1
    assert out.stats["prompt_tokens_mean"] > 100
    with torch.no_grad():
        fresh = token_log_probs(model, out.tokens.input_ids, out.tokens.attention_mask)
    m = out.tokens.response_mask
    assert torch.allclose(fresh[m], out.tokens.old_log_probs[m], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": -0.5}, "temperature must be >= 0, got -0.5"),
        ({"history": -1}, "history must be >= 0, got -1"),
        ({"max_prompt_tokens": 0}, "max_prompt_tokens must be >= 1 or None, got 0"),
        ({"response_format": "json"}, "unknown response_format 'json'"),
        ({"group_offset": -1}, "group_offset must be an integer >= 0, got -1"),
        ({"group_offset": True}, "group_offset must be an integer >= 0, got True"),
    ],
)
def test_options_are_checked_when_built(options, message):
    with pytest.raises(ValueError, match=message):
        CollectOptions(**{"group_size": N, **RECIPE, **options})


def test_options_without_the_recipe_values_are_refused():
    # group size, split, temperature and history have their defaults in the run config only
    with pytest.raises(TypeError, match="group_size"):
        CollectOptions(split="train", temperature=1.0, history=2)
    with pytest.raises(TypeError, match="positional"):
        CollectOptions(N, "train", 1.0, 2)  # keyword-only: a call reads as what it sets
