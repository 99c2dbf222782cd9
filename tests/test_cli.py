"""The ``mcgpo`` command line: help, option mapping and the one-line errors (exit code 2).

These tests call ``mcgpo.cli.main(argv)`` in-process: every case below fails before any
model or environment is built, so they take milliseconds. The end-to-end runs are in
tests/training/test_smoke.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from mcgpo.cli import COMMANDS, build_parser, main, resolve
from mcgpo.training.config import RunConfig
from mcgpo.training.config_layout import flatten, scalar_fields
from mcgpo.training.presets import available_presets


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--train.lrr", "1"], "mcgpo train: error: unknown option --train.lrr"),
        (["train", "--bogus"], "mcgpo train: error: unknown option --bogus"),
        (["eval", "--algo.name", "grpo"], "mcgpo eval: error: unknown option --algo.name"),
        (["sft", "--algo.omega", "1"], "mcgpo sft: error: unknown option --algo.omega"),
        (
            ["train", "--train.lr", "fast"],
            "mcgpo train: error: train.lr: expected a number, got 'fast'",
        ),
        (
            ["train", "--rollout.groups", "1.5"],
            "mcgpo train: error: rollout.groups: expected an integer, got 1.5",
        ),
        (["train", "--train.lr", "-1"], "mcgpo train: error: train.lr must be > 0, got -1.0"),
        (
            ["train", "--resume", "maybe"],
            "mcgpo train: error: resume: expected true or false, got 'maybe'",
        ),
        (["train", "--train.lr"], "mcgpo train: error: option --train.lr needs a value"),
        (
            ["train", "--algo.name", "ppo"],
            "mcgpo train: error: unknown algorithm 'ppo' (did you mean 'progpo'?); known: ",
        ),
        (
            ["train", "--algo.name", "grpo", "--algo.omega", "0.2"],
            "mcgpo train: error: unknown option --algo.omega for grpo; options: ",
        ),
        (
            ["train", "--algo.pairs.kappaa", "2"],
            "mcgpo train: error: unknown option --algo.pairs.kappaa for mcgpo (did you mean "
            "'kappa'?); options: ",
        ),
        (["train", "--algo.omega"], "mcgpo train: error: option --algo.omega needs a value"),
        (
            ["train", "--model", "no/such/folder"],
            "mcgpo train: error: model folder 'no/such/folder' not found",
        ),
        (["eval", "--model", "no/such/folder"], "mcgpo eval: error: model folder"),
        (["train", "--preset", "nope"], "mcgpo train: error: unknown preset 'nope'; known: "),
        (
            ["train", "--preset", "missing.toml"],
            "mcgpo train: error: preset file 'missing.toml' not found",
        ),
        (["train", "stray"], "mcgpo train: error: unexpected argument 'stray'"),
        (["fly"], "mcgpo: error: unknown command 'fly' (choose from sft, train, eval, bench"),
        (["trian"], "mcgpo: error: unknown command 'trian' (did you mean 'train'?)"),
        (["exprot"], "mcgpo: error: unknown command 'exprot' (did you mean 'export'?)"),
        (
            [],
            "mcgpo: error: choose a command: sft, train, eval, bench, ablate, sweep, presets, "
            "report, alfworld-generate, env or export",
        ),
        (["report", "no/such/run"], "mcgpo report: error: run folder 'no/such/run' not found"),
    ],
)
def test_bad_command_lines_give_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert out == ""
    assert one_line_error(err).startswith(message), err


def test_bad_estimator_option_value_is_caught_before_any_model_work(capsys):
    code, _, err = run_cli(capsys, "train", "--algo.name", "gigpo", "--algo.mode", "median")
    assert code == 2
    line = one_line_error(err)
    assert line.startswith("mcgpo train: error: ") and "median" in line


def test_environment_options_map_to_the_constructor(capsys, tmp_path):
    cfg = resolve("eval", ["--env.n_receptacles", "12", "--env.n-distractors=3"])
    assert dict(cfg.env.options) == {"n_receptacles": "12", "n_distractors": "3"}
    # a bad environment option is reported by the environment itself, before any model work
    code, _, err = run_cli(capsys, "eval", "--env.rooms", "3", "--out", str(tmp_path))
    assert code == 2
    assert one_line_error(err).startswith(
        "mcgpo eval: error: env 'household': unknown household option 'rooms'"
    )


def test_bad_preset_contents_are_reported_with_the_preset_name(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("# mcgpo train --preset bad.toml\n[train]\nlr = 'x'\n")
    code, _, err = run_cli(capsys, "train", "--preset", str(bad))
    assert code == 2
    assert one_line_error(err) == (
        f"mcgpo train: error: preset {bad}: train.lr: expected a number, got 'x'"
    )
    broken = tmp_path / "broken.toml"
    broken.write_text("[train\n")
    code, _, err = run_cli(capsys, "train", "--preset", str(broken))
    assert code == 2 and "not valid TOML" in one_line_error(err)


def test_resume_without_a_checkpoint_is_an_error(capsys, tmp_path):
    code, _, err = run_cli(
        capsys, "train", "--preset", "household-smoke", "--out", str(tmp_path), "--resume"
    )
    assert code == 2
    assert one_line_error(err) == f"mcgpo train: error: --resume: no checkpoint in '{tmp_path}'"


def test_resume_names_the_run_with_out(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --out, runs/run, is not there
    code, _, err = run_cli(capsys, "train", "--resume")
    assert code == 2 and one_line_error(err) == (
        "mcgpo train: error: --resume: no run folder 'runs/run' (--out names the run)"
    )
    # the hurried spelling: the folder after --resume (it was "expected true or false")
    code, _, err = run_cli(capsys, "train", "--resume", "runs/hq", "--train.updates", "24")
    assert code == 2 and one_line_error(err) == (
        "mcgpo train: error: --resume takes no folder: the run is --out "
        "(mcgpo train --resume --out runs/hq)"
    )
    assert resolve("train", ["--resume", "false"]).resume is False  # a value still reads
    assert resolve("train", ["--resume=true"]).resume is True


def test_cuda_request_without_cuda(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, _, err = run_cli(capsys, "eval", "--device", "cuda")
    assert code == 2
    assert one_line_error(err) == (
        "mcgpo eval: error: --device cuda: CUDA is not available on this machine"
    )


def test_help_lists_every_option_with_its_default(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    flat = flatten(RunConfig())
    for key in flat:
        if key.startswith(("sft.", "algo.")) and key not in ("algo.name", "algo.lambda_pair"):
            continue  # sft is `mcgpo sft`'s; algo options are listed per algorithm
        flag = "--" + (key.replace("_", "-") if "." not in key else key)
        assert flag in text, flag
    sub = build_parser()._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    for action in sub._actions:
        if action.dest not in ("help", "set"):  # --set KEY=VALUE: any option, no default
            assert "(default: " in action.help, action.dest
    # every algorithm with its estimator options, and MCGPO's pair options
    assert "  mcgpo: omega=" in text
    assert "pair options (--algo.pairs.<option> VALUE)" in text
    for name in ("grpo", "rloo", "gigpo", "graphgpo", "hgpo", "graphgpo_shaping"):
        assert f"  {name}:" in text


def test_each_command_takes_exactly_its_sections(capsys):
    parser = build_parser()
    for command, (tops, sections, _) in COMMANDS.items():
        sub = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
        dests = {a.dest for a in sub._actions if a.dest not in ("help", "set", "run")}
        expected = set(tops)
        for section in sections:
            cls = type(getattr(RunConfig(), section))
            expected |= {f"{section}.{f.name}" for f in scalar_fields(cls)}
        assert dests == expected, command


def test_flags_override_the_preset_which_overrides_defaults():
    cfg = resolve(
        "train",
        ["--preset", "household-quick", "--train.lr", "3e-4", "--algo.omega", "0.5",
         "--algo.pairs.kappa=2", "--save-rollouts", "--progress", "false"],
    )  # fmt: skip
    assert cfg.train.lr == 3e-4  # flag
    assert cfg.env.max_turns == 15  # preset (default 0)
    assert cfg.train.kl_coef == 0.01  # default
    assert cfg.save_rollouts is True and cfg.progress is False
    assert cfg.algo.estimator == {"omega": "0.5"}  # typed when the algorithm is resolved
    assert cfg.algo.pairs == {"kappa": "2"}
    assert cfg.preset == "household-quick"


def test_presets_command_lists_every_preset_with_its_command(capsys):
    code, out, _ = run_cli(capsys, "presets")
    assert code == 0
    for name in available_presets():
        assert name in out
    assert "mcgpo train --preset household-quick" in out


def test_console_script_entry_point():
    # the installed `mcgpo` script (pyproject: mcgpo.cli:main) gives the same one-line error
    proc = subprocess.run(
        [sys.executable, "-m", "mcgpo.cli", "train", "--train.lrr", "1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "mcgpo train: error: unknown option --train.lrr (did you mean '--train.lr'?)"
    )


def _train_run(folder, success: float, tail: str = "") -> str:
    """A train run folder as ``mcgpo train`` writes it: its algorithm, two evaluations."""
    import json

    folder.mkdir()
    (folder / "config.toml").write_text('[algo]\nname = "mcgpo"\n', encoding="utf-8")
    records = [
        {"update": 0, "eval/success": 0.0, "eval/episodes": 4},
        {"update": 2, "eval/success": success, "eval/episodes": 4},
    ]
    text = "".join(json.dumps(r) + "\n" for r in records) + tail
    (folder / "metrics.jsonl").write_text(text, encoding="utf-8")
    return str(folder)


def test_report_of_two_runs_at_the_same_stage_shows_both(capsys, tmp_path):
    a, b = _train_run(tmp_path / "a", 0.25), _train_run(tmp_path / "b", 0.75)
    code, out, _ = run_cli(capsys, "report", a, b)
    assert code == 0
    header, _, success = out.splitlines()[1:4]
    # one column each (the second run's used to replace the first's: same label)
    assert header.split() == [
        "metric", f"{a}:", "mcgpo", "update", "2", f"{b}:", "mcgpo", "update", "2"
    ]  # fmt: skip
    assert success.split() == ["success", "0.250", "0.750"]
    code, out, _ = run_cli(capsys, "report", a)  # one run: its label alone
    assert code == 0 and out.splitlines()[1].split() == ["metric", "mcgpo", "update", "2"]


def test_report_of_a_run_being_written_leaves_out_its_unfinished_last_line(capsys, tmp_path):
    run = _train_run(tmp_path / "run", 0.5, tail='{"update": 3, "eval/succ')  # mid-write
    code, out, err = run_cli(capsys, "report", run)
    assert (code, err) == (0, "")
    assert out.splitlines()[3].split() == ["success", "0.500"]
    # a finished line that is not a record still names the file and the line
    (tmp_path / "run" / "metrics.jsonl").write_text('{"update": 0}\n{"upd\n{"update": 1}\n')
    code, _, err = run_cli(capsys, "report", run)
    assert code == 2 and "metrics.jsonl line 2: not a JSON record" in one_line_error(err)


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["alfworld-generate", "--n-per-type", "many"], "mcgpo alfworld-generate"),
        (["export", "--bogus"], "mcgpo export"),
        (["env", "serve", "--bogus"], "mcgpo env serve"),
        (["bench", "--bogus"], "mcgpo bench"),
    ],
)
def test_every_commands_parser_answers_a_mistake_in_one_line(capsys, argv, prog):
    """The commands with parsers of their own share mcgpo.command_line.OneLineParser:
    ``<prog>: error: ...``, exit 2, no usage lines (alfworld-generate printed them)."""
    if argv[0] == "alfworld-generate":
        pytest.importorskip("alfworld")
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    assert one_line_error(capsys.readouterr().err).startswith(f"{prog}: error: ")
