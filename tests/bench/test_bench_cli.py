"""``mcgpo bench`` end to end: warm start, 2 algorithms x 2 seeds, table and plots, resume."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mcgpo.cli import main


def test_bench_rejects_bad_input(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--algos", "grpo,nope"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "mcgpo bench: error: unknown algorithm 'nope'; known: grpo, rloo, gigpo, graphgpo, "
        "hgpo, progpo, progress_gpo, mcgpo, graphgpo_shaping"
    ]
    with pytest.raises(SystemExit) as exc:
        main(["ablate", "--only", "mcgpo/nope"])
    assert exc.value.code == 2


@pytest.mark.slow
def test_bench_two_algorithms_two_seeds_end_to_end(tmp_path):
    out = tmp_path / "bench"
    cmd = [
        sys.executable,
        "-m",
        "mcgpo.cli",
        "bench",
        "--preset",
        "household-smoke",
        "--algos",
        "grpo,mcgpo",
        "--seeds",
        "0,1",
        "--out",
        str(out),
        "--parallel",
        "2",
        "--set",
        "env.max_turns=2",  # the warm start gets env options too (same env as the runs)
        "--set",
        "train.lr=0.002",  # train-only: the runs get it, the warm start (sft) does not
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    warm_cfg = (out / "warmstart" / "config.toml").read_text()
    run_cfg = (out / "runs" / "grpo-s0" / "config.toml").read_text()
    assert "max_turns = 2" in warm_cfg and "max_turns = 2" in run_cfg
    assert "lr = 0.002" in run_cfg and "--train.lr" not in warm_cfg.splitlines()[0]
    md = (out / "results.md").read_text()
    assert "| grpo | 2 |" in md and "| mcgpo | 2 |" in md
    # no graphgpo among the methods: the paired difference is against the first, grpo
    paired = md.split("## Paired difference against grpo (method - grpo, per seed)")[1]
    assert "| mcgpo | 2 |" in paired.split("## ")[0]
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    points = [json.loads(x) for x in (out / "evals.jsonl").read_text().splitlines()]
    # household-smoke evaluates before training and after each of its 2 updates
    assert {(p["method"], p["seed"]) for p in points} == {
        ("grpo", 0),
        ("grpo", 1),
        ("mcgpo", 0),
        ("mcgpo", 1),
    }
    assert sorted({p["update"] for p in points}) == [0, 1, 2]
    # resumable: a second invocation runs nothing and rewrites the same table
    stamp = {p: (p / "metrics.jsonl").stat().st_mtime for p in (out / "runs").iterdir()}
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert {p: (p / "metrics.jsonl").stat().st_mtime for p in (out / "runs").iterdir()} == stamp
    assert (out / "results.md").read_text().split("## ")[0].splitlines()[4:] == md.split("## ")[
        0
    ].splitlines()[4:]


def test_warm_start_gets_only_the_keys_sft_takes():
    from mcgpo.bench.study import _warm_start_takes

    for key in ("env.name", "env.max_turns", "rollout.history", "sft.demos", "corpus-episodes"):
        assert _warm_start_takes(key), key
    for key in ("train.lr", "algo.name", "algo.pairs.kappa", "out", "threads", "resume"):
        assert not _warm_start_takes(key), key


def test_each_sweep_starts_at_the_configs_default():
    """A sweep is "around the defaults": its first value is the one a run gets unset."""
    from mcgpo.bench.commands import SWEEP
    from mcgpo.training.algorithms import resolve_algo
    from mcgpo.training.config import RunConfig

    algo = resolve_algo(RunConfig().algo, 8)  # mcgpo, its pair options filled in
    defaults = {"algo.lambda_pair": algo.lambda_pair}
    defaults |= {f"algo.pairs.{name}": value for name, value in algo.pairs.items()}
    for key, values in SWEEP.items():
        assert float(values[0]) == float(defaults[key]), key
        assert len(set(map(float, values))) == len(values), key  # no point twice


def test_only_selects_labels_and_rejects_unknown_ones(capsys, monkeypatch):
    import mcgpo.bench.commands as commands

    seen = {}
    monkeypatch.setattr(
        commands, "run_study", lambda cmd, args, variants: seen.setdefault(cmd, variants)
    )
    commands.sweep_main(["--only", "mcgpo/lambda_pair=3.0,mcgpo"])
    # declared order (the default first), not the order given
    assert [v.label for v in seen["sweep"]] == ["mcgpo", "mcgpo/lambda_pair=3.0"]
    assert seen["sweep"][1].flags == ("--algo.name", "mcgpo", "--algo.lambda_pair", "3.0")
    commands.ablate_main(["--only", "mcgpo/uniform"])
    assert [v.label for v in seen["ablate"]] == ["mcgpo/uniform"]
    with pytest.raises(SystemExit) as exc:
        commands.sweep_main(["--only", "mcgpo/lambda_pair=7"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown sweep point 'mcgpo/lambda_pair=7'" in err[0]


def test_sweep_values_and_a_graphgpo_baseline_make_a_dose_response(capsys, monkeypatch):
    import mcgpo.bench.commands as commands

    seen = {}
    monkeypatch.setattr(commands, "run_study", lambda cmd, args, variants: seen.update(v=variants))
    commands.sweep_main(
        ["--params", "algo.lambda_pair", "--values", "1,3,10", "--baseline", "graphgpo"]
    )
    # the baseline first, then exactly the values given (no default mcgpo row besides them)
    assert [v.label for v in seen["v"]] == [
        "graphgpo",
        "mcgpo/lambda_pair=1",
        "mcgpo/lambda_pair=3",
        "mcgpo/lambda_pair=10",
    ]
    assert seen["v"][0].flags == ("--algo.name", "graphgpo")
    assert seen["v"][3].flags == ("--algo.name", "mcgpo", "--algo.lambda_pair", "10")
    # without --values the built-in list and the default row, after the baseline
    commands.sweep_main(["--params", "algo.pairs.kappa", "--baseline", "graphgpo"])
    assert [v.label for v in seen["v"]] == [
        "graphgpo", "mcgpo", "mcgpo/kappa=0", "mcgpo/kappa=4"
    ]  # fmt: skip
    for bad, message in (
        (
            ["--params", "algo.pairs.kappa,algo.lambda_pair", "--values", "1"],
            "exactly one parameter",
        ),
        (["--params", "algo.pairs.kappa", "--values", " , "], "--values is empty"),
        (["--baseline", "grpo"], "invalid choice: 'grpo'"),
    ):
        with pytest.raises(SystemExit) as exc:
            commands.sweep_main(bad)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


@pytest.mark.parametrize("command", ["bench", "ablate", "sweep"])
def test_an_out_folder_that_cannot_be_made_is_one_line_and_exit_2(capsys, tmp_path, command):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    under = a_file / "bench"  # a folder below a regular file cannot be created
    assert main([command, "--out", str(under)]) == 2
    assert one_line_error(capsys) == (
        f"mcgpo {command}: error: --out {str(under)!r}: cannot create or write the folder "
        "(Not a directory)"
    )
    assert main([command, "--out", str(a_file)]) == 2
    assert one_line_error(capsys) == (
        f"mcgpo {command}: error: --out {str(a_file)!r} is a file, not a folder"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # nothing was started


def test_a_read_only_out_folder_is_one_line_and_exit_2(capsys, tmp_path, monkeypatch):
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    # (the tests may run as root, for whom a chmod-ed folder stays writable)
    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    assert main(["bench", "--out", str(tmp_path / "b")]) == 2
    assert one_line_error(capsys).endswith("cannot create or write the folder (Permission denied)")


def test_bad_seeds_set_and_model_are_one_line_and_exit_2(capsys, tmp_path):
    out = str(tmp_path / "b")
    cases = [
        (["--seeds", "0,x"], "--seeds must be integers, got '0,x'"),
        (["--set", "train.lr"], "--set expects KEY=VALUE, got 'train.lr'"),
        (["--set", "seed=3"], "--set seed: the benchmark sets it for each run (use --seeds)"),
        (["--set", "out=x"], "--set out: the benchmark sets it for each run (use --out)"),
        (["--set", "resume=true"], "--set resume: the benchmark sets it for each run"),
        (["--model", str(tmp_path / "none")], f"--model {str(tmp_path / 'none')!r}: folder"),
        (["--model", "tiny", "--set", "model=m"], "give --model (no warm start) or --set model"),
    ]
    for flags, message in cases:
        assert main(["bench", "--out", out, *flags]) == 2, flags
        assert one_line_error(capsys).startswith(f"mcgpo bench: error: {message}"), flags
    assert not (tmp_path / "b").exists()  # each is caught before anything is made


def test_set_model_goes_to_the_warm_start_only_and_train_keys_to_the_runs_only():
    from mcgpo.bench.study import _set_flags, _warm_start_takes

    assert _warm_start_takes("model") and not _warm_start_takes("seed")
    runs, warm = _set_flags(["model=ckpt/sft", "env.max_turns=2", "train.lr=0.1"])
    assert runs == ["--env.max_turns", "2", "--train.lr", "0.1"]
    assert warm == ["--model", "ckpt/sft", "--env.max_turns", "2"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--preset", "household-smok"],
            "unknown preset 'household-smok' (did you mean 'household-smoke'?); known: ",
        ),
        (["--set", "train.lrr=1"], "unknown option --train.lrr (did you mean '--train.lr'?)"),
        (["--train.lrr", "1"], "unknown option --train.lrr (did you mean '--train.lr'?)"),
        (["--algos", "grpo", "--algo.omega=3"], "unknown option --algo.omega for grpo"),
        (["--set", "env.name=webshp"], "unknown environment 'webshp' (did you mean 'webshop'?)"),
        (["--set", "rollout.groups=0"], "rollout.groups must be >= 1, got 0"),
        (["--sed", "3"], "unrecognized argument --sed (did you mean '--seeds'?)"),
        (["--set", "model=Qwen/Qwen3-8B"], "--set model=Qwen/Qwen3-8B: folder not found; pass a"),
    ],
)
def test_bad_presets_and_run_options_are_found_before_the_warm_start(
    capsys, tmp_path, flags, message
):
    out = tmp_path / "b"
    try:
        code = main(["bench", "--config", "household-smoke", "--out", str(out), *flags])
    except SystemExit as exc:  # argparse's own errors exit
        code = exc.code
    assert code == 2
    assert message in one_line_error(capsys)
    assert not out.exists()  # no warm start, no run folder


def test_run_options_in_trains_form_are_taken_as_set(monkeypatch):
    import mcgpo.bench.commands as commands

    seen = {}
    monkeypatch.setattr(commands, "run_study", lambda cmd, args, variants: seen.update(a=args))
    commands.bench_main(["--train.lr", "0.1", "--set", "seed=1", "--env.max_turns=2"])
    assert seen["a"].set == ["seed=1", "train.lr=0.1", "env.max_turns=2"]


def test_a_failed_warm_start_prints_the_childs_error_line(capsys, tmp_path):
    empty = tmp_path / "not-a-model"
    empty.mkdir()  # a folder, so the checks pass; the child cannot load it
    out = tmp_path / "b"
    argv = ["bench", "--preset", "household-smoke", "--out", str(out), "--set", f"model={empty}"]
    assert main(argv) == 1
    log = out / "warmstart" / "bench.log"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"mcgpo bench: warm start failed: mcgpo sft: error: policy folder '{empty}' has no "
        f"config.json (not a Hugging Face model folder) (see {log})"
    )
