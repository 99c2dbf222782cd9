"""Group-sequential boundaries, a look's decision and the design's power
(mcgpo.bench.sequential, issue 35 step 4): published boundaries, boundaries and power checked
by simulating the canonical process, a look's decision by hand, `--sequential` on a folder."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mcgpo.bench.intervals import detectable_effect_in_sd
from mcgpo.bench.runner import DONE_MARKER
from mcgpo.bench.sequential import (
    Decision,
    alpha_spent,
    design_power,
    evaluate_look,
    look_fractions,
    look_index,
    nominal_thresholds,
    simulated_power,
    spending_boundaries,
)
from mcgpo.cli import main

LOOKS = (16, 24, 32, 40)  # issue 35 step 4's looks, in paired seeds
Z975 = 1.959964  # z_{0.975}
Z9875 = 2.2414027  # z_{1 - 0.05/4}: the O'Brien-Fleming-type function's quantile, per side


# --- boundaries --------------------------------------------------------------------------


def test_published_obrien_fleming_boundaries():
    # Lan-DeMets O'Brien-Fleming-type spending, two-sided alpha = 0.05, equally spaced looks,
    # as printed by DeMets & Lan (1994, Stat. Med. 13:1341, table 1) and by the R package
    # ldbounds, bounds((1:K)/K, iuse = 1, alpha = 0.05, side = 2):
    #   K = 1: 1.960;  K = 2: 2.963, 1.969;  K = 4: 4.333, 2.963, 2.359, 2.014.
    # The first boundary by hand, K = 2: each side spends 2 (1 - Phi(z_{0.9875} / sqrt(0.5)))
    # = 2 (1 - Phi(3.16982)) = 2 * 0.000763 = 0.001525 at t = 0.5, so c_1 = z_{1 - 0.001525}
    # = 2.963. The later ones need the joint normal (they exceed the one-look quantile of
    # the increment, as the check below shows).
    assert spending_boundaries([1.0]) == pytest.approx([Z975], abs=1e-5)
    assert spending_boundaries([0.5, 1.0]) == pytest.approx([2.963, 1.969], abs=1e-3)
    four = spending_boundaries([0.25, 0.5, 0.75, 1.0])
    assert four == pytest.approx([4.333, 2.963, 2.359, 2.014], abs=1e-3)
    # the last boundary is above the fixed-sample 1.96: the early looks cost a little power
    assert four[-1] > Z975


def test_first_boundary_and_spending_by_hand():
    # Our looks: t_1 = 16/40 = 0.4. Each side spends 2 (1 - Phi(2.241403 / sqrt(0.4)))
    # = 2 (1 - Phi(3.543928)) = 2 * 0.00019703 = 0.00039406, so alpha*(0.4) = 0.00078812 and
    # c_1 = z_{1 - 0.00039406} = 3.3569.
    t = look_fractions(LOOKS)
    assert t == pytest.approx([0.4, 0.6, 0.8, 1.0])
    spent = alpha_spent(t)
    assert spent[0] == pytest.approx(4 * stats.norm.sf(Z9875 / math.sqrt(0.4)), rel=1e-6)
    assert spent[0] == pytest.approx(0.000788, abs=1e-6) and spent[-1] == pytest.approx(0.05)
    c = spending_boundaries(t)
    assert c[0] == pytest.approx(3.3569, abs=1e-4)
    # pinned to 3 decimals (checked by simulation below) and their nominal p thresholds
    assert c == pytest.approx([3.357, 2.680, 2.290, 2.031], abs=1e-3)
    assert nominal_thresholds(c) == pytest.approx([0.00079, 0.00736, 0.02203, 0.04225], abs=2e-5)
    # Pocock-type: alpha*(t) = 0.05 log(1 + (e - 1) t); at t = 0.25 that is
    # 0.05 log(1.429570) = 0.0178685, so c_1 = z_{1 - 0.0089343} = 2.3683; K = 1 is 1.96
    pocock = spending_boundaries([0.25, 0.5, 0.75, 1.0], kind="pocock")
    assert pocock[0] == pytest.approx(2.3683, abs=1e-4)
    assert spending_boundaries([1.0], kind="pocock") == pytest.approx([Z975], abs=1e-5)
    # nearly flat, as Pocock's boundaries are
    assert np.ptp(pocock) < 0.03


def canonical_paths(fractions, draws: int, drift: float = 0.0, seed: int = 0) -> np.ndarray:
    """Z_k = B(t_k) / sqrt(t_k) for a Brownian motion with drift theta (Z_k has mean
    theta sqrt(t_k) and Corr(Z_i, Z_j) = sqrt(t_i / t_j)): the canonical process, built from
    independent increments, not from the covariance matrix the module uses."""
    t = np.asarray(fractions)
    steps = np.diff(t, prepend=0.0)
    rng = np.random.default_rng(seed)
    b = np.cumsum(rng.standard_normal((draws, t.size)) * np.sqrt(steps) + drift * steps, axis=1)
    return b / np.sqrt(t)


def first_crossings(z: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The share of paths that first cross at each look (a last column for none)."""
    hit = np.abs(z) >= c
    first = np.where(hit.any(axis=1), hit.argmax(axis=1), c.size)
    return np.bincount(first, minlength=c.size + 1) / z.shape[0]


@pytest.mark.parametrize(
    ("fractions", "kind"),
    [
        (np.array(LOOKS) / 40, "obrien_fleming"),
        ((0.25, 0.5, 0.75, 1.0), "obrien_fleming"),
        ((0.25, 0.5, 0.75, 1.0), "pocock"),
    ],
)
def test_simulated_null_spends_alpha_as_planned(fractions, kind):
    # 400,000 null paths: the SE of a rate p is sqrt(p (1 - p) / 4e5), 0.00034 at p = 0.05;
    # each look's share of first crossings must match its increment of alpha*(t) within 4 SE
    draws = 400_000
    c = spending_boundaries(fractions, kind=kind)
    shares = first_crossings(canonical_paths(fractions, draws, seed=1), c)[:-1]
    increments = np.diff(alpha_spent(fractions, kind=kind), prepend=0.0)
    se = np.sqrt(increments * (1 - increments) / draws)
    assert np.all(np.abs(shares - increments) <= 4 * se + 1e-6), (shares, increments)
    total_se = math.sqrt(0.05 * 0.95 / draws)
    assert abs(shares.sum() - 0.05) <= 4 * total_se


# --- a look ------------------------------------------------------------------------------


def t_quantile_df2(q: float) -> float:
    """t quantile with 2 degrees of freedom in closed form: (2q - 1) / sqrt(2 q (1 - q))."""
    return (2 * q - 1) / math.sqrt(2 * q * (1 - q))


def test_golden_look():
    # d = 1, 2, 3: mean 2, SD 1, n = 3, t = 2 / (1 / sqrt 3) = 3.464102. With 2 df the
    # two-sided p-value is 1 - |t| / sqrt(t^2 + 2) = 1 - 3.464102 / sqrt(14) = 0.074180.
    p = 1 - math.sqrt(12) / math.sqrt(14)
    # a one-look design (1.96, threshold 0.05): p > 0.05, the comparison ends undecided
    r = evaluate_look([1.0, 2.0, 3.0], [Z975], 0)
    assert (r.n, r.mean, r.sd) == (3, pytest.approx(2.0), pytest.approx(1.0))
    assert r.t == pytest.approx(math.sqrt(12)) and r.p == pytest.approx(p, rel=1e-6)
    assert r.threshold == pytest.approx(0.05, abs=1e-6)
    assert r.decision is Decision.NO_DIFFERENCE and (r.look, r.looks) == (1, 1)
    # the repeated CI at level 0.95 is the ordinary t-interval: 2 +- 4.302653 / sqrt(3)
    half = t_quantile_df2(0.975) / math.sqrt(3)
    assert r.interval == pytest.approx((2 - half, 2 + half), abs=1e-5)
    # the first of two looks at boundary 1.644854 (threshold 0.10): p < 0.10, stop; its
    # interval (90 %) excludes 0. The mirrored differences stop for the baseline.
    r = evaluate_look([1.0, 2.0, 3.0], [1.644854, 1.96], 0)
    assert r.threshold == pytest.approx(0.10, abs=1e-6)
    assert r.decision is Decision.METHOD_BETTER and r.decision.text("mcgpo", "graphgpo") == (
        "stop: mcgpo better"
    )
    half = t_quantile_df2(0.95) / math.sqrt(3)  # t_{0.95, 2} = 2.919986
    assert r.interval == pytest.approx((2 - half, 2 + half), abs=1e-5) and r.interval[0] > 0
    r = evaluate_look([-1.0, -2.0, -3.0], [1.644854, 1.96], 0)
    assert r.decision is Decision.BASELINE_BETTER and r.t == pytest.approx(-math.sqrt(12))
    assert r.decision.text("mcgpo", "graphgpo") == "stop: graphgpo better"
    # not past an interim boundary: continue (the interval at level 1 - 0.002 includes 0)
    r = evaluate_look([1.0, 2.0, 3.0], [3.090232, 1.96], 0)
    assert r.decision is Decision.CONTINUE and r.interval[0] < 0 < r.interval[1]
    assert r.level == pytest.approx(0.998, abs=1e-6)


def test_a_look_without_spread():
    # equal differences: the sign is certain (p = 0) unless they are all 0 (p = 1)
    r = evaluate_look([0.5, 0.5], [4.0, 1.96], 0)
    assert r.p == 0.0 and r.t == math.inf and r.decision is Decision.METHOD_BETTER
    assert r.interval == (0.5, 0.5)
    r = evaluate_look([0.0, 0.0, 0.0], [4.0, 1.96], 1)
    assert r.p == 1.0 and r.decision is Decision.NO_DIFFERENCE


@settings(max_examples=200, deadline=None)
@given(
    diffs=st.lists(
        st.floats(-10, 10, allow_nan=False).map(lambda x: round(x, 3)), min_size=2, max_size=12
    ),
    index=st.integers(0, 3),
)
def test_a_look_stops_exactly_when_its_interval_excludes_zero(diffs, index):
    c = spending_boundaries(look_fractions(LOOKS))
    r = evaluate_look(diffs, c, index)
    stopped = r.decision in (Decision.METHOD_BETTER, Decision.BASELINE_BETTER)
    assert stopped == (r.p <= r.threshold)
    if r.sd > 1e-9 and abs(r.p - r.threshold) > 1e-9:
        assert stopped == (r.interval[0] > 0 or r.interval[1] < 0)
    if stopped:
        assert (r.decision is Decision.METHOD_BETTER) == (r.mean > 0)
    else:
        final = index == 3
        assert r.decision is (Decision.NO_DIFFERENCE if final else Decision.CONTINUE)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: evaluate_look([1.0], [1.96], 0), "at least 2 paired differences, got 1"),
        (lambda: evaluate_look([1.0, math.nan], [1.96], 0), "must be finite"),
        (lambda: evaluate_look([1.0, 2.0], [3.0, 1.96], 2), "look index 2 is outside"),
        (lambda: evaluate_look([1.0, 2.0], [], 0), "boundaries must be finite and > 0"),
        (lambda: spending_boundaries([0.5, 0.4, 1.0]), "information fractions must increase"),
        (lambda: spending_boundaries([0.5, 0.9]), "the last information fraction must be 1"),
        (lambda: spending_boundaries([0.0, 1.0]), "must be finite and > 0"),
        (lambda: spending_boundaries([1.0], alpha=1.5), "alpha must be in (0, 1)"),
        (lambda: spending_boundaries([1.0], kind="haybittle"), "unknown spending kind"),
        (lambda: look_fractions([16, 16, 40]), "looks must increase"),
        (lambda: look_fractions([1, 40]), "whole seed counts >= 2"),
        (lambda: look_index(15, LOOKS), "15 paired seeds is not a planned look (16, 24"),
        (lambda: design_power(1.0, 0.0, LOOKS), "sigma must be finite and > 0"),
        (lambda: simulated_power(1.0, 1.0, LOOKS, draws=0), "draws must be >= 1"),
    ],
)
def test_bad_input_is_a_one_line_value_error(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value) and "\n" not in str(err.value)


# --- power -------------------------------------------------------------------------------


def test_one_look_power_is_the_fixed_sample_power():
    # one look at 40 seeds is the fixed-sample test. Known SD (the canonical integral):
    # theta = 1.0 sqrt(40) / 2.31 = 2.737882, power = Phi(theta - 1.96) + Phi(-theta - 1.96)
    # = Phi(0.777918) + Phi(-4.697846) = 0.781689.
    z = design_power(1.0, 2.31, (40,))
    assert z.power == pytest.approx(0.781689, abs=1e-5)
    assert z.stop == pytest.approx((z.power,)) and z.expected_n == 40.0
    # the t-test procedure (simulated) at the t-test's exact MDE (intervals.py, noncentral
    # t): 80 % power; at 0: 5 %. 200,000 draws: SE 0.0009 and 0.0005, tolerance 4 SE.
    sim = simulated_power(detectable_effect_in_sd(40) * 2.31, 2.31, (40,), seed=3)
    assert sim.power == pytest.approx(0.80, abs=4 * sim.se) and sim.se < 0.001
    null = simulated_power(0.0, 2.31, (40,), seed=4)
    assert null.power == pytest.approx(0.05, abs=4 * null.se)


def test_design_power_matches_the_simulated_canonical_process():
    # drift theta = delta sqrt(n_K) / sigma at delta = 1.0, sigma = 2.31 (issue 25's SD of
    # the paired differences of integrated success): first crossings of 400,000 simulated
    # paths (SE <= 0.0007 per look) against the integral, within 4 SE
    t = look_fractions(LOOKS)
    c = spending_boundaries(t)
    theta = 1.0 * math.sqrt(40) / 2.31
    shares = first_crossings(canonical_paths(t, 400_000, drift=theta, seed=2), c)[:-1]
    design = design_power(1.0, 2.31, LOOKS)
    assert np.abs(np.array(design.stop) - shares).max() < 4 * math.sqrt(0.25 / 400_000)
    assert design.power == pytest.approx(shares.sum(), abs=4 * math.sqrt(0.25 / 400_000))
    assert design.power == pytest.approx(sum(design.stop))
    # E[N] = sum_k n_k P(stop at k) + 40 P(no stop before the last look)
    expected = float(np.dot(LOOKS[:3], shares[:3]) + 40 * (1 - shares[:3].sum()))
    assert design.expected_n == pytest.approx(expected, abs=0.05)
    # pinned: 77.2 % power, 32.7 seeds expected; the fixed 40-seed design has 78.2 %
    assert (design.power, design.expected_n) == (
        pytest.approx(0.7716, abs=1e-3),
        pytest.approx(32.69, abs=0.02),
    )


def test_the_t_procedure_keeps_alpha_and_loses_a_little_power():
    # the t-test at the nominal thresholds estimates sigma at each look: its overall error
    # is not exactly the z design's 5 % (simulated with 2,000,000 draws: 5.13 %, SE
    # 0.016 %), and its power is below the known-sigma integral (75.0 % against 77.2 % at
    # delta = 1.0, sigma = 2.31)
    null = simulated_power(0.0, 1.0, LOOKS, draws=100_000, seed=5)
    assert abs(null.power - 0.05) < 0.005
    sim = simulated_power(1.0, 2.31, LOOKS, draws=100_000, seed=6)
    design = design_power(1.0, 2.31, LOOKS)
    assert sim.power < design.power and sim.power == pytest.approx(0.750, abs=4 * sim.se)
    assert LOOKS[0] < sim.expected_n < LOOKS[-1]
    # power grows with the true difference
    powers = [design_power(d, 2.31, LOOKS).power for d in (0.0, 0.5, 1.0, 1.5)]
    assert powers[0] == pytest.approx(0.05, abs=1e-4) and np.all(np.diff(powers) > 0)


# --- `mcgpo bench --report-only --sequential` ----------------------------------------------


def write_run(folder, successes):
    folder.mkdir(parents=True)
    records = [{"update": 4 * i, "eval/success": s} for i, s in enumerate(successes)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / DONE_MARKER).write_text("{}\n")


def bench_folder(tmp_path, gains):
    """graphgpo at success 0.4, 0.4 per seed; mcgpo at 0.4, 0.4 + 2 g: its integrated
    success (the mean of the two points) is higher by g."""
    out = tmp_path / "bench"
    for seed, gain in enumerate(gains):
        write_run(out / "runs" / f"graphgpo-s{seed}", [0.4, 0.4])
        write_run(out / "runs" / f"mcgpo-s{seed}", [0.4, 0.4 + 2 * gain])
    return out


def bench(out, looks, seeds="0,1,2"):
    argv = ["bench", "--algos", "graphgpo,mcgpo", "--seeds", seeds, "--out", str(out)]
    return main([*argv, "--report-only", "--sequential", looks])


def test_sequential_look_section(tmp_path, capsys):
    # integrated differences 0.05, 0.10, 0.15: mean 0.10, SD 0.05, t = 3.464102, p = 0.074180
    # (2 df, as in test_golden_look). Looks at 3 and 6 seeds: fractions 0.5 and 1, the
    # published boundaries 2.963, 1.969; look 1's threshold 2 (1 - Phi(2.963)) = 0.00305:
    # continue. Its repeated CI: 0.10 +- t_{1 - 0.001525, 2} * 0.05 / sqrt(3) = 0.10 +-
    # 18.063 * 0.028868 = 0.10 +- 0.521.
    out = bench_folder(tmp_path, [0.05, 0.10, 0.15])
    assert bench(out, "3,6") == 0
    md = (out / "results.md").read_text()
    assert md == capsys.readouterr().out.rstrip("\n") + "\n"
    assert "## Group-sequential look (integrated success, method - graphgpo, per seed)" in md
    assert "Design: looks at 3, 6 paired seeds, two-sided α = 0.05, Lan–DeMets " in md
    assert "| 1 | 3 | 0.500 | 0.00305 | 2.963 | 0.00305 |" in md
    assert "| 2 | 6 | 1.000 | 0.05000 | 1.969 |" in md
    threshold = 2 * stats.norm.sf(2.962588)
    half = 100 * t_quantile_df2(1 - threshold / 2) * 0.05 / math.sqrt(3)
    ci = f"[{10 - half:+.1f}, {10 + half:+.1f}] ({100 * (1 - threshold):.2f} %)"
    assert ci == "[-42.1, +62.1] (99.69 %)"
    assert f"| mcgpo | 1 of 2 | 3 | +10.0 | 3.46 | 0.07418 | 0.00305 | {ci} | continue |" in md
    # one look only (boundary 1.96): the same data end the comparison undecided
    assert bench(out, "3") == 0
    assert "| 0.07418 | 0.05000 | [-2.4, +22.4] (95.00 %) | final: no difference shown |" in (
        (out / "results.md").read_text()
    )
    capsys.readouterr()


def test_every_look_held_so_far_is_a_row_and_drawn(tmp_path, capsys):
    # 6 seeds, looks at 3 and 6: look 1 on the first 3 (0.05, 0.10, 0.15: as above), look 2
    # on all 6 (0.05 ... 0.30: mean 0.175, SD 0.0935414, t = 4.582576, 5 df, p = 0.005934
    # <= look 2's threshold 2 (1 - Phi(1.968596)) = 0.04900 (the table's boundary 1.969
    # unrounded; about alpha less what look 1 spent): stop, mcgpo better)
    out = bench_folder(tmp_path, [0.05, 0.10, 0.15, 0.20, 0.25, 0.30])
    assert bench(out, "3,6", seeds="0,1,2,3,4,5") == 0
    md = (out / "results.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| mcgpo | ")]
    assert rows[-2].startswith("| mcgpo | 1 of 2 | 3 | +10.0 | 3.46 | 0.07418 | 0.00305 |")
    assert rows[-2].endswith("| continue |")
    d = np.array([0.05, 0.10, 0.15, 0.20, 0.25, 0.30])
    t = d.mean() / (d.std(ddof=1) / math.sqrt(6))
    assert t == pytest.approx(4.582576, abs=1e-6)
    assert rows[-1].startswith(f"| mcgpo | 2 of 2 | 6 | +17.5 | {t:.2f} | 0.00593 | 0.04900 |")
    assert rows[-1].endswith("| stop: mcgpo better |")
    png = out / "sequential.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()


def test_sequential_look_stops(tmp_path, capsys):
    # differences 0.10, 0.11, 0.12: t = 0.11 / (0.01 / sqrt 3) = 19.052559, p = 1 -
    # t / sqrt(t^2 + 2) = 1 - 19.052559 / 19.104973 = 0.002743 <= 0.00305: stop at look 1
    out = bench_folder(tmp_path, [0.10, 0.11, 0.12])
    assert bench(out, "3,6") == 0
    assert "| 19.05 | 0.00274 | 0.00305 |" in (out / "results.md").read_text()
    assert "| stop: mcgpo better |" in (out / "results.md").read_text()
    capsys.readouterr()


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_sequential_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    out = bench_folder(tmp_path, [0.05, 0.10, 0.15])
    assert bench(out, "4,8") == 2
    assert one_line_error(capsys) == (
        "mcgpo bench: error: --sequential: mcgpo - graphgpo: 3 paired seeds is not a planned "
        "look (4, 8); a look held at another count of seeds is given as that count"
    )
    assert bench(out, "6,3") == 2
    assert (
        one_line_error(capsys)
        == "mcgpo bench: error: --sequential: looks must increase, got [6, 3]"
    )
    assert bench(out, "3,x") == 2
    assert "--sequential must be integers, got '3,x'" in one_line_error(capsys)
    argv = ["bench", "--algos", "graphgpo,mcgpo", "--out", str(out), "--sequential", "3,6"]
    assert main(argv) == 2
    assert "--sequential needs --report-only" in one_line_error(capsys)
