"""``--report-only``: results.md re-rendered from finished runs, no warm start, no training."""

from __future__ import annotations

import json
import math

import pytest

import mcgpo.bench.study as study
from mcgpo.bench.report import REPORT_NOTE, kept_header, write_results
from mcgpo.bench.results import EvalPoint, RunResult
from mcgpo.bench.runner import DONE_MARKER
from mcgpo.cli import main

# success at updates 0 and 4 per seed; the paired differences (mcgpo - graphgpo) of final
# success are 0.1, 0.2, 0.3: mean 0.2, SD 0.1, t-interval 0.2 +- 4.30265 * 0.1 / sqrt(3)
# = [-0.048, +0.448] (t_{0.975, 2} = 0.95 / sqrt(2 * 0.975 * 0.025), test_intervals.py);
# integrated: half of each (update 0 is equal in both arms)
GRAPH = {0: [0.4, 0.5], 1: [0.4, 0.4], 2: [0.4, 0.6]}
MCGPO = {0: [0.4, 0.6], 1: [0.4, 0.6], 2: [0.4, 0.9]}
ARGS = ["--only", "graphgpo,mcgpo", "--seeds", "0,1,2", "--preset", "household-mid"]


def write_run(folder, successes, done=True):
    folder.mkdir(parents=True)
    records = [{"update": 4 * i, "eval/success": s} for i, s in enumerate(successes)]
    records.insert(1, {"update": 1, "time/rollout": 2.0, "time/update": 1.0})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if done:
        (folder / DONE_MARKER).write_text("{}\n")


def bench_folder(tmp_path, skip=()):
    out = tmp_path / "bench"
    for label, table in (("graphgpo", GRAPH), ("mcgpo", MCGPO)):
        for seed, successes in table.items():
            write_run(out / "runs" / f"{label}-s{seed}", successes, done=(label, seed) not in skip)
    return out


@pytest.fixture
def no_training(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("--report-only must not warm-start or train")

    monkeypatch.setattr(study, "run_plans", refuse)
    monkeypatch.setattr(study, "_warm_start", refuse)


def test_report_only_renders_the_finished_runs_and_keeps_the_header(tmp_path, capsys, no_training):
    out = bench_folder(tmp_path)
    runs = [
        RunResult("graphgpo", 0, (EvalPoint("graphgpo", 0, 0, 0.5),)),
        RunResult("mcgpo", 0, (EvalPoint("mcgpo", 0, 0, 0.5),)),
    ]
    old_header = [
        "Command: `mcgpo ablate --seeds 0 --out runs/x`",
        "Preset: `household-mid`; machine: x86_64 2 cores, Linux; date: 2026-12-04.",
        "Runs that failed and are left out: runs/x/runs/mcgpo-s1.",
    ]
    write_results("ablate", out, runs, old_header, tables_only=True)
    capsys.readouterr()
    assert main(["ablate", *ARGS, "--out", str(out), "--report-only"]) == 0
    md = (out / "results.md").read_text()
    assert md == capsys.readouterr().out.rstrip("\n") + "\n"  # printed as written
    lines = md.splitlines()
    # the original command, preset, machine and date stay; the stale "failed" line goes
    assert lines[2:4] == old_header[:2]
    assert lines[4].startswith(f"{REPORT_NOTE} by `mcgpo ablate --only graphgpo,mcgpo")
    assert lines[4].endswith(
        "(no training; evals.jsonl and the plots drawn again from the same runs)."
    )
    assert "--report-only` on " in lines[4] and lines[5] == ""
    assert "| graphgpo | 3 | 50.0 ± 10.0 |" in md and "| mcgpo | 3 | 70.0 ± 17.3 |" in md
    half = 4.30265 * 0.1 / math.sqrt(3)
    final = f"[{100 * (0.2 - half):+.1f}, {100 * (0.2 + half):+.1f}]"
    assert final == "[-4.8, +44.8]"
    integrated = f"[{100 * (0.1 - half / 2):+.1f}, {100 * (0.1 + half / 2):+.1f}]"
    assert f"| mcgpo | 3 | +20.0 | {final} | 32.6 | +10.0 | {integrated} | 16.3 |" in md
    # ablate adds the section against mcgpo; evals.jsonl and the curves drawn again from
    # these runs (every seed's points; no task types here, so no per-type bars)
    assert md.count("## Paired difference against ") == 2
    assert sorted(p.name for p in out.iterdir()) == [
        "curves.png",
        "evals.jsonl",
        "results.md",
        "runs",
    ]
    points = [json.loads(line) for line in (out / "evals.jsonl").read_text().splitlines()]
    assert len(points) == 2 * 3 * 2  # 2 methods x 3 seeds x 2 evaluations
    # a second re-render keeps the same header (not a second re-render line)
    assert main(["ablate", *ARGS, "--out", str(out), "--report-only"]) == 0
    again = (out / "results.md").read_text().splitlines()
    assert again[2:4] == old_header[:2] and sum(REPORT_NOTE in x for x in again) == 1


def test_without_a_results_md_the_header_is_the_command_line(tmp_path, capsys, no_training):
    out = bench_folder(tmp_path)
    argv = ["bench", "--algos", "graphgpo,mcgpo", "--seeds", "0,1,2", "--out", str(out)]
    assert main([*argv, "--report-only"]) == 0
    lines = (out / "results.md").read_text().splitlines()
    assert lines[0] == "# mcgpo bench"
    assert lines[2] == (f"Command: `mcgpo bench --algos graphgpo,mcgpo --seeds 0,1,2 --out {out}`")
    assert lines[3] == "Seeds: 0, 1, 2." and lines[4].startswith(REPORT_NOTE)
    assert "| mcgpo | 3 | +20.0 |" in "\n".join(lines)
    capsys.readouterr()


def test_an_unfinished_run_is_left_out_and_named(tmp_path, capsys, no_training):
    out = bench_folder(tmp_path, skip={("mcgpo", 2)})
    assert main(["ablate", *ARGS, "--out", str(out), "--report-only"]) == 1
    md = (out / "results.md").read_text()
    assert f"Runs not finished and left out: {out / 'runs' / 'mcgpo-s2'}." in md
    # seeds 0 and 1 only: differences 0.1, 0.2
    assert "| mcgpo | 2 | +15.0 |" in md
    assert "mcgpo ablate: 1 runs not finished, left out" in capsys.readouterr().err


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, no_training):
    missing = tmp_path / "nowhere"
    assert main(["ablate", *ARGS, "--out", str(missing), "--report-only"]) == 2
    assert one_line_error(capsys) == (
        f"mcgpo ablate: error: --out {str(missing)!r} has no runs/ folder: nothing to report"
    )
    assert not missing.exists()  # nothing is created
    out = bench_folder(tmp_path)
    assert main(["ablate", "--only", "mcgpo/uniform", "--out", str(out), "--report-only"]) == 2
    assert one_line_error(capsys) == (
        f"mcgpo ablate: error: no finished run under {str(out / 'runs')!r} for these methods "
        "and seeds (looked for mcgpo-uniform-s0, ...)"
    )
    (out / "runs" / "mcgpo-s1" / "metrics.jsonl").write_text("{not json\n")
    assert main(["ablate", *ARGS, "--out", str(out), "--report-only"]) == 2
    assert one_line_error(capsys).startswith(
        f"mcgpo ablate: error: {out / 'runs' / 'mcgpo-s1'}: unreadable metrics.jsonl "
        "(JSONDecodeError: "
    )
    (out / "runs" / "mcgpo-s1" / "metrics.jsonl").write_text('{"update": 1}\n')
    assert main(["ablate", *ARGS, "--out", str(out), "--report-only"]) == 2
    assert one_line_error(capsys) == (
        f"mcgpo ablate: error: {out / 'runs' / 'mcgpo-s1'}: metrics.jsonl has no evaluation"
    )
    assert main(["ablate", *ARGS, "--seeds", "x", "--out", str(out), "--report-only"]) == 2
    assert one_line_error(capsys) == "mcgpo ablate: error: --seeds must be integers, got 'x'"


def test_kept_header_only_from_the_same_command(tmp_path):
    md = tmp_path / "results.md"
    assert kept_header(md, "bench") == []
    md.write_text("# mcgpo sweep\n\nCommand: `mcgpo sweep`\n\n| Method |\n")
    assert kept_header(md, "bench") == []
    assert kept_header(md, "sweep") == ["Command: `mcgpo sweep`"]
