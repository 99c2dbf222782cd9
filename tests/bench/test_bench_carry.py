"""``mcgpo bench --carry DIR``: the study kept in DIR as it runs, resumed from it elsewhere."""

from __future__ import annotations

import pytest

from mcgpo.bench import carry as carry_module
from mcgpo.bench import commands, study
from mcgpo.bench.runner import DONE_MARKER, run_plans, run_status

FILES = ["bench-done.json", "config.toml", "metrics.jsonl"]  # a fake run writes no eval.json


def _bench(monkeypatch, launcher, calls, *args):
    """``mcgpo bench`` with the runs played by ``launcher`` (no training, no warm start)."""

    def fake_run_plans(plans, *, parallel, on_done=None):
        return run_plans(
            plans, parallel=parallel, launcher=launcher(calls), poll_seconds=0.01, on_done=on_done
        )

    monkeypatch.setattr(study, "run_plans", fake_run_plans)
    return commands.bench_main(["--algos", "graphgpo,mcgpo", "--model", "tiny", *map(str, args)])


def _config_writing(fake_launcher):
    """The fake launcher, plus a config.toml in each run folder (as ``mcgpo train`` writes)."""

    def launcher(calls):
        inner = fake_launcher(calls)

        def launch(argv, log):
            folder = argv[argv.index("--out") + 1]
            with open(f"{folder}/config.toml", "w") as f:
                f.write("seed = 0\n")
            return inner(argv, log)

        return launch

    return launcher


def test_each_run_is_carried_as_it_finishes_and_a_fresh_out_resumes_from_it(
    tmp_path, monkeypatch, fake_launcher
):
    launcher = _config_writing(fake_launcher)
    kept, calls = tmp_path / "kept", []
    code = _bench(monkeypatch, launcher, calls, "--seeds", "0,1", "--parallel", "1",
                  "--out", tmp_path / "a", "--carry", kept)  # fmt: skip
    assert code == 0 and len(calls) == 4
    for run in ("graphgpo-s0", "graphgpo-s1", "mcgpo-s0", "mcgpo-s1"):
        assert sorted(p.name for p in (kept / "runs" / run).iterdir()) == FILES
    table = (kept / "results.md").read_text()
    assert "| mcgpo | 2 |" in table and (kept / "curves.png").is_file()
    assert not list(kept.rglob("bench.log"))  # logs and checkpoints stay behind

    # a fresh clone: nothing in --out, the same command resumes from the carried folder
    calls = []
    code = _bench(monkeypatch, launcher, calls, "--seeds", "0,1,2", "--parallel", "1",
                  "--out", tmp_path / "b", "--carry", kept)  # fmt: skip
    assert code == 0
    assert sorted(c[c.index("--out") + 1].rsplit("/", 1)[1] for c in calls) == [
        "graphgpo-s2",
        "mcgpo-s2",
    ]  # only the new seed ran
    assert run_status(tmp_path / "b" / "runs" / "mcgpo-s0") == "done"
    assert "| mcgpo | 3 |" in (kept / "results.md").read_text()


def test_a_run_is_in_the_carry_before_the_next_one_starts(tmp_path, monkeypatch, fake_launcher):
    """Stopping the study loses at most the runs still going: with one run at a time, each
    launch finds every earlier run already carried."""
    kept, calls, seen = tmp_path / "kept", [], []
    inner = _config_writing(fake_launcher)

    def launcher(calls):
        launch = inner(calls)

        def watched(argv, log):
            seen.append(sorted(p.parent.name for p in (kept / "runs").glob(f"*/{DONE_MARKER}")))
            return launch(argv, log)

        return watched

    assert _bench(monkeypatch, launcher, calls, "--seeds", "0", "--parallel", "1",
                  "--out", tmp_path / "a", "--carry", kept) == 0  # fmt: skip
    assert seen == [[], ["graphgpo-s0"]]


@pytest.mark.parametrize("case", ["same", "file", "report"])
def test_bad_carry_folders_are_one_line_and_exit_2(case, tmp_path, capsys):
    out = tmp_path / "out"
    carry = {"same": out, "file": tmp_path / "f", "report": tmp_path / "k"}[case]
    (tmp_path / "f").write_text("x")
    extra = ["--report-only"] if case == "report" else []
    argv = [
        "--algos",
        "graphgpo,mcgpo",
        "--model",
        "tiny",
        "--out",
        str(out),
        "--carry",
        str(carry),
    ]
    assert commands.bench_main([*argv, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--carry" in err[0]
    want = {"same": "is --out itself", "file": "is a file", "report": "give it as --out"}[case]
    assert want in err[0]


def test_a_failed_copy_is_one_line_and_the_end_carries_it_again(
    tmp_path, monkeypatch, fake_launcher, capsys
):
    """A copy that fails mid-study (disk full) must not stop the runs still going."""
    real, failures = carry_module.carry_run, []

    def flaky(run, bench, dest):
        if not failures:
            failures.append(run.name)
            raise OSError(28, "No space left on device")
        return real(run, bench, dest)

    monkeypatch.setattr(carry_module, "carry_run", flaky)
    kept = tmp_path / "kept"
    code = _bench(monkeypatch, _config_writing(fake_launcher), [], "--seeds", "0", "--parallel",
                  "1", "--out", tmp_path / "a", "--carry", kept)  # fmt: skip
    assert code == 0 and failures == ["graphgpo-s0"]
    err = [x for x in capsys.readouterr().err.splitlines() if "could not carry" in x]
    assert len(err) == 1 and "graphgpo-s0" in err[0] and "No space left on device" in err[0]
    for run in ("graphgpo-s0", "mcgpo-s0"):  # the save at the end carried it after all
        assert sorted(p.name for p in (kept / "runs" / run).iterdir()) == FILES


def test_a_failed_final_save_is_one_line_and_exit_1(tmp_path, monkeypatch, fake_launcher, capsys):
    def full(bench, dest, runs_only=False):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(carry_module, "save", full)
    code = _bench(monkeypatch, _config_writing(fake_launcher), [], "--seeds", "0", "--parallel",
                  "1", "--out", tmp_path / "a", "--carry", tmp_path / "kept")  # fmt: skip
    assert code == 1
    err = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert err == [
        f"mcgpo bench: error: could not carry to {tmp_path / 'kept'} (No space left on device)"
    ]
    assert (tmp_path / "a" / "results.md").is_file()  # the study's own table is written


def test_a_carry_that_cannot_be_restored_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    def unreadable(saved, bench):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(carry_module, "restore", unreadable)
    argv = ["--algos", "graphgpo", "--model", "tiny", "--out", str(tmp_path / "a")]
    assert commands.bench_main([*argv, "--carry", str(tmp_path / "kept")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot restore it into --out (Permission denied)" in err[0]
