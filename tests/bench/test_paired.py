"""The paired difference that ``mcgpo bench`` prints under its table: per seed, method minus
baseline, mean and a 95 % percentile-bootstrap interval over seeds."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcgpo.bench.results import (
    EvalPoint,
    PairedEstimate,
    RunResult,
    bootstrap_interval,
    paired_differences,
    render_results_md,
    summarise,
)


def run(method: str, seed: int, successes: list[float]) -> RunResult:
    points = tuple(
        EvalPoint(method, seed, update=4 * i, success=s) for i, s in enumerate(successes)
    )
    return RunResult(method, seed, points)


def test_golden_one_two_three():
    # Differences 1, 2, 3: mean 2. A resample of 3 is one of 3^3 = 27 equally likely
    # draws; only (1, 1, 1) has mean 1, with probability 1/27 = 3.7 % > 2.5 %, so the
    # 2.5 % quantile of the bootstrap means is 1 (with 10,000 resamples about 370 of them
    # are all-ones, SD about 19: the 250th smallest is 1 in all but astronomically rare
    # cases, and the draws are seeded). Symmetrically the 97.5 % quantile is 3.
    assert bootstrap_interval([1.0, 2.0, 3.0]) == (1.0, 3.0)
    (d,) = paired_differences(
        [run("graphgpo", s, [0.0, 0.0]) for s in (0, 1, 2)]
        + [run("mcgpo", s, [0.0, s + 1.0]) for s in (0, 1, 2)]
    )
    assert d.final_success == PairedEstimate(2.0, (1.0, 3.0))


def test_golden_skewed_interval():
    # Differences 0, 0, 0, 1 (n = 4): a resample's mean is k / 4 with k ~ Binomial(4, 1/4)
    # ones drawn. P(k = 0) = (3/4)^4 = 0.316 >= 2.5 %, so the lower end is 0.
    # P(k <= 2) = 0.316 + 0.422 + 0.211 = 0.949 < 97.5 % <= P(k <= 3) = 0.996, so the upper
    # end is 3/4 (0.949 and 0.996 are each > 10 SD of a 10,000-draw frequency away from
    # 0.975). Mean 1/4: the interval is not symmetric and not [min, max].
    assert bootstrap_interval([0.0, 0.0, 0.0, 1.0]) == (0.0, 0.75)


def test_interval_matches_the_exact_bootstrap_distribution():
    # Oracle: all 5^5 = 3125 resamples of 5 values enumerated, each equally likely; the
    # percentile interval from 10,000 random resamples lands on the same atoms.
    values = np.array([-0.4, -0.1, 0.05, 0.3, 0.9])
    grid = np.array(np.meshgrid(*[range(5)] * 5)).reshape(5, -1).T
    means = np.sort(values[grid].mean(axis=1))
    cdf = np.arange(1, len(means) + 1) / len(means)
    exact_low = means[np.searchsorted(cdf, 0.025)]
    exact_high = means[np.searchsorted(cdf, 0.975)]
    low, high = bootstrap_interval(values.tolist())
    # sampling error of a 2.5 % quantile from 10,000 draws: sqrt(.025 * .975 / 1e4) = 0.0016
    # in probability, over a density of about 0.3 per unit near the tails (bootstrap SD of
    # the mean 0.2): about 0.005; the tolerance is eight times that (exact: -0.20, +0.56)
    assert abs(low - exact_low) <= 0.04 and abs(high - exact_high) <= 0.04
    assert exact_low < 0.0 < exact_high  # the case is not trivial: the interval spans 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.001, 1.0), min_size=2, max_size=12))
def test_all_positive_differences_give_an_interval_above_zero(diffs):
    low, high = bootstrap_interval(diffs)
    assert 0.0 < low <= high
    assert min(diffs) - 1e-12 <= low and high <= max(diffs) + 1e-12


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0), min_size=2, max_size=12), st.floats(-1.0, 1.0))
def test_interval_flips_with_the_sign_and_moves_with_a_shift(diffs, shift):
    low, high = bootstrap_interval(diffs)
    neg_low, neg_high = bootstrap_interval([-d for d in diffs])
    assert neg_low == pytest.approx(-high, abs=1e-12) and neg_high == pytest.approx(-low, abs=1e-12)
    moved = bootstrap_interval([d + shift for d in diffs])
    assert moved == pytest.approx((low + shift, high + shift), abs=1e-9)


def test_pairing_by_seed_leaves_out_a_seed_one_arm_lacks():
    runs = [
        run("graphgpo", 0, [0.1, 0.2]),
        run("graphgpo", 1, [0.1, 0.4]),
        run("graphgpo", 3, [0.9, 0.9]),  # mcgpo has no seed 3
        run("mcgpo", 0, [0.1, 0.5]),
        run("mcgpo", 1, [0.3, 0.4]),
        run("mcgpo", 2, [0.0, 0.0]),  # graphgpo has no seed 2
    ]
    (d,) = paired_differences(runs)
    assert (d.method, d.baseline, d.seeds) == ("mcgpo", "graphgpo", (0, 1))
    # final: seed 0 0.5 - 0.2 = 0.3, seed 1 0.4 - 0.4 = 0 -> mean 0.15
    # integrated: seed 0 0.3 - 0.15 = 0.15, seed 1 0.35 - 0.25 = 0.1 -> mean 0.125
    assert d.final_success.mean == pytest.approx(0.15)
    assert d.integrated_success.mean == pytest.approx(0.125)
    # two values: resample means are 0, 0.15 (twice) or 0.3, each end with 25 % >= 2.5 %
    assert d.final_success.interval == pytest.approx((0.0, 0.3))


def test_baseline_is_graphgpo_when_it_ran_else_the_first_method():
    runs = [run(m, s, [0.1 * s]) for m in ("grpo", "graphgpo", "mcgpo") for s in (0, 1)]
    assert [(d.method, d.baseline) for d in paired_differences(runs)] == [
        ("grpo", "graphgpo"),
        ("mcgpo", "graphgpo"),
    ]
    no_graph = [r for r in runs if r.method != "graphgpo"]
    assert [(d.method, d.baseline) for d in paired_differences(no_graph)] == [("mcgpo", "grpo")]
    assert [d.baseline for d in paired_differences(runs, baseline="mcgpo")] == ["mcgpo"] * 2
    assert paired_differences([run("mcgpo", 0, [0.5])]) == []
    assert paired_differences([]) == []


def test_one_shared_seed_has_no_interval_and_none_shared_has_no_estimate():
    one = paired_differences([run("graphgpo", 0, [0.2]), run("mcgpo", 0, [0.5])])
    assert one[0].final_success.mean == pytest.approx(0.3)
    assert one[0].final_success.interval is None
    none = paired_differences([run("graphgpo", 0, [0.2]), run("mcgpo", 1, [0.5])])
    assert none[0].seeds == () and none[0].final_success is None


def test_reproducible_and_independent_of_run_order():
    runs = [run("graphgpo", s, [0.1, 0.1 * s]) for s in range(5)]
    runs += [run("mcgpo", s, [0.1, 0.3 * s - 0.2]) for s in range(5)]
    first = paired_differences(runs)
    shuffled = runs[:]
    random.Random(3).shuffle(shuffled)
    assert paired_differences(runs) == first
    # order of the seeds within a method does not change the pairs or the resampling
    assert [d.final_success for d in paired_differences(shuffled) if d.method == "mcgpo"] == [
        d.final_success for d in first if d.method == "mcgpo"
    ]
    assert bootstrap_interval([0.1, 0.4, 0.2]) == bootstrap_interval([0.1, 0.4, 0.2])


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match=r"^two runs of mcgpo with seed 0$"):
        paired_differences([run("mcgpo", 0, [0.1]), run("mcgpo", 0, [0.2])])
    with pytest.raises(ValueError, match=r"^baseline 'gigpo' has no runs; methods: mcgpo$"):
        paired_differences([run("mcgpo", 0, [0.1])], baseline="gigpo")
    with pytest.raises(ValueError, match="no evaluation points"):
        paired_differences([RunResult("mcgpo", 0, ())])
    with pytest.raises(ValueError, match=r"^level must be in \(0, 1\), got 1.5$"):
        bootstrap_interval([0.1, 0.2], level=1.5)
    with pytest.raises(ValueError, match=r"^resamples must be >= 1, got 0$"):
        bootstrap_interval([0.1, 0.2], resamples=0)
    with pytest.raises(ValueError, match="non-finite"):
        bootstrap_interval([0.1, float("nan")])
    assert bootstrap_interval([0.3]) is None and bootstrap_interval([]) is None


def test_rendered_under_the_main_table():
    runs = [run("graphgpo", s, [0.0, 0.0]) for s in (0, 1, 2)]
    runs += [run("mcgpo", s, [0.0, s + 1.0]) for s in (0, 1, 2)]
    runs += [run("grpo", 0, [0.0, -0.25])]
    md = render_results_md(summarise(runs), title="t", paired=paired_differences(runs))
    main_table, paired = md.split("## Paired difference against graphgpo")
    assert "| graphgpo | 3 |" in main_table and "Integrated success |" in main_table
    lines = paired.splitlines()
    assert lines[0] == " (method - graphgpo, per seed)"
    assert "| mcgpo | 3 | +200.0 | [+100.0, +300.0] | +100.0 | [+50.0, +150.0] |" in lines
    assert "| grpo | 1 | -25.0 | n/a | -12.5 | n/a |" in lines
    assert "10,000 resamples, resampling seed 0" in paired
    # without paired differences the table is as before
    assert "Paired" not in render_results_md(summarise(runs), title="t")


def test_one_section_per_baseline_and_ablate_adds_mcgpo(tmp_path, capsys):
    # Final successes per seed: graphgpo 0.1 / 0.2, mcgpo 0.2 / 0.4, control 0.3 / 0.4.
    # Against graphgpo: mcgpo +10 / +20 -> +15.0; control +20 / +20 -> +20.0.
    # Against mcgpo: graphgpo -10 / -20 -> -15.0; control +10 / 0 -> +5.0.
    from mcgpo.bench.commands import _write_results

    runs = [run("graphgpo", 0, [0.0, 0.1]), run("graphgpo", 1, [0.0, 0.2])]
    runs += [run("mcgpo", 0, [0.0, 0.2]), run("mcgpo", 1, [0.0, 0.4])]
    runs += [run("mcgpo/uniform", 0, [0.0, 0.3]), run("mcgpo/uniform", 1, [0.0, 0.4])]
    both = paired_differences(runs) + paired_differences(runs, baseline="mcgpo")
    md = render_results_md(summarise(runs), title="t", paired=both)
    _, vs_graph, vs_mcgpo = md.split("## Paired difference against ")
    assert vs_graph.startswith("graphgpo (method - graphgpo, per seed)")
    assert "| mcgpo | 2 | +15.0 |" in vs_graph and "| mcgpo/uniform | 2 | +20.0 |" in vs_graph
    assert vs_mcgpo.startswith("mcgpo (method - mcgpo, per seed)")
    assert "| graphgpo | 2 | -15.0 |" in vs_mcgpo and "| mcgpo/uniform | 2 | +5.0 |" in vs_mcgpo
    # the ablation writes both sections; a bench only the one against graphgpo
    _write_results("ablate", tmp_path, runs, [])
    assert (tmp_path / "results.md").read_text().count("## Paired difference against ") == 2
    _write_results("bench", tmp_path, runs, [])
    assert (tmp_path / "results.md").read_text().count("## Paired difference against ") == 1
    capsys.readouterr()
