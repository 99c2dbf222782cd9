"""Resumable benchmark runner: finished runs are skipped, half-finished ones continue."""

from __future__ import annotations

import pytest

from mcgpo.bench.runner import (
    DONE_MARKER,
    Variant,
    load_run_result,
    plan_runs,
    run_plans,
    run_status,
    set_aside,
)

V = [Variant("grpo", ("--algo.name", "grpo")), Variant("mcgpo", ("--algo.name", "mcgpo"))]


def test_all_runs_then_none_when_rerun(tmp_path, fake_launcher):
    plans = plan_runs(V, [0, 1], tmp_path, common=("--preset", "x"), threads=1)
    assert len(plans) == 4 and all("--resume" not in p.argv for p in plans)
    calls = []
    codes = run_plans(plans, parallel=2, launcher=fake_launcher(calls), poll_seconds=0.01)
    assert sorted(codes.values()) == [0, 0, 0, 0] and len(calls) == 4
    assert all(run_status(p.folder) == "done" for p in plans)
    # second invocation: everything is done, nothing is launched
    calls2 = []
    run_plans(
        plan_runs(V, [0, 1], tmp_path, common=(), threads=1),
        parallel=2,
        launcher=fake_launcher(calls2),
        poll_seconds=0.01,
    )
    assert calls2 == []


def test_runs_start_seed_by_seed(tmp_path, fake_launcher):
    """Every method of a seed starts before the next seed's runs (plans are listed method
    by method): a benchmark stopped part-way leaves whole seeds. One at a time, the launch
    order is the seed-major order of the plans."""
    plans = plan_runs(V, [3, 1, 2], tmp_path, common=(), threads=1)
    assert [(p.variant.label, p.seed) for p in plans][:3] == [("grpo", 3), ("grpo", 1), ("grpo", 2)]
    calls = []
    run_plans(plans, parallel=1, launcher=fake_launcher(calls), poll_seconds=0.01)
    started = [(c[c.index("--algo.name") + 1], int(c[c.index("--seed") + 1])) for c in calls]
    assert started == [
        ("grpo", 3), ("mcgpo", 3), ("grpo", 1), ("mcgpo", 1), ("grpo", 2), ("mcgpo", 2),
    ]  # fmt: skip


def test_failed_run_keeps_no_marker_and_partial_run_resumes(tmp_path, fake_launcher):
    plans = plan_runs(V[:1], [0], tmp_path, common=(), threads=1)
    calls = []
    codes = run_plans(
        plans, parallel=1, launcher=fake_launcher(calls, exit_code=3), poll_seconds=0.01
    )
    assert list(codes.values()) == [3]
    folder = plans[0].folder
    assert not (folder / DONE_MARKER).exists() and run_status(folder) == "stale"
    # a checkpoint exists -> the next plan continues it with --resume
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "latest").write_text("update-000002")
    assert run_status(folder) == "partial"
    again = plan_runs(V[:1], [0], tmp_path, common=(), threads=1)
    assert again[0].argv[-1] == "--resume"


def test_load_run_result(tmp_path, fake_launcher):
    plans = plan_runs(V[:1], [7], tmp_path, common=(), threads=1)
    run_plans(plans, parallel=1, launcher=fake_launcher([]), poll_seconds=0.01)
    res = load_run_result("grpo", 7, plans[0].folder)
    assert [p.success for p in res.points] == [0.25, 0.75]
    assert res.points[-1].per_type == {"pick": 1.0}
    assert res.seconds_per_update == 1.5 and res.preference_stats == {"count": 3.0}


def test_missing_metrics_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics"):
        load_run_result("grpo", 0, tmp_path)


def test_run_stopped_before_its_first_checkpoint_starts_again_old_files_kept(
    tmp_path, fake_launcher
):
    # A run killed before its first checkpoint leaves metrics.jsonl and config.toml, which
    # `mcgpo train` refuses to overwrite ("already holds a run") and cannot --resume. The
    # runner moves them into stale-1/ and starts the run again; a second stale start goes
    # to stale-2/.
    plans = plan_runs(V[:1], [0], tmp_path, common=(), threads=1)
    folder = plans[0].folder
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text('{"update": 1}\n')
    (folder / "config.toml").write_text("x = 1\n")
    assert run_status(folder) == "stale"
    calls = []
    codes = run_plans(plans, parallel=1, launcher=fake_launcher(calls), poll_seconds=0.01)
    assert list(codes.values()) == [0] and len(calls) == 1 and "--resume" not in calls[0]
    assert (folder / "stale-1" / "metrics.jsonl").read_text() == '{"update": 1}\n'
    assert (folder / "stale-1" / "config.toml").exists() and not (folder / "config.toml").exists()
    assert run_status(folder) == "done"
    # set_aside picks the next free number and leaves earlier ones in place
    (folder / "metrics.jsonl").write_text("again\n")
    assert set_aside(folder).name == "stale-2"
    assert (folder / "stale-2" / "metrics.jsonl").read_text() == "again\n"
    assert (folder / "stale-1" / "metrics.jsonl").exists()


def test_on_done_follows_each_finished_run_after_its_marker(tmp_path, fake_launcher):
    plans = plan_runs(V, [0, 1], tmp_path, common=(), threads=1)
    seen = []

    def on_done(plan):
        assert run_status(plan.folder) == "done"  # the marker is written before
        seen.append(plan.folder.name)

    seed0 = [p for p in plans if p.seed == 0]
    run_plans(seed0, parallel=2, launcher=fake_launcher([]), poll_seconds=0.01, on_done=on_done)
    assert sorted(seen) == ["grpo-s0", "mcgpo-s0"]
    seen.clear()
    failing = fake_launcher([], exit_code=3)
    run_plans(plans, parallel=2, launcher=failing, poll_seconds=0.01, on_done=on_done)
    assert seen == []  # seed 0 was skipped (done), seed 1 failed: no call for either
