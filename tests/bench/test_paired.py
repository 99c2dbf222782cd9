"""The paired difference that ``mcgpo bench`` prints under its table: per seed, method minus
baseline; the mean, SD, 95 % paired t-interval and minimum detectable effect over seeds (the
statistics themselves: test_intervals.py)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcgpo.bench.intervals import detectable_effect_in_sd
from mcgpo.bench.results import (
    EvalPoint,
    PairedEstimate,
    RunResult,
    paired_differences,
    render_results_md,
    summarise,
)


def run(method: str, seed: int, successes: list[float]) -> RunResult:
    points = tuple(
        EvalPoint(method, seed, update=4 * i, success=s) for i, s in enumerate(successes)
    )
    return RunResult(method, seed, points)


# t_{0.975, 2} in closed form (2 df: t_p = (2p - 1) / sqrt(2 p (1 - p))) = 4.30265
T975_DF2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)


def test_golden_one_two_three():
    # Differences 1, 2, 3 (mcgpo's final success s + 1 against graphgpo's 0): mean 2, SD 1,
    # t-interval 2 +- 4.30265 / sqrt(3) = [-0.48414, 4.48414]; MDE 3.2640 x SD
    # (test_intervals.py derives both).
    (d,) = paired_differences(
        [run("graphgpo", s, [0.0, 0.0]) for s in (0, 1, 2)]
        + [run("mcgpo", s, [0.0, s + 1.0]) for s in (0, 1, 2)]
    )
    est = d.final_success
    assert (est.mean, est.sd) == pytest.approx((2.0, 1.0))
    assert est.interval == pytest.approx((2 - T975_DF2 / math.sqrt(3), 2 + T975_DF2 / math.sqrt(3)))
    assert est.detectable == pytest.approx(detectable_effect_in_sd(3))
    assert est.detectable == pytest.approx(3.2640, abs=1e-3)
    # integrated: the mean of (0, s + 1), so half the final differences: 0.5, 1, 1.5
    assert d.integrated_success.mean == pytest.approx(1.0)
    assert d.integrated_success.interval == pytest.approx(
        (1 - T975_DF2 / (2 * math.sqrt(3)), 1 + T975_DF2 / (2 * math.sqrt(3)))
    )


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0)), min_size=1, max_size=8))
def test_swapping_method_and_baseline_negates_the_estimate(pairs):
    # mcgpo - graphgpo per seed against graphgpo - mcgpo: mean and interval flip, SD and MDE
    # stay the same
    runs = [run("graphgpo", s, [g]) for s, (g, _) in enumerate(pairs)]
    runs += [run("mcgpo", s, [m]) for s, (_, m) in enumerate(pairs)]
    (fwd,) = paired_differences(runs, baseline="graphgpo")
    (back,) = paired_differences(runs, baseline="mcgpo")
    a, b = fwd.final_success, back.final_success
    assert a.mean == pytest.approx(-b.mean, abs=1e-12)
    if len(pairs) < 2:
        assert a.interval is b.interval is a.detectable is None
        return
    assert a.interval == pytest.approx((-b.interval[1], -b.interval[0]), abs=1e-12)
    assert a.sd == pytest.approx(b.sd) and a.detectable == pytest.approx(b.detectable)
    assert a.interval[0] <= a.mean <= a.interval[1]


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
    # two values 0.3 and 0: SD 0.3 / sqrt(2), 1 df: half-width t_{0.975, 1} * SD / sqrt(2)
    # = tan(0.475 pi) * 0.15 = 12.7062 * 0.15 = 1.9059
    half = math.tan(0.475 * math.pi) * 0.15
    assert d.final_success.interval == pytest.approx((0.15 - half, 0.15 + half))
    assert d.final_success.sd == pytest.approx(0.3 / math.sqrt(2))


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
    assert one[0].final_success == PairedEstimate(pytest.approx(0.3), None, None, None)
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


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match=r"^two runs of mcgpo with seed 0$"):
        paired_differences([run("mcgpo", 0, [0.1]), run("mcgpo", 0, [0.2])])
    with pytest.raises(ValueError, match=r"^baseline 'gigpo' has no runs; methods: mcgpo$"):
        paired_differences([run("mcgpo", 0, [0.1])], baseline="gigpo")
    with pytest.raises(ValueError, match="no evaluation points"):
        paired_differences([RunResult("mcgpo", 0, ())])
    with pytest.raises(ValueError, match="non-finite"):
        paired_differences([run("graphgpo", 0, [0.1]), run("mcgpo", 0, [float("nan")])])


def test_rendered_under_the_main_table():
    runs = [run("graphgpo", s, [0.0, 0.0]) for s in (0, 1, 2)]
    runs += [run("mcgpo", s, [0.0, s + 1.0]) for s in (0, 1, 2)]
    runs += [run("grpo", 0, [0.0, -0.25])]
    md = render_results_md(summarise(runs), title="t", paired=paired_differences(runs))
    main_table, paired = md.split("## Paired difference against graphgpo")
    assert "| graphgpo | 3 |" in main_table and "Integrated success |" in main_table
    lines = paired.splitlines()
    assert lines[0] == " (method - graphgpo, per seed)"
    assert lines[2].startswith("| Method | n | Final success Δ | 95 % t-interval | MDE (80 %) |")
    # final: 100 x (2 +- 2.48414) and 100 x 3.2640 (test_golden_one_two_three); integrated:
    # half of each
    assert (
        "| mcgpo | 3 | +200.0 | [-48.4, +448.4] | 326.4 | +100.0 | [-24.2, +224.2] | 163.2 |"
        in lines
    )
    assert "| grpo | 1 | -25.0 | n/a | n/a | -12.5 | n/a | n/a |" in lines
    assert "paired t-interval Δ ± t(0.975, n−1) · SD / √n" in paired
    assert "detects with 80 % power" in paired and "noncentral t" in paired
    assert "These sections print 2 intervals" in paired  # grpo's single seed has none
    # without paired differences the table is as before
    assert "Paired" not in render_results_md(summarise(runs), title="t")


def test_one_section_per_baseline_and_ablate_adds_mcgpo(tmp_path, capsys):
    # Final successes per seed: graphgpo 0.1 / 0.2, mcgpo 0.2 / 0.4, control 0.3 / 0.4.
    # Against graphgpo: mcgpo +10 / +20 -> +15.0; control +20 / +20 -> +20.0.
    # Against mcgpo: graphgpo -10 / -20 -> -15.0; control +10 / 0 -> +5.0.
    from mcgpo.bench.report import write_results

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
    write_results("ablate", tmp_path, runs, [])
    assert (tmp_path / "results.md").read_text().count("## Paired difference against ") == 2
    write_results("bench", tmp_path, runs, [])
    assert (tmp_path / "results.md").read_text().count("## Paired difference against ") == 1
    capsys.readouterr()
