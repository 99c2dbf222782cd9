"""benchmarks/gpu_check.py: the CPU dry run prints every row with a number; robustness."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_script(*args, out=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    if out is not None:
        env["OUT"] = str(out)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
        timeout=600,
    )  # fmt: skip


def table_rows(text):
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] in "abcd" and cells[0]:
            rows[(cells[0], cells[1])] = cells[2]
    return rows


def test_the_dry_run_prints_every_row_with_a_number(tmp_path):
    out = tmp_path / "out"  # not there yet: the script makes it
    done = run_script("--cpu-dry-run", out=out)
    assert done.returncode == 0, done.stderr[-2000:]
    written = (out / "gpu_check.md").read_text()
    assert written in done.stdout  # the same table, printed and written
    rows = table_rows(written)
    gpu_check = load_script()
    for part, measures in gpu_check.MEASURES.items():
        for measure in [*measures, f"part {part} seconds"]:
            value = rows[(part, measure)]
            assert float(value) == float(value), (part, measure, value)  # a number, not nan
    assert rows[("d", "mcgpo train exit code")] == "0"
    assert float(rows[("b", "padding share")]) < 0.5


def test_a_failing_or_slow_part_is_a_row_and_the_next_part_runs(monkeypatch):
    gpu_check = load_script()

    def boom(check):
        raise RuntimeError("no kernel image | for this device")

    def slow(check):
        time.sleep(30)

    def fine(check):
        return [("x", "1", "")]

    monkeypatch.setattr(gpu_check, "PARTS", {"a": ("t", boom), "b": ("t", slow), "c": ("t", fine)})
    monkeypatch.setattr(gpu_check, "MEASURES", {"a": ["m1", "m2"], "b": ["m3"], "c": ["x"]})
    sizes = gpu_check.dataclasses.replace(gpu_check.DRY, limits={"a": 10, "b": 1, "c": 10})
    check = gpu_check.Check(True, torch.device("cpu"), sizes)
    start = time.monotonic()
    results = gpu_check.run_parts(check, budget_s=60)
    assert time.monotonic() - start < 10
    assert results["a"][0][:2] == ("m1", "error")
    assert "RuntimeError: no kernel image" in results["a"][0][2]
    assert results["a"][1] == ("m2", "error", "")
    assert results["b"][0][1] == "error" and "PartTimeout" in results["b"][0][2]
    assert results["c"][0] == ("x", "1", "")
    # a "|" inside a message would split the markdown row: it is written as "/"
    line = next(x for x in gpu_check.table(check, results, 1.0).splitlines() if "| m1 |" in x)
    assert line.count("|") == 5 and "no kernel image / for this device" in line
    # a spent budget (under 5 s left) skips the remaining parts
    skipped = gpu_check.run_parts(check, budget_s=4)
    assert all(r[1] == "skipped" for key in "abc" for r in skipped[key][:-1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_without_cuda_it_says_so_in_one_line_and_exits_2():
    done = run_script()
    assert done.returncode == 2
    assert done.stderr.strip() == "gpu_check: no CUDA device here (use --cpu-dry-run on a CPU)"
