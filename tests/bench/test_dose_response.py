"""benchmarks/dose_response.py: the dose-response table and step 3's rule on made-up runs."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
dose = importlib.import_module("dose_response")


def make_run(bench: Path, lam: str, seed: int, w: float, a: float, done: bool = True) -> None:
    folder = bench / "runs" / f"mcgpo-lambda_pair={lam}-s{seed}"
    folder.mkdir(parents=True)
    rows = [
        {"update": 0, "eval/success": 0.5},
        {"update": 1, "update/rows": 10.0, "pairs/weighted_margin_after": w - 0.01,
         "pairs/accuracy_after": a, "pairs/grad_ratio": 0.1},
        {"update": 2, "update/rows": 10.0, "pairs/weighted_margin_after": w + 0.01,
         "pairs/accuracy_after": a, "pairs/grad_ratio": 0.3},
        {"update": 2, "eval/success": 0.6},
    ]  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if done:
        (folder / "bench-done.json").write_text("{}")


def test_the_rule_picks_the_smallest_lambda_that_moves_the_ranking(tmp_path):
    # W is the mean over updates: (w - 0.01 + w + 0.01) / 2 = w. lambda 0: W 0.01, A 0.6.
    # lambda 1: W above on seed 1 but not seed 2 -> does not move;
    # lambda 3: W above on both, A gain (0.64 + 0.66)/2 - 0.6 = 0.05 -> moves (>= 0.05);
    # lambda 10: moves too, but 3 is smaller.
    for seed in (1, 2):
        make_run(tmp_path, "0", seed, 0.01, 0.6)
        make_run(tmp_path, "10", seed, 0.08, 0.8)
    make_run(tmp_path, "1", 1, 0.03, 0.7)
    make_run(tmp_path, "1", 2, 0.005, 0.7)
    make_run(tmp_path, "3", 1, 0.02, 0.64)
    make_run(tmp_path, "3", 2, 0.02, 0.66)
    runs = dose.finished_runs(tmp_path)
    assert runs[(3.0, 1)]["pairs/weighted_margin_after"] == 0.02
    assert runs[(3.0, 1)]["integrated"] == 55.0 and runs[(3.0, 1)]["final"] == 60.0
    chosen, verdict = dose.choose_lambda(runs, [1, 2])
    assert verdict[1.0][0] is False and verdict[3.0] == (True, verdict[3.0][1])
    assert abs(verdict[3.0][1] - 0.05) < 1e-12
    assert chosen == 3.0
    assert dose.main([str(tmp_path), "--seeds", "1,2", "--values", "0,1,3,10"]) == 0


def test_no_moving_lambda_and_unfinished_runs(tmp_path, capsys):
    for seed in (1, 2):
        make_run(tmp_path, "0", seed, 0.01, 0.6)
        make_run(tmp_path, "1", seed, 0.02, 0.62)  # W above, A gain 0.02 < 0.05
    assert dose.choose_lambda(dose.finished_runs(tmp_path), [1, 2])[0] is None
    make_run(tmp_path, "3", 1, 0.05, 0.9, done=False)  # no done-marker: not finished
    assert dose.main([str(tmp_path), "--seeds", "1,2", "--values", "0,1,3"]) == 1
    assert "λ 3 seed 1, λ 3 seed 2" in capsys.readouterr().err
