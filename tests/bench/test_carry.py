"""mcgpo.bench.carry and scripts/bench_carry.py: a saved benchmark folder resumes as the
original would."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mcgpo.bench import carry as library
from mcgpo.bench import runner

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_carry.py"
spec = importlib.util.spec_from_file_location("bench_carry", SCRIPT)
carry = importlib.util.module_from_spec(spec)
spec.loader.exec_module(carry)


def _bench(root: Path) -> Path:
    """A benchmark folder: a warm start, a finished run, a half-finished one, a stale one."""
    files = {
        "results.md": "table",
        "warmstart/sft.json": "{}",
        "warmstart/config.toml": "seed = 0",
        "warmstart/bench.log": "log",
        "warmstart/model/config.json": "{}",
        "warmstart/model/model.safetensors": "weights",
        "runs/mcgpo-s0/metrics.jsonl": '{"update": 12}',
        "runs/mcgpo-s0/config.toml": "seed = 0",
        "runs/mcgpo-s0/eval.json": "{}",
        "runs/mcgpo-s0/bench-done.json": "{}",
        "runs/mcgpo-s0/bench.log": "log",
        "runs/mcgpo-s0/checkpoints/latest": "update-12",
        "runs/graphgpo-s0/metrics.jsonl": '{"update": 4}',
        "runs/graphgpo-s0/checkpoints/latest": "update-4",
        "runs/graphgpo-s1/metrics.jsonl": '{"update": 1}',
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_save_keeps_the_warm_start_and_finished_runs_only(tmp_path):
    bench = _bench(tmp_path / "bench")
    written = carry.save(bench, tmp_path / "saved")
    names = sorted(str(p.relative_to(tmp_path / "saved")) for p in written)
    assert names == [
        "results.md",
        "runs/mcgpo-s0/bench-done.json",
        "runs/mcgpo-s0/config.toml",
        "runs/mcgpo-s0/eval.json",
        "runs/mcgpo-s0/metrics.jsonl",
        "warmstart/config.toml",
        "warmstart/model/config.json",
        "warmstart/model/model.safetensors",
        "warmstart/sft.json",
    ]


def test_runs_only_leaves_the_tables_and_the_warm_start_behind(tmp_path):
    """A study run one seed per command: the last command's results.md describes one seed
    and must not overwrite the study's table."""
    bench = _bench(tmp_path / "bench")
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "results.md").write_text("the study's table")
    assert carry.main(["save", "--runs-only", str(bench), str(saved)]) == 0
    names = sorted(str(p.relative_to(saved)) for p in saved.rglob("*") if p.is_file())
    assert names == [
        "results.md",
        "runs/mcgpo-s0/bench-done.json",
        "runs/mcgpo-s0/config.toml",
        "runs/mcgpo-s0/eval.json",
        "runs/mcgpo-s0/metrics.jsonl",
    ]
    assert (saved / "results.md").read_text() == "the study's table"


def test_a_restored_folder_resumes_with_the_finished_runs_done(tmp_path):
    carry.save(_bench(tmp_path / "bench"), tmp_path / "saved")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "results.md").write_text("kept")
    written = carry.restore(tmp_path / "saved", fresh)
    assert (fresh / "results.md").read_text() == "kept"  # a file already there is kept
    assert fresh / "results.md" not in written
    assert runner.run_status(fresh / "runs" / "mcgpo-s0") == "done"
    assert (fresh / "runs" / "mcgpo-s0" / "metrics.jsonl").read_text() == '{"update": 12}'
    assert runner.run_status(fresh / "runs" / "graphgpo-s0") == "new"  # starts again
    assert (fresh / "warmstart" / "model" / "model.safetensors").read_text() == "weights"


def test_a_run_finished_in_the_carry_replaces_an_unfinished_one(tmp_path):
    """Before: the carried marker joined the local run's partial metrics, which then read as
    a finished run of 4 updates. Now the unfinished files are set aside, as the runner does."""
    carry.save(_bench(tmp_path / "bench"), tmp_path / "saved")
    fresh = tmp_path / "fresh"
    local = fresh / "runs" / "mcgpo-s0"
    (local / "checkpoints").mkdir(parents=True)
    (local / "metrics.jsonl").write_text('{"update": 4}')
    (local / "checkpoints" / "latest").write_text("update-4")
    done = fresh / "runs" / "graphgpo-s1"  # finished here, not in the carry: left alone
    done.mkdir(parents=True)
    (done / "metrics.jsonl").write_text("mine")
    (done / "bench-done.json").write_text("{}")
    carry.restore(tmp_path / "saved", fresh)
    assert runner.run_status(local) == "done"
    assert (local / "metrics.jsonl").read_text() == '{"update": 12}'
    assert (local / "stale-1" / "metrics.jsonl").read_text() == '{"update": 4}'
    assert (local / "stale-1" / "checkpoints" / "latest").read_text() == "update-4"
    assert (done / "metrics.jsonl").read_text() == "mine"


def test_carry_run_copies_a_finished_run_only_and_atomically(tmp_path):
    bench = _bench(tmp_path / "bench")
    dest = tmp_path / "kept"
    assert library.carry_run(bench / "runs" / "graphgpo-s0", bench, dest) == []  # unfinished
    written = library.carry_run(bench / "runs" / "mcgpo-s0", bench, dest)
    assert [p.name for p in written] == [
        "metrics.jsonl",
        "config.toml",
        "eval.json",
        "bench-done.json",
    ]
    assert written[-1].name == runner.DONE_MARKER  # the marker last: marked means complete
    assert sorted(p.name for p in (dest / "runs" / "mcgpo-s0").iterdir()) == sorted(
        p.name for p in written
    )  # no temporary files left beside them


def test_bad_folders_give_one_line_and_exit_2(tmp_path, capsys):
    assert carry.main(["save", str(tmp_path), str(tmp_path / "out")]) == 2
    assert "not a benchmark folder" in capsys.readouterr().err
    assert carry.main(["restore", str(tmp_path / "none"), str(tmp_path / "b")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert carry.main(["restore", "--runs-only", str(tmp_path), str(tmp_path / "b")]) == 2
    assert "--runs-only goes with save only" in capsys.readouterr().err
