"""The GraphGPO + shaping control: golden shaped rewards, telescoping, and the estimator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mcgpo
from mcgpo.bench.synthetic import synthetic_table
from mcgpo.shaping import SHAPING_COEF, shape_rewards
from mcgpo.steps import StepTable
from mcgpo.training.algorithms import assign_credit, resolve_algo
from mcgpo.training.config import AlgoConfig, ConfigError


def two_trajectories() -> StepTable:
    # traj 0 (won): progress 0 -> 0.25 -> 0.5 -> 1.0, rewards 0, 0, 10
    # traj 1 (failed): progress 0 -> 0.25 -> 0 (undone), rewards 0, 0
    rows = []
    for traj, (won, progress) in enumerate([(1, [0.0, 0.25, 0.5, 1.0]), (0, [0.0, 0.25, 0.0])]):
        steps = len(progress) - 1
        for turn in range(steps):
            rows.append(
                {
                    "group": 0,
                    "traj": traj,
                    "slot": traj,
                    "turn": turn,
                    "reward": 10.0 if (won and turn == steps - 1) else 0.0,
                    "done": turn == steps - 1,
                    "success": float(won),
                    "score": float(won),
                    "action": f"a{turn}",
                    "action_valid": True,
                    "anchor": f"s{turn}",
                    "next_anchor": "goal" if (won and turn == steps - 1) else f"s{turn + 1}",
                    "progress_value": progress[turn],
                    "next_progress_value": progress[turn + 1],
                }
            )
    return StepTable.from_records(rows)


def test_shaped_rewards_golden():
    # coef 2: bonus = 2 * (next - current)
    #   traj 0: 2*0.25 = 0.5, 2*0.25 = 0.5, 10 + 2*0.5 = 11
    #   traj 1: 2*0.25 = 0.5, 2*(0 - 0.25) = -0.5
    t = two_trajectories()
    shaped = shape_rewards(t, 2.0)
    assert shaped.reward.tolist() == [0.5, 0.5, 11.0, 0.5, -0.5]
    # everything else is untouched, the input too
    assert shaped.success.tolist() == t.success.tolist()
    assert t.reward.tolist() == [0.0, 0.0, 10.0, 0.0, 0.0]


def test_zero_coefficient_changes_nothing():
    t = two_trajectories()
    assert np.array_equal(shape_rewards(t, 0.0).reward, t.reward)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 1000), st.floats(0.0, 5.0))
def test_bonus_telescopes_over_a_trajectory(seed, coef):
    # sum of bonuses of a trajectory = coef * (last next_progress - first progress),
    # because synthetic next_progress_value(t) = progress_value(t + 1) inside a trajectory
    t = synthetic_table(2, 4, 12, seed=seed)
    bonus = shape_rewards(t, coef).reward - t.reward
    for traj in np.unique(t.traj):
        rows = np.flatnonzero(t.traj == traj)
        rows = rows[np.argsort(t.turn[rows])]
        expected = coef * (t.next_progress_value[rows[-1]] - t.progress_value[rows[0]])
        assert bonus[rows].sum() == pytest.approx(expected, abs=1e-9)


def test_graphgpo_shaping_algorithm_is_graphgpo_on_the_shaped_table():
    # the control as the trainer runs it (graphgpo_with_shaping, never called, is gone):
    # shaped rewards for the episode term, the same increments in R^G for the step term
    t = synthetic_table(3, 8, 15, seed=1)
    algo = AlgoConfig(name="graphgpo_shaping", shaping_coef=1.5, estimator={"omega": 0.2})
    adv = assign_credit(t, algo).advantages
    ref, _ = mcgpo.estimate("graphgpo", shape_rewards(t, 1.5), omega=0.2, progress_coef=1.5)
    assert np.array_equal(adv, ref)
    # the bonus reaches the advantages (through the episode return and the step credit)
    plain, _ = mcgpo.estimate("graphgpo", t, omega=0.2)
    assert not np.allclose(adv, plain)
    # and coef 0 is plain GraphGPO
    zero = AlgoConfig(name="graphgpo_shaping", shaping_coef=0.0, estimator={"omega": 0.2})
    assert np.array_equal(assign_credit(t, zero).advantages, plain)


def test_golden_control_on_two_trajectories():
    # two_trajectories(), coef 2, omega 0.5, mean_norm. Both walk s0 -> s1 -> s2; A (won)
    # goes on s2 -> sink. Distances: d(s2) = 1, d(s1) = 2, d(s0) = 3.
    #   R^G = 10 * 0.5^d(s') = A0 2.5, A1 5, A2 10, B0 2.5, B1 5 (B takes A's edges)
    #   + 2 * (P(s') - P(s)):  A0 +0.5, A1 +0.5, A2 +1.0, B0 +0.5, B1 -0.5 (B undoes progress)
    #   = A0 3.0, A1 5.5, A2 11.0, B0 3.0, B1 4.5
    # A^G by source: s0 {3.0, 3.0} -> 0, 0;  s1 {5.5, 4.5} mean 5 -> +0.5 / -0.5;  s2 {A2} -> 0
    #   (without the increments in R^G both s1 rows have 5: A^G would be 0 everywhere)
    # A^E: shaped returns 0.5 + 0.5 + 11 = 12 and 0.5 - 0.5 = 0, mean 6 -> +6 / -6
    t = two_trajectories()
    options = {"omega": 0.5, "mode": "mean_norm"}
    algo = AlgoConfig(name="graphgpo_shaping", shaping_coef=2.0, estimator=options)
    credit = assign_credit(t, algo)
    np.testing.assert_allclose(credit.advantages, [6.0, 6.5, 6.0, -6.0, -6.5])
    # the resolved config names the step bonus: progress_coef = shaping_coef
    resolved = resolve_algo(algo, group_size=2)
    assert resolved.estimator["progress_coef"] == 2.0
    np.testing.assert_array_equal(assign_credit(t, resolved).advantages, credit.advantages)
    # plain GraphGPO with progress_coef: the step term alone (A^E unshaped: +-5)
    adv, _ = mcgpo.estimate("graphgpo", t, progress_coef=2.0, **options)
    np.testing.assert_allclose(adv, [5.0, 5.5, 5.0, -5.0, -5.5])


@pytest.mark.parametrize("given", [0.5, "0.5"])
def test_control_rejects_a_different_step_coefficient(given):
    algo = AlgoConfig(name="graphgpo_shaping", shaping_coef=2.0, estimator={"progress_coef": given})
    with pytest.raises(
        ConfigError, match=r"^--algo.progress_coef 0.5 differs from --algo.shaping_coef 2.0; "
    ):
        resolve_algo(algo, group_size=2)
    # the same value is accepted (as text too)
    same = AlgoConfig(name="graphgpo_shaping", shaping_coef=0.5, estimator={"progress_coef": given})
    assert resolve_algo(same, group_size=2).estimator["progress_coef"] == 0.5


def test_default_coefficient():
    assert SHAPING_COEF == 1.0


def test_control_options_default_the_step_bonus_to_the_shaping_coefficient():
    # the control's estimator options are GraphGPO's with progress_coef = SHAPING_COEF, so
    # the resolved default config and --help name the bonus that enters R^G
    from mcgpo.cli import _algo_epilog
    from mcgpo.training.algorithms import algorithm_options

    cls, pairs = algorithm_options("graphgpo_shaping")
    assert pairs is None and cls().progress_coef == SHAPING_COEF == AlgoConfig().shaping_coef
    assert algorithm_options("graphgpo")[0]().progress_coef == 0.0
    resolved = resolve_algo(AlgoConfig(name="graphgpo_shaping"), group_size=8)
    assert resolved.estimator == cls().as_dict()
    assert f"progress_coef={SHAPING_COEF}" in _algo_epilog()


@pytest.mark.parametrize("coef", [-1.0, float("nan"), float("inf"), True, "1"])
def test_bad_coefficient(coef):
    with pytest.raises(ValueError, match="shape_rewards: 'coef' must be a finite number >= 0"):
        shape_rewards(two_trajectories(), coef)
