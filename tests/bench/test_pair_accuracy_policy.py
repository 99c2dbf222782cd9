"""benchmarks/pair_accuracy_policy.py: the trained-policy mode of bench_pair_accuracy.py.

The micro policy of tests/conftest.py (1 layer, 32 wide, random weights) on household-smoke
with 6 turns and a 2-turn history: what is tested is that a replayed row is the row the
rollout sampled (the same prompt ids), that the continuation loop is the rollout's own
sampling (the same actions from the same generator, whatever the batch), and that Q is the
mean over the k continuations of a key, computed the same in one batched prefetch as key
by key.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:  # the scripts import each other by their file names
    sys.path.insert(0, str(BENCHMARKS))
pap = importlib.import_module("pair_accuracy_policy")
pa = importlib.import_module("bench_pair_accuracy")

OVERRIDES = ("--env.max_turns", "6", "--rollout.history", "2")


@pytest.fixture(scope="module")
def policy(micro_model):
    return pap.load_policy_setup(
        str(micro_model), "household-smoke", size=4, seed=3, overrides=OVERRIDES
    )


@pytest.fixture(scope="module")
def rollout(policy):
    return pap.policy_rollouts(policy, groups=2)


def test_settings_come_from_the_preset_and_the_overrides(policy):
    opts = policy.options
    # household-smoke: action responses of 4 tokens, prompts of 256; the training temperature
    assert (opts.group_size, opts.split, opts.temperature) == (4, "train", 1.0)
    assert (opts.history, opts.max_new_tokens, opts.max_prompt_tokens) == (2, 4, 256)
    assert (policy.limit, policy.response_format, opts.seed) == (6, "action", 3)


def test_a_replayed_row_has_the_prompt_the_rollout_sampled_it_from(policy, rollout):
    table, tokens = rollout.table, rollout.tokens
    oracle = pap.PolicyOracle(policy, table, k=1)
    with_history = 0
    for r in range(len(table.turn)):
        ep = pap.replay(policy, oracle.task(r), oracle.prefix(r))
        length = int(tokens.attention_mask[r].sum())
        response = int(tokens.response_mask[r].sum())
        assert pap.episode_prompt(policy, ep) == tokens.input_ids[r, : length - response].tolist()
        assert ep.turns == int(table.turn[r])
        with_history += len(ep.past) > 0
    assert with_history > len(table.turn) / 2  # most rows show a history: the test bites


def test_the_continuation_loop_is_the_rollouts_sampling(policy, rollout):
    """From the empty prefix with the rollout's generators, play_out plays every trajectory
    again action for action, and to the same outcome, in one batch or one at a time."""
    from mcgpo.rollout.group_rollout import sampling_generators

    table, n = rollout.table, policy.options.group_size
    expected = {}
    for e in np.unique(table.traj).tolist():
        rows = np.flatnonzero(table.traj == e)
        rows = rows[np.argsort(table.turn[rows])]
        expected[e] = ([str(a) for a in table.action[rows]], float(table.success[rows[0]]))
    for batch in (512, 1):
        gens = sampling_generators(policy.options, groups=2)
        episodes = [pap.replay(policy, e // n, []) for e in range(2 * n)]
        pap.play_out(pap.Policy(**{**vars(policy), "batch": batch}), episodes, gens)
        for e, ep in enumerate(episodes):
            assert [a for _, a in ep.past] == expected[e][0]
            assert ep.outcome[0] == expected[e][1]
    assert len({tuple(a) for a, _ in expected.values()}) > 1  # siblings differ


def _varied_outcome(ep) -> tuple[float, float]:
    """A stand-in outcome that differs between streams (the micro policy never wins)."""
    return float(ep.turns), float(sum(len(a) for _, a in ep.past))


def test_q_is_the_mean_of_k_continuations_batched_or_not(policy, rollout, monkeypatch):
    monkeypatch.setattr(pap.Episode, "outcome", property(_varied_outcome))
    table = rollout.table
    keys = [(r, str(table.action[r])) for r in range(0, len(table.turn), 3)]
    keys.append((0, str(table.action[1])))  # another action from row 0: shares its streams
    batched = pap.PolicyOracle(policy, table, k=3, seed=5, block=4)
    batched.prefetch(keys)
    assert batched.continuations == 3 * len(set(keys))
    single = pap.PolicyOracle(policy, table, k=3, seed=5)
    for row, action in keys:
        eps = [pap.replay(policy, single.task(row), [*single.prefix(row), action]) for _ in "abc"]
        gens = [pap.stream(5, single.task(row), row, i) for i in range(3)]
        pap.play_out(policy, eps, gens)
        by_hand = np.mean([_varied_outcome(ep) for ep in eps], axis=0)
        np.testing.assert_array_equal(batched.q(row, action), by_hand)
        np.testing.assert_array_equal(single.q(row, action), by_hand)
    assert batched.continuations == 3 * len(set(keys))  # q read the cache: nothing replayed
    values = np.array([batched.q(r, a) for r, a in keys])
    assert len(np.unique(values[:, 1])) > 1  # the keys' means differ: the test bites


def test_a_policy_cell_asks_nothing_outside_its_prefetch(policy, rollout):
    table, size = rollout.table, policy.options.group_size
    oracle = pap.PolicyOracle(policy, table, k=2)
    sets = pa.judged_sets(table, size, variants=True, sets=True)
    oracle.prefetch(pa.needed_keys(oracle, sets))
    before = oracle.continuations
    cell = pa.judge_cell(table, oracle, size, 2, "success", variants=True, sets=True)
    assert oracle.continuations == before
    assert [row[0] for row in cell.variants] == list(pa.VARIANTS)
    np.testing.assert_array_equal(
        table.success[table.turn == 0].mean(), cell.success
    )  # the cell reports its rollout's success


def test_bad_input_is_refused(micro_model, policy, rollout, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        pap.load_policy_setup(str(tmp_path / "none"), "household-smoke", size=4)
    with pytest.raises(ValueError, match="preset"):
        pap.load_policy_setup(str(micro_model), "no-such-preset", size=4)
    with pytest.raises(ValueError, match="k must be >= 1"):
        pap.PolicyOracle(policy, rollout.table, k=0)
    with pytest.raises(ValueError, match="2 episodes but 1 generators"):
        pap.play_out(policy, [pap.replay(policy, 0, [])] * 2, [pap.stream(0, 0, 0, 0)])


def test_cli_names_a_missing_model_folder(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_pair_accuracy.py", "--model", str(tmp_path / "x")])
    with pytest.raises(SystemExit) as exit_info:
        pa.main()
    assert exit_info.value.code == 2
    out = capsys.readouterr()
    assert "does not exist" in out.err and len(out.err.strip().splitlines()) == 1
    assert out.out == ""  # refused before the table's header
