"""``mcgpo report --plot``: the curves of one or several runs from their metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcgpo.cli import main
from mcgpo.training.curves import PANELS, curve_figure, plot_runs, run_curves


def write_run(folder: Path, records: list[dict]) -> Path:
    folder.mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in records)
    (folder / "metrics.jsonl").write_text(text, encoding="utf-8")
    return folder


def mcgpo_run(folder: Path) -> Path:
    """Evaluations at updates 0 and 2, two updates with every loss (pair included)."""
    return write_run(
        folder,
        [
            {"update": 0, "time": 0.1, "eval/success": 0.25, "eval/score": 0.5, "eval/episodes": 4},
            {"update": 1, "time": 1.0, "rollout/success_rate": 0.125, "rollout/score_mean": 0.2,
             "loss/policy": -0.01, "loss/kl": 0.0, "loss/pair": 0.69, "loss/task": -0.01},
            {"update": 2, "time": 2.0, "rollout/success_rate": 0.375, "rollout/score_mean": 0.4,
             "loss/policy": -0.02, "loss/kl": 0.001, "loss/pair": "nan", "loss/task": -0.02},
            {"update": 2, "time": 2.5, "eval/success": 0.5, "eval/score": 0.75, "eval/episodes": 4},
        ],
    )  # fmt: skip


def grpo_run(folder: Path) -> Path:
    """No pair loss, no evaluation score."""
    return write_run(
        folder,
        [
            {"update": 0, "eval/success": 0.25, "eval/episodes": 4},
            {"update": 1, "rollout/success_rate": 0.25, "rollout/score_mean": 0.25,
             "loss/policy": 0.01, "loss/kl": 0.0},
        ],
    )  # fmt: skip


def test_run_curves_read_each_metric_at_its_updates(tmp_path):
    curves = run_curves(mcgpo_run(tmp_path / "a"))
    assert curves["eval/success"] == ([0, 2], [0.25, 0.5])
    assert curves["rollout/success_rate"] == ([1, 2], [0.125, 0.375])
    assert curves["loss/pair"] == ([1], [0.69])  # "nan" (JSON has none) is left out
    assert "loss/task" not in curves  # not drawn
    assert run_curves(tmp_path / "nothing") == {}


def test_the_figure_has_one_line_per_run_and_logged_metric(tmp_path):
    runs = {"a": run_curves(mcgpo_run(tmp_path / "a")), "b": run_curves(grpo_run(tmp_path / "b"))}
    fig = curve_figure(runs)
    assert [ax.get_title() for ax in fig.axes] == list(PANELS)
    # success: a train+eval, b train+eval; return: a train+eval, b train only;
    # losses: a policy+kl+pair, b policy+kl
    assert [len(ax.get_lines()) for ax in fig.axes] == [4, 3, 5]
    labels = [line.get_label() for line in fig.axes[2].get_lines()]
    assert labels == ["a: policy", "a: kl", "a: pair", "b: policy", "b: kl"]
    (eval_a,) = [line for line in fig.axes[0].get_lines() if line.get_label() == "a: eval"]
    assert list(eval_a.get_xdata()) == [0, 2] and list(eval_a.get_ydata()) == [0.25, 0.5]
    assert eval_a.get_linestyle() == "--"


def test_report_plot_writes_a_png_for_one_and_for_several_runs(tmp_path, capsys, monkeypatch):
    a, b = mcgpo_run(tmp_path / "a"), grpo_run(tmp_path / "b")
    assert main(["report", str(a), "--plot"]) == 0
    png = a / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "held-out success" in out and out.rstrip().endswith(f"curves: {png}")
    # --plot before the folders takes a folder as the first run (not a PNG path)
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--plot", str(a), str(b)]) == 0
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    target = tmp_path / "plots" / "ab.png"
    assert main(["report", str(a), str(b), "--plot", str(target)]) == 0
    assert target.stat().st_size > 10_000 and not list(target.parent.glob("*.partial"))


def test_report_plot_bad_input_is_one_line_exit_2(tmp_path, capsys):
    empty = write_run(tmp_path / "empty", [{"update": 0, "eval/episodes": 2}])
    assert main(["report", "--plot"]) == 2
    assert capsys.readouterr().err == "mcgpo report: error: name at least one run folder\n"
    with pytest.raises(ValueError, match=r"'.*empty' has no curves in metrics\.jsonl"):
        plot_runs([empty], tmp_path / "x.png")
    blocker = tmp_path / "file"
    blocker.write_text("")
    a = mcgpo_run(tmp_path / "a")
    assert main(["report", str(a), "--plot", str(blocker / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mcgpo report: error: --plot ") and err.count("\n") == 1
