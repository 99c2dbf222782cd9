"""Resume equivalence: stopped after update 2 and resumed equals the uninterrupted run.

Bit-identical on CPU with ``--deterministic`` and one thread: the checkpoint holds the
weights (safetensors, exact), the AdamW state, the RNG states and the task cursor, and the
rollout seeds derive from (seed, update).
"""

from __future__ import annotations

import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file

import mcgpo
from mcgpo.cli import main
from mcgpo.training.checkpoint import latest_checkpoint, load_checkpoint
from mcgpo.training.metrics import read_metrics

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.slow  # short runs


@pytest.fixture
def run(smoke_args):
    def train(out, *extra):
        assert main(smoke_args(out, "--deterministic", "--threads", "1", *extra)) == 0

    return train


def test_resumed_run_equals_the_uninterrupted_run(run, tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    run(whole, "--train.updates", "4")
    run(parts, "--train.updates", "2")
    assert load_checkpoint(latest_checkpoint(parts)).update == 2
    run(parts, "--train.updates", "4", "--resume")

    a, b = (
        load_file(str(whole / "model/model.safetensors")),
        load_file(str(parts / "model/model.safetensors")),
    )
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key

    state_a = load_checkpoint(latest_checkpoint(whole))
    state_b = load_checkpoint(latest_checkpoint(parts))
    assert (state_a.update, state_a.task_cursor) == (state_b.update, state_b.task_cursor) == (4, 8)
    for sa, sb in zip(state_a.optimizer["state"].values(), state_b.optimizer["state"].values()):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"])
        assert torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])

    # the logs read as one run: same update records, time stamps and memory peaks aside
    def records(folder):
        out = []
        for r in read_metrics(folder / "metrics.jsonl"):
            out.append({k: v for k, v in r.items() if not k.startswith(("time", "memory/"))
                        and not k.endswith("seconds")})  # fmt: skip
        return out

    ra, rb = records(whole), records(parts)
    assert [r["update"] for r in ra] == [r["update"] for r in rb]
    assert ra == rb


def test_resume_names_every_fixed_key_that_differs(run, smoke_args, tmp_path, capsys):
    out = tmp_path / "run"
    run(out, "--train.updates", "1")
    capsys.readouterr()
    # the old bug: only the first differing key in alphabetical order, and a wrong one
    # (algo.convention, an option that differs because algo.name does)
    code = main(["train", "--resume", "--out", str(out), "--algo.name", "grpo",
                 "--train.lr", "0.5", "--rollout.groups", "3"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(
        "mcgpo train: error: --resume: algo.name is 'grpo' but the run was started with "
        "'mcgpo'; rollout.groups is 3 but the run was started with 2; train.lr is 0.5 but the "
        "run was started with 0.001 (config.toml of "
    )
    assert "convention" not in err and "out is" not in err


def test_resume_reads_config_toml_keeps_the_command_and_follows_a_moved_folder(
    run, smoke_args, tmp_path, capsys
):
    first = tmp_path / "first"
    run(first, "--train.updates", "1")
    text = (first / "config.toml").read_text()
    started = text.splitlines()[0]
    assert started.startswith("# mcgpo train --preset household-smoke --model ")
    moved = tmp_path / "moved"
    first.rename(moved)  # config.toml still says out = ".../first"
    # no flag retyped: the preset, the model, --deterministic and --threads come from config.toml
    argv = ["train", "--resume", "--out", str(moved), "--train.updates", "2",
            "--eval.tasks", "1", "--set", "progress=false"]  # fmt: skip
    assert main(argv) == 0
    assert load_checkpoint(latest_checkpoint(moved)).update == 2
    lines = (moved / "config.toml").read_text().splitlines()
    assert lines[0] == started
    assert lines[1] == "# resumed: mcgpo " + " ".join(argv)
    saved = tomllib.loads((moved / "config.toml").read_text())
    assert saved["train"]["updates"] == 2 and saved["eval"]["tasks"] == 1
    assert saved["out"] == str(moved) and saved["deterministic"] is True
    code = saved["code"]
    assert code["version"] == mcgpo.__version__
    assert [r["command"] for r in code["resumed"]] == ["mcgpo " + " ".join(argv)]
    # a second resume appends; the first line stays the command that started the run
    assert main(["train", "--resume", "--out", str(moved), "--train.updates", "3"]) == 0
    lines = (moved / "config.toml").read_text().splitlines()
    assert lines[0] == started
    assert lines[2] == f"# resumed: mcgpo train --resume --out {moved} --train.updates 3"
    assert len(tomllib.loads((moved / "config.toml").read_text())["code"]["resumed"]) == 2


@pytest.mark.parametrize(
    ("damaged", "says"),
    [
        ("trainer.pt", "'{path}' is damaged and cannot be read ("),
        ("model/model.safetensors", "policy folder '{path}': cannot load the model ("),
    ],
)
def test_a_damaged_checkpoint_falls_back_to_the_previous_one(run, tmp_path, capsys, damaged, says):
    out = tmp_path / "run"
    run(out, "--train.updates", "2")  # save_every 1 keeps update-000001 and update-000002
    newest = out / "checkpoints" / "update-000002" / damaged
    newest.write_bytes(newest.read_bytes()[:300])  # a write cut short
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(out), "--train.updates", "3"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "weights_only" not in err
    path = newest if damaged == "trainer.pt" else newest.parent
    assert "[train] warning: " + says.format(path=path) in err
    assert "[train] warning: resuming from the previous kept checkpoint, update-000001" in err
    # the run went on from update 1: updates 2 and 3 were run again
    assert load_checkpoint(latest_checkpoint(out)).update == 3
    updates = [r["update"] for r in read_metrics(out / "metrics.jsonl") if "loss/policy" in r]
    assert updates == [1, 2, 3]


def test_no_readable_checkpoint_is_one_line(run, tmp_path, capsys):
    out = tmp_path / "run"
    run(out, "--train.updates", "2")
    for name in ("update-000001", "update-000002"):
        (out / "checkpoints" / name / "trainer.pt").write_bytes(b"not a torch file")
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(out), "--train.updates", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"mcgpo train: error: --resume: no usable checkpoint in '{out}': ")
    assert err.count("is damaged and cannot be read") == 2


def test_a_component_option_from_the_command_line_equals_its_saved_value():
    from mcgpo.training.run_folder import fixed_changes

    fixed = lambda key: False  # noqa: E731 - every key compared
    # --env.retries 0 is the string "0" until the environment reads it; config.toml holds 0
    assert fixed_changes({"env.retries": 0}, {"env.retries": "0"}, fixed) == []
    assert fixed_changes({"env.flag": True}, {"env.flag": "true"}, fixed) == []
    assert fixed_changes({"env.retries": 0}, {"env.retries": "1"}, fixed) == [
        "env.retries is '1' but the run was started with 0"
    ]


def test_a_run_stopped_before_its_first_checkpoint_resumes_from_update_0(run, tmp_path, capsys):
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    run(whole, "--train.updates", "2")
    run(stopped, "--train.updates", "2")
    # as Ctrl-C in update 2 of a run saving every 4 leaves it: config.toml, the first records
    shutil.rmtree(stopped / "checkpoints")
    shutil.rmtree(stopped / "model")
    lines = (stopped / "metrics.jsonl").read_text().splitlines(keepends=True)
    (stopped / "metrics.jsonl").write_text("".join(lines[:3]))
    capsys.readouterr()
    assert main(["train", "--out", str(stopped)]) == 2  # a fresh run there: it holds a run
    assert "already holds a run" in capsys.readouterr().err
    assert main(["train", "--resume", "--out", str(stopped)]) == 0  # used to be a dead end
    err = capsys.readouterr().err
    assert "the run stopped before its first checkpoint: it starts again from update 0" in err
    a = load_file(str(whole / "model/model.safetensors"))
    b = load_file(str(stopped / "model/model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    def records(folder):  # written again from update 0, not appended to the old ones
        return [
            (r["update"], r.get("eval/success"), r.get("loss/policy"))
            for r in read_metrics(folder / "metrics.jsonl")
        ]

    assert records(whole) == records(stopped)
    first = (stopped / "config.toml").read_text().splitlines()[:2]
    assert first[1] == f"# resumed: mcgpo train --resume --out {stopped}"
