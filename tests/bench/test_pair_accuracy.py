"""benchmarks/bench_pair_accuracy.py at tiny size: replay, Q estimates, accuracy summaries."""

from __future__ import annotations

import importlib
import random
import sys
from pathlib import Path

import numpy as np
import pytest

import mcgpo

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:  # the scripts import each other by their file names
    sys.path.insert(0, str(BENCHMARKS))
coverage = importlib.import_module("bench_coverage")
pa = importlib.import_module("bench_pair_accuracy")


def _env(name: str, **options):
    return mcgpo.make_env(name, **{**coverage.ENVS[name], **options})


@pytest.mark.parametrize("name", ["household", "webshop"])
def test_replaying_the_actions_reproduces_the_observations(name):
    env = _env(name)
    for task in range(3):
        played = coverage.play_episode(env, task, random.Random(f"t/{task}"), noise=0.5)
        actions = [action for _, action, _ in played]
        # a different stream with noise 1: any use of it past the prefix would show
        replayed = coverage.play_episode(env, task, random.Random("other"), 1.0, actions)
        assert len(replayed) == len(played)
        for (obs_a, act_a, res_a), (obs_b, act_b, res_b) in zip(played, replayed):
            assert act_a == act_b
            assert obs_a.text == obs_b.text
            assert obs_a.admissible_actions == obs_b.admissible_actions
            assert obs_a.context == obs_b.context
            assert res_a.observation.text == res_b.observation.text
            assert (res_a.reward, res_a.done) == (res_b.reward, res_b.done)
            assert res_a.info["won"] == res_b.info["won"]
            assert res_a.info["score"] == res_b.info["score"]


def test_oracle_state_is_the_rows_recorded_state():
    env = _env("household")
    table = pa.rollouts(env, groups=2, size=4, noise=0.5)
    oracle = pa.Oracle(env, table, {0: 0, 1: 1}, noise=0.5, k=1)
    for row in range(len(table.turn)):
        ctx = oracle.state(row).context
        assert (ctx.anchor, ctx.state, ctx.state_coarse) == (
            table.anchor[row],
            table.state[row],
            table.state_coarse[row],
        )
        assert oracle.prefix(row) == [
            table.action[r]
            for r in np.flatnonzero(table.traj == table.traj[row])
            if table.turn[r] < table.turn[row]
        ]


@pytest.mark.parametrize("name", ["household", "webshop"])
def test_q_estimates_lie_in_the_unit_interval(name):
    env = _env(name)
    table = pa.rollouts(env, groups=3, size=4, noise=0.5)
    oracle = pa.Oracle(env, table, {g: g for g in range(3)}, noise=0.5, k=3)
    sets, counts = pa.pair_sets(table, size=4)
    judged = [pa.judge(oracle, pairs) for pairs in sets]
    values = np.concatenate([np.concatenate([j.plus, j.minus_own, j.minus_same]) for j in judged])
    finite = values[~np.isnan(values).any(axis=1)]  # [M, 2]: mean success, mean score
    assert len(finite) > 0, "the tiny cell should give some pairs to judge"
    assert ((finite >= 0) & (finite <= 1)).all()
    # with k = 3 continuations a mean success is a multiple of 1/3
    np.testing.assert_allclose(finite[:, 0] * 3, np.round(finite[:, 0] * 3))
    assert counts["kept"] <= counts["candidates"]


def test_deterministic_case_gives_accuracy_one():
    # Household task 0 with the explorer expert: the expert alone wins in L turns (13 for
    # this task; measured, not assumed). With max_turns = L there is no turn to spare:
    #   row+ (slot 0, turn 0) takes the expert's action -> noise 0 continuation wins: Q = 1
    #   row- (slot 1, turn 0) takes "inventory", a valid command that changes nothing, so
    #        the expert still needs L turns but has L - 1 left: it loses, Q = 0.
    # Both rows are at the start state, so the same-state value Q(s+, inventory) is 0 too.
    # Every continuation is deterministic (noise 0), so any k gives Q in {0, 1} exactly:
    # accuracy 1, mean Q+ - Q- = 1, and the bootstrap interval is [1, 1].
    probe = _env("household")
    length = len(coverage.play_episode(probe, 0, random.Random(0), 0.0))
    env = _env("household", max_turns=length)
    good = coverage.play_episode(env, 0, random.Random(0), 0.0)
    bad = coverage.play_episode(env, 0, random.Random(0), 0.0, ["inventory"])
    assert good[-1][2].info["won"] and not bad[-1][2].info["won"]
    rows = coverage.episode_rows(good, 0, 0, 0) + coverage.episode_rows(bad, 0, 1, 1)
    table = mcgpo.StepTable.from_records(rows)
    plus, minus = 0, len(good)  # the turn-0 rows of slots 0 and 1
    assert table.action[minus] == "inventory" and table.turn[minus] == 0
    pairs = pa.PairSet(
        "hand", np.array([plus]), np.array([minus]), np.array(["exact"], object), np.array([1])
    )
    judged = pa.judge(pa.Oracle(env, table, {0: 0}, noise=0.0, k=4), pairs)
    np.testing.assert_array_equal(judged.plus[:, 0], [1.0])
    np.testing.assert_array_equal(judged.minus_own[:, 0], [0.0])
    np.testing.assert_array_equal(judged.minus_same[:, 0], [0.0])
    for q_minus in (judged.minus_own, judged.minus_same):
        s = pa.summarise(judged.plus[:, 0], q_minus[:, 0])
        assert (s["n"], s["right"], s["tie"], s["wrong"]) == (1, 1.0, 0.0, 0.0)
        assert s["mean"] == s["lo"] == s["hi"] == 1.0


def test_summarise_golden_and_nan_pairs_left_out():
    # differences Q+ - Q-: 1, 0, -0.5, 0.5 (the NaN pair is left out)
    # right 2/4, tie 1/4, wrong 1/4; mean (1 + 0 - 0.5 + 0.5) / 4 = 0.25
    q_plus = np.array([1.0, 0.5, 0.0, 0.75, np.nan])
    q_minus = np.array([0.0, 0.5, 0.5, 0.25, 0.0])
    s = pa.summarise(q_plus, q_minus)
    assert (s["n"], s["right"], s["tie"], s["wrong"]) == (4, 0.5, 0.25, 0.25)
    assert s["mean"] == pytest.approx(0.25)
    assert -0.5 <= s["lo"] <= 0.25 <= s["hi"] <= 1.0  # resampled means lie in [min, max]
    assert s == pa.summarise(q_plus, q_minus)  # fixed seed: reproducible
    empty = pa.summarise(np.array([np.nan]), np.array([0.0]))
    assert empty["n"] == 0 and np.isnan(empty["right"]) and np.isnan(empty["mean"])


def test_pair_sets_match_the_builder_and_dropped_sets_are_not_kept():
    env = _env("webshop")
    table = pa.rollouts(env, groups=4, size=8, noise=0.5)
    sets = {p.name: p for p in pa.pair_sets(table, size=8)[0]}
    default = mcgpo.build_preferences(table, group_size=8)
    same = mcgpo.build_preferences(table, group_size=8, evidence="same_fold")
    np.testing.assert_array_equal(sets["kept"].plus, default.plus)
    np.testing.assert_array_equal(sets["kept"].minus, default.minus)
    np.testing.assert_array_equal(sets["kept"].support, default.support)
    np.testing.assert_array_equal(sets["same_fold"].plus, same.plus)

    def keys(p):
        return {(min(a, b), max(a, b)) for a, b in zip(p.plus.tolist(), p.minus.tolist())}

    for name in ("dropped: eps", "dropped: alloc", "dropped: no support"):
        assert not keys(sets[name]) & keys(sets["kept"]), name


def test_split_masks_partition_the_pairs():
    pairs = pa.PairSet(
        "hand",
        np.arange(4),
        np.arange(4, 8),
        np.array(["exact", "coarse", "exact", "coarse"], object),
        np.array([1, 1, 2, 5]),
    )
    masks = {split: pa.split_mask(pairs, split).tolist() for split in pa.SPLITS}
    assert masks == {
        "all": [True] * 4,
        "exact": [True, False, True, False],
        "coarse": [False, True, False, True],
        "n = 1": [True, True, False, False],
        "n >= 2": [False, False, True, True],
    }


def test_bad_input_is_refused():
    env = _env("household")
    table = pa.rollouts(env, groups=1, size=2, noise=0.5)
    with pytest.raises(ValueError, match="k must be >= 1"):
        pa.Oracle(env, table, {0: 0}, noise=0.5, k=0)
    with pytest.raises(ValueError, match="no task seed for group 0"):
        pa.Oracle(env, table, {1: 1}, noise=0.5, k=1)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--k", "0"], "--k must be >= 1"),
        (["--sizes", "7"], "--sizes must be even"),
        (["--noise", "1.5"], "--noise must lie in [0, 1]"),
        # the trained-policy mode (--model) has no noisy expert
        (["--model", "m", "--noise", "0.2"], "--noise applies to the noisy expert"),
        (["--model", "m", "--envs", "household"], "--envs applies to the noisy expert"),
    ],
)
def test_cli_answers_bad_arguments_with_exit_2(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(sys, "argv", ["bench_pair_accuracy.py", *argv])
    with pytest.raises(SystemExit) as err:
        pa.main()
    assert err.value.code == 2
    assert message in capsys.readouterr().err


def test_signal_per_group_sums_c_times_the_gap_per_group():
    # 4 groups; pairs: group 0: c 0.5, Q+ - Q- = +0.4 -> 0.2; group 0 again: 1.0 x -0.1 ->
    # -0.1; group 2: 0.25 x 0.8 -> 0.2; groups 1 and 3 have none (0). Mean over the 4
    # groups = (0.1 + 0 + 0.2 + 0) / 4 = 0.075.
    got = pa.signal_per_group(
        np.array([0, 0, 2]), np.array([0.5, 1.0, 0.25]), np.array([0.4, -0.1, 0.8]), 4
    )
    assert got["mean"] == pytest.approx(0.075)
    assert got["lo"] <= got["mean"] <= got["hi"]
    # resampling groups, not pairs: a cell where one group holds everything has an interval
    # reaching 0 (most resamples miss it)
    lone = pa.signal_per_group(np.array([1, 1]), np.ones(2), np.ones(2), 8)
    assert lone["mean"] == pytest.approx(0.25) and lone["lo"] == 0.0
    # paired: the same resamples for two variants, so a constant per-group difference has
    # a zero-width interval, which an unpaired comparison of the two intervals would not show
    a = np.random.default_rng(3).normal(size=50)
    paired = pa.bootstrap_mean((a + 0.1) - a)
    assert paired["lo"] == pytest.approx(0.1) and paired["hi"] == pytest.approx(0.1)
    assert pa.bootstrap_mean(a + 0.1)["lo"] < 0.1 - 0.1


def test_weighted_gap_is_the_c_weighted_mean_and_free_of_the_scale_of_c():
    # the pairs above: (0.5 x 0.4 + 1.0 x -0.1 + 0.25 x 0.8) / (0.5 + 1.0 + 0.25) = 0.3 / 1.75
    weight, diff = np.array([0.5, 1.0, 0.25]), np.array([0.4, -0.1, 0.8])
    assert pa.weighted_gap(weight, diff) == pytest.approx(0.3 / 1.75)
    assert pa.weighted_gap(3 * weight, diff) == pytest.approx(0.3 / 1.75)  # c scaled: same
    assert pa.weighted_gap(np.ones(3), diff) == pytest.approx(diff.mean())
    assert np.isnan(pa.weighted_gap(np.zeros(0), np.zeros(0)))


def test_variants_are_judged_on_the_same_rollouts_and_streams():
    env = _env("webshop")
    table = pa.rollouts(env, groups=3, size=8, noise=0.6)
    oracle = pa.Oracle(env, table, {g: g for g in range(3)}, noise=0.6, k=2)
    rows = pa.variant_rows(table, oracle, size=8, groups=3, col=0)
    assert [r[0] for r in rows] == list(pa.VARIANTS)
    by_name = {name: (per_group, own, sig) for name, per_group, own, sig, _, _ in rows}
    assert rows[0][4] == {"mean": 0.0, "lo": 0.0, "hi": 0.0}  # paper minus paper
    # every variant's pairs were judged with the shared cache: judging the paper's pairs
    # again adds no Q estimate
    cached = len(oracle._cache)
    prefs = mcgpo.build_preferences(table, group_size=8)
    pa.judge(oracle, pa.PairSet("again", prefs.plus, prefs.minus, prefs.level, prefs.support))
    assert len(oracle._cache) == cached
    assert by_name["paper"][0] == pytest.approx(len(prefs) / 3)
    # leave-pair-out's candidates are a superset of the folds' (any two siblings, not two of
    # one fold); which of them are kept depends on their labels
    lpo = mcgpo.build_preferences(table, group_size=8, evidence="leave_pair_out")
    assert lpo.stats["candidate_pairs"] >= prefs.stats["candidate_pairs"]
    assert by_name["leave_pair_out"][0] == pytest.approx(len(lpo) / 3)
