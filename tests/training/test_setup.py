"""The one setup path of train / sft / eval: bad --out folders, config.toml, collect options."""

from __future__ import annotations

import os
import re

import pytest
import torch

from mcgpo.cli import main
from mcgpo.rollout import CollectOptions
from mcgpo.training import setup as run_setup
from mcgpo.training.build import build_optimizer, collect_options
from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.config_layout import from_dict
from mcgpo.training.run_folder import writable_folder
from mcgpo.training.setup import prepare
from mcgpo.training.update import clip_gradients

COMMANDS = ("train", "sft", "eval")


@pytest.fixture
def command_args(micro_model):
    """``mcgpo <command>`` arguments of the smoke preset with ``--out out``."""

    def args(command: str, out) -> list[str]:
        return [command, "--preset", "household-smoke", "--model", str(micro_model), "--out", str(out)]  # fmt: skip

    return args


@pytest.fixture
def no_model_work(monkeypatch):
    """Loading a policy fails the test: the checks must come before any model work."""

    def fail(*args, **kwargs):
        raise AssertionError("the policy was loaded before the --out folder was checked")

    monkeypatch.setattr(run_setup, "load_model", fail)


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err  # one line, no traceback
    return err.strip()


@pytest.mark.parametrize("command", COMMANDS)
def test_out_under_a_regular_file_is_one_line_and_exit_2(
    command, command_args, tmp_path, capsys, no_model_work
):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a folder")
    out = blocker / "run"
    assert main(command_args(command, out)) == 2
    assert error_line(capsys) == (
        f"mcgpo {command}: error: --out {str(out)!r}: cannot create the folder (Not a directory)"
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_out_that_is_a_regular_file_is_one_line_and_exit_2(
    command, command_args, tmp_path, capsys, no_model_work
):
    out = tmp_path / "notes.txt"
    out.write_text("a file, not a folder")
    assert main(command_args(command, out)) == 2
    assert (
        error_line(capsys)
        == f"mcgpo {command}: error: --out {str(out)!r} exists and is not a folder"
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_read_only_out_folder_is_one_line_and_exit_2(
    command, command_args, tmp_path, capsys, no_model_work
):
    out = tmp_path / "locked"
    out.mkdir()
    out.chmod(0o555)
    try:
        if os.access(out, os.W_OK):
            pytest.skip("chmod does not stop this user from writing (root)")
        assert main(command_args(command, out)) == 2
    finally:
        out.chmod(0o755)
    assert (
        error_line(capsys)
        == f"mcgpo {command}: error: --out {str(out)!r}: the folder is not writable"
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_unwritable_out_folder_is_reported_also_where_chmod_is_not_enough(
    command, command_args, tmp_path, capsys, no_model_work, monkeypatch
):
    # As root chmod 555 does not stop writes; os.access is what the check asks, so a folder
    # it calls unwritable (a read-only mount, an ACL) stands in for the real thing.
    out = tmp_path / "locked"
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if p == out else real_access(p, mode))
    assert main(command_args(command, out)) == 2
    assert (
        error_line(capsys)
        == f"mcgpo {command}: error: --out {str(out)!r}: the folder is not writable"
    )


def test_writable_folder_creates_missing_parents(tmp_path):
    folder = writable_folder(tmp_path / "a" / "b")
    assert folder.is_dir() and folder == tmp_path / "a" / "b"
    assert writable_folder(folder) == folder  # an existing folder is fine


def test_bad_env_option_is_reported_before_the_folder_is_created(
    command_args, tmp_path, capsys, no_model_work
):
    out = tmp_path / "run"
    assert main([*command_args("sft", out), "--env.no_such_option", "1"]) == 2
    assert "error: env 'household'" in error_line(capsys)
    assert not out.exists()


def test_prepare_writes_config_toml_for_train_and_sft_but_not_eval(micro_model, tmp_path):
    base = from_dict({"env": {"max_turns": 3}, "model": str(micro_model)})
    for kind in ("sft", "eval"):
        cfg = from_dict({"out": str(tmp_path / kind)}, base)
        setup = prepare(cfg, f"mcgpo {kind}", kind=kind)
        assert setup.folder == tmp_path / kind and setup.folder.is_dir()
        assert (setup.folder / "config.toml").exists() == (kind != "eval")
        assert setup.response_format == "action"  # auto: the tiny tokenizer has no template
        assert setup.make_env().max_turns > 0
    text = (tmp_path / "sft" / "config.toml").read_text()
    assert text.startswith("# mcgpo sft")
    with pytest.raises(ValueError, match="kind must be one of train, sft, eval; got 'bench'"):
        prepare(base, kind="bench")


def test_collect_options_come_from_the_run_config():
    cfg = from_dict(
        {
            "env": {"max_turns": 0},
            "rollout": {"max_new_tokens": 7, "history": 1, "max_prompt_tokens": 99},
        }
    )
    opts = collect_options(cfg, "think", split="valid_seen", temperature=0.4, group_size=1, seed=5)
    assert opts == CollectOptions(
        group_size=1,
        split="valid_seen",
        temperature=0.4,
        max_turns=None,  # env.max_turns 0 = the environment's own limit
        max_new_tokens=7,
        history=1,
        response_format="think",
        seed=5,
        max_prompt_tokens=99,
    )
    with pytest.raises(ValueError, match="unknown response_format 'json'"):
        collect_options(RunConfig(), "json", split="train", temperature=1.0, group_size=8, seed=0)


def test_clip_gradients_zero_is_off():
    # gradient (3, 4): norm 5. max_norm 1 scales it to (0.6, 0.8); 0 leaves it unchanged.
    p = torch.nn.Parameter(torch.zeros(2))
    for max_norm, expected in ((1.0, [0.6, 0.8]), (0.0, [3.0, 4.0])):
        p.grad = torch.tensor([3.0, 4.0])
        norm = clip_gradients([p], max_norm)
        assert norm.item() == pytest.approx(5.0)
        assert p.grad.tolist() == pytest.approx(expected)


def test_sft_settings_reach_the_optimizer_and_the_clip(micro_model, tmp_path, monkeypatch):
    from mcgpo.policy import load_policy
    from mcgpo.training import sft
    from mcgpo.training.metrics import MetricSinks

    seen = {}

    def optimizer(model, lr, weight_decay):
        seen["optimizer"] = (lr, weight_decay)
        return build_optimizer(model, lr, weight_decay)

    def clip(params, max_norm):
        seen["clip"] = max_norm
        return clip_gradients(params, max_norm)

    monkeypatch.setattr(sft, "build_optimizer", optimizer)
    monkeypatch.setattr(sft, "clip_gradients", clip)
    model, tokenizer = load_policy(micro_model)
    demos = sft.Demonstrations([[1, 5, 6]], [[7, tokenizer.eos_token_id]], 1)
    cfg = from_dict({"progress": False, "sft": {"lr": 0.01, "weight_decay": 0.3, "grad_clip": 0.0}})
    sinks = MetricSinks(tmp_path, report_to=())
    try:
        assert sft.fine_tune(model, tokenizer, demos, cfg, sinks) == cfg.sft.epochs
    finally:
        sinks.close()
    assert seen == {"optimizer": (0.01, 0.3), "clip": 0.0}


def test_sft_optimizer_defaults_are_the_former_constants():
    # before the fields existed sft.py hard-coded AdamW weight decay 0.01 and clip 1.0
    assert (RunConfig().sft.weight_decay, RunConfig().sft.grad_clip) == (0.01, 1.0)
    with pytest.raises(ConfigError, match=r"sft.grad_clip must be >= 0.0, got -1.0"):
        from_dict({"sft": {"grad_clip": -1.0}}).check()


def test_resume_ignores_the_settings_the_algorithm_never_reads(tmp_path):
    """algo.lambda_pair's default moved from 1.0 to 10.0 (issue 35): a GraphGPO run started
    before resumes (it has no pair loss); an MCGPO run does not (its update would change)."""
    from mcgpo.training.presets import to_toml
    from mcgpo.training.run_folder import check_same_run, unused_algo_keys

    saved = tmp_path / "config.toml"
    assert unused_algo_keys("graphgpo") == {"algo.lambda_pair", "algo.shaping_coef"}
    assert unused_algo_keys("mcgpo") == {"algo.shaping_coef"}
    assert unused_algo_keys("graphgpo_shaping") == {"algo.lambda_pair"}
    saved.write_text(to_toml(from_dict({"algo": {"name": "graphgpo", "lambda_pair": 1.0}}), ""))
    check_same_run(saved, from_dict({"algo": {"name": "graphgpo"}}))  # now 10.0: unread
    with pytest.raises(
        ConfigError, match=re.escape("algo.name is 'mcgpo' but the run was started with")
    ):
        check_same_run(saved, from_dict({"algo": {"name": "mcgpo", "lambda_pair": 1.0}}))
    saved.write_text(to_toml(from_dict({"algo": {"name": "mcgpo", "lambda_pair": 1.0}}), ""))
    with pytest.raises(
        ConfigError, match=re.escape("algo.lambda_pair is 10.0 but the run was started with 1.0")
    ):
        check_same_run(saved, from_dict({"algo": {"name": "mcgpo"}}))
    check_same_run(saved, from_dict({"algo": {"name": "mcgpo", "lambda_pair": 1.0}}))
