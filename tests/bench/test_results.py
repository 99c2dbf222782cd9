"""Benchmark table and plot writers on small synthetic results."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mcgpo.bench.plots import curve_bands, plot_learning_curves, plot_task_type_bars
from mcgpo.bench.results import (
    EvalPoint,
    RunResult,
    format_mean_sd,
    mean_sd,
    render_results_md,
    summarise,
    write_points_jsonl,
)


def _run(method, seed, successes, per_type=None, score=None, secs=None, prefs=None):
    points = tuple(
        EvalPoint(
            method,
            seed,
            update=5 * i,
            success=s,
            per_type=(per_type or {}) if i == len(successes) - 1 else {},
            score=score,
        )
        for i, s in enumerate(successes)
    )
    return RunResult(method, seed, points, seconds_per_update=secs, preference_stats=prefs or {})


def test_mean_sd_golden():
    # values 0.2, 0.4, 0.6: mean 0.4; squared deviations 0.04 + 0 + 0.04 = 0.08;
    # sample variance 0.08 / (3 - 1) = 0.04 -> SD 0.2
    m, sd = mean_sd([0.2, 0.4, 0.6])
    assert m == pytest.approx(0.4) and sd == pytest.approx(0.2)
    assert mean_sd([0.7]) == (0.7, 0.0)
    assert format_mean_sd((0.4, 0.2)) == "40.0 ± 20.0"
    with pytest.raises(ValueError, match="no values"):
        mean_sd([])


def test_summarise_final_integrated_and_types():
    runs = [
        _run(
            "mcgpo",
            0,
            [0.0, 0.5],
            {"pick_and_place_simple": 1.0},
            secs=10.0,
            prefs={"preferences": 4.0, "exact": 3.0},
        ),
        _run(
            "mcgpo",
            1,
            [0.2, 0.7],
            {"pick_and_place_simple": 0.5},
            secs=12.0,
            prefs={"preferences": 2.0, "exact": 1.0},
        ),
        _run("graphgpo", 0, [0.1, 0.3], {"pick_and_place_simple": 0.0}, secs=9.0),
    ]
    s = {x.method: x for x in summarise(runs)}
    # final success: seeds 0.5 and 0.7 -> mean 0.6; SD = sqrt(((-.1)^2 + .1^2) / 1) = 0.1414
    assert s["mcgpo"].final_success == pytest.approx((0.6, 0.1414213), abs=1e-6)
    # integrated: seed 0 mean(0, .5) = .25, seed 1 mean(.2, .7) = .45 -> mean .35, SD .1414
    assert s["mcgpo"].integrated_success == pytest.approx((0.35, 0.1414213), abs=1e-6)
    assert s["mcgpo"].per_type["pick_and_place_simple"] == pytest.approx((0.75, 0.3535534))
    assert s["mcgpo"].preference_stats["preferences"] == pytest.approx((3.0, 1.4142136))
    assert s["graphgpo"].final_success == (0.3, 0.0)
    md = render_results_md(list(s.values()), title="t", header_lines=["machine: x"])
    assert "| mcgpo | 2 | 60.0 ± 14.1 | 35.0 ± 14.1 | 75.0 ± 35.4 | 11.0 ± 1.4 |" in md
    assert "| Method | Seeds | Success (final) | Integrated success | Pick | s / update |" in md
    assert "## Preference statistics" in md
    # only the documented columns, and only for methods that build preferences
    assert "| Method | exact |" in md and "| mcgpo | 2.000 ± 1.414 |" in md
    assert "| graphgpo |" not in md.split("## Preference statistics")[1]


def test_summarise_rejects_empty_run():
    with pytest.raises(ValueError, match="no evaluation points"):
        summarise([RunResult("grpo", 0, ())])


def test_points_jsonl_roundtrip(tmp_path):
    runs = [_run("grpo", 0, [0.1, 0.2], score=0.5)]
    path = tmp_path / "evals.jsonl"
    write_points_jsonl(path, runs)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["success"] for r in rows] == [0.1, 0.2]
    assert rows[0]["method"] == "grpo" and rows[1]["update"] == 5


def test_curve_band_is_mean_and_sd_over_seeds(tmp_path):
    runs = [_run("a", 0, [0.0, 0.4]), _run("a", 1, [0.2, 0.8])]
    updates, mean, sd = curve_bands(runs)["a"]
    assert updates.tolist() == [0, 5]
    np.testing.assert_allclose(mean, [0.1, 0.6])
    # SD of (0, .2) = .1414; of (.4, .8) = .2828
    np.testing.assert_allclose(sd, [0.1414213, 0.2828427], atol=1e-6)
    png = plot_learning_curves(runs, tmp_path / "curves.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_band_is_drawn(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.collections import PolyCollection

    import mcgpo.bench.plots as plots

    drawn = []
    real_fill = matplotlib.axes.Axes.fill_between

    def spy(self, *a, **k):
        out = real_fill(self, *a, **k)
        drawn.append(out)
        return out

    matplotlib.axes.Axes.fill_between = spy
    try:
        plots.plot_learning_curves(
            [_run("a", 0, [0.0, 0.4]), _run("a", 1, [0.2, 0.8])], tmp_path / "c.png"
        )
    finally:
        matplotlib.axes.Axes.fill_between = real_fill
    assert len(drawn) == 1 and isinstance(drawn[0], PolyCollection)


def test_task_type_bars(tmp_path):
    runs = [_run("a", 0, [0.5], {"pick_two_obj_and_place": 0.5, "look_at_obj_in_light": 1.0})]
    png = plot_task_type_bars(summarise(runs), tmp_path / "bars.png")
    assert png.stat().st_size > 1000


def test_write_atomic_gives_the_usual_permissions(tmp_path):
    # mkstemp's files are owner-only (0600); results.md and evals.jsonl are meant to be read
    import os

    from mcgpo.bench.results import write_atomic

    umask = os.umask(0)
    os.umask(umask)
    target = tmp_path / "sub" / "results.md"
    write_atomic(target, "x\n")
    assert target.read_text() == "x\n"
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in target.parent.iterdir()] == ["results.md"]  # no temp file left
