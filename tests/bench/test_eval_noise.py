"""benchmarks/eval_noise.py: per-stream evaluations whose prefixes are the smaller sizes.

The benchmark reads an n-task evaluation as the first n episodes of one larger evaluation
with the same stream; that holds only if an episode's sampling does not depend on how many
other tasks are played beside it. Tested here on the micro policy of tests/conftest.py.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
noise = importlib.import_module("eval_noise")
TURNS = 4  # short episodes keep the evaluations cheap; the prefix property is per episode


def episodes(table) -> dict[int, list[str]]:
    """Task index -> the episode's actions, in turn order."""
    out: dict[int, list[str]] = {}
    for group, _turn, action in sorted(
        zip(table.group.tolist(), table.turn.tolist(), table.action.tolist(), strict=True)
    ):
        out.setdefault(group, []).append(action)
    return out


def test_a_smaller_evaluation_is_the_prefix_of_a_larger_one(micro_model, tmp_path):
    small, _ = noise.evaluation_table(
        "household-smoke", str(micro_model), 3, 3, 1, tmp_path / "a", TURNS
    )
    large, _ = noise.evaluation_table(
        "household-smoke", str(micro_model), 3, 6, 1, tmp_path / "b", TURNS
    )
    other, _ = noise.evaluation_table(
        "household-smoke", str(micro_model), 4, 3, 1, tmp_path / "c", TURNS
    )
    a, b, c = episodes(small), episodes(large), episodes(other)
    assert sorted(a) == [0, 1, 2] and sorted(b) == list(range(6))
    assert all(a[t] == b[t] for t in a)  # the same episodes, action for action
    assert any(a[t] != c[t] for t in a)  # another stream plays them differently
    assert noise.successes_by_task(large, 6)[:3] == noise.successes_by_task(small, 3)


def test_summary_golden():
    # stream 0: tasks 1 1 0 0 -> 2 tasks 100 %, 4 tasks 50 %
    # stream 1: tasks 0 1 1 0 -> 2 tasks  50 %, 4 tasks 50 %
    # stream 2: tasks 1 0 -1 1 (task 2 errored, left out) -> 2 tasks 50 %, 4 tasks 2/3
    # 2 tasks: mean 66.67, SD of (100, 50, 50) = sqrt(((33.3^2 + 2 * 16.7^2) / 2) = 28.87
    # 4 tasks: mean (50 + 50 + 66.67) / 3 = 55.56, SD of (50, 50, 66.67) = 9.62
    # seconds: 12 s over 12 episodes = 1 s per episode
    lines = [
        {"label": "m", "stream": 0, "success": [1, 1, 0, 0], "seconds": 4.0},
        {"label": "m", "stream": 1, "success": [0, 1, 1, 0], "seconds": 2.0},
        {"label": "m", "stream": 2, "success": [1, 0, -1, 1], "seconds": 6.0},
    ]
    two, four = noise.summarise(lines, [2, 4])
    assert two["mean"] == pytest.approx(200 / 3) and two["sd"] == pytest.approx(28.8675, abs=1e-3)
    assert four["mean"] == pytest.approx(500 / 9) and four["sd"] == pytest.approx(9.6225, abs=1e-3)
    assert two["binomial_se"] == pytest.approx(100 * math.sqrt(2 / 3 * 1 / 3 / 2))
    assert (two["seconds"], four["seconds"]) == (2.0, 4.0)
    assert two["streams"] == 3


def test_size_rule_golden():
    # sigma_eval: size 64 -> SDs 6 and 8 (var 50), 256 -> SDs 3 and 4 (var 12.5)
    # V_rest = max(0, 4^2 - 3/8 * 50) = max(0, 16 - 18.75) = 0
    # V(64) = 0 + 3/8 * 50 = 18.75, V(256) = 3/8 * 12.5 = 4.6875
    # C(64) = 2 (100 + 4 * 64 * 0.5) = 456, C(256) = 2 (100 + 512) = 1224
    # V C: 8550 and 5737.5 -> 256 (5737.5 / 8550 = 0.671)
    rows = [
        {"tasks": 64, "sd": 6.0}, {"tasks": 64, "sd": 8.0},
        {"tasks": 256, "sd": 3.0}, {"tasks": 256, "sd": 4.0},
    ]  # fmt: skip
    rule, chosen = noise.size_rule(rows, 4.0, 100.0, 0.5)
    assert [r["V"] for r in rule] == pytest.approx([18.75, 4.6875])
    assert [r["C"] for r in rule] == pytest.approx([456.0, 1224.0])
    assert chosen == 256
    # a large rest variance makes evaluation noise matter less: V_rest = 100 - 18.75 = 81.25,
    # V C = 100 * 456 = 45600 and (81.25 + 4.6875) * 1224 = 105187.5 -> 64
    assert noise.size_rule(rows, 10.0, 100.0, 0.5)[1] == 64
    # within 5 % of the minimum the smaller size wins: 256's V C is 0.96 of 64's when
    # 4.6875 (100 + 1024 t) = 0.96 * 18.75 (100 + 256 t), i.e. 192 t = 1331.25, t = 6.93359375
    near, chosen = noise.size_rule(rows, 4.0, 100.0, 6.93359375)
    assert near[1]["VC"] / near[0]["VC"] == pytest.approx(0.96) and chosen == 64


def test_the_benchmark_resumes_from_its_lines(micro_model, tmp_path, capsys):
    argv = [
        "--preset", "household-smoke", "--model", f"m={micro_model}", "--streams", "2",
        "--tasks", "3", "--sizes", "2,3", "--out", str(tmp_path), "--max-turns", str(TURNS),
    ]  # fmt: skip
    assert noise.main(argv) == 0
    lines = noise.load_lines(tmp_path / "episodes.jsonl")
    assert [(x["label"], x["stream"], len(x["success"])) for x in lines] == [
        ("m", 0, 3),
        ("m", 1, 3),
    ]
    # a finished line is kept as it is: a second call runs nothing new
    (tmp_path / "episodes.jsonl").write_text(
        "".join(json.dumps({**x, "seconds": 99.0}) + "\n" for x in lines)
    )
    assert noise.main(argv) == 0
    again = noise.load_lines(tmp_path / "episodes.jsonl")
    assert [x["seconds"] for x in again] == [99.0, 99.0]
    table = (tmp_path / "table.md").read_text()
    assert "| m | 3 | 2 |" in table and np.isfinite(noise.summarise(again, [3])[0]["sd"])


def test_bad_input_is_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        noise.main(["--preset", "household-smoke", "--model", "m=/nowhere", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "--model 'm=/nowhere'" in capsys.readouterr().err
