"""A researcher's first hour (issue 42): eval reads the run it points into, one override
syntax, start lines, close-match suggestions, hub ids, a damaged metrics line, webshop-smoke.

Through the real command line, ``mcgpo.cli.main``; the runs use the smoke preset and the
micro model (seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mcgpo.cli import main, resolve
from mcgpo.training.config import RunConfig
from mcgpo.training.metrics import read_metrics
from mcgpo.training.start_lines import (
    cpu_size_note,
    eval_start_line,
    sft_start_line,
    train_start_line,
)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def trained(micro_model, tmp_path_factory) -> Path:
    """A finished smoke run: 1 update, 1 held-out task per evaluation, 3 turns."""
    import torch

    threads = torch.get_num_threads()
    out = tmp_path_factory.mktemp("runs") / "smoke"
    argv = ["train", "--preset", "household-smoke", "--model", str(micro_model), "--out",
            str(out), "--train.updates", "1", "--eval.tasks", "1", "--threads", "1"]  # fmt: skip
    assert main(argv) == 0
    torch.set_num_threads(threads)
    return out


# ---------------------------------------------------------------- friction 1: eval of a run
def test_eval_of_a_gpu_run_without_cuda_falls_back_to_the_cpu(trained, tmp_path, capsys,
                                                              monkeypatch):  # fmt: skip
    import shutil

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine: no CUDA
    run = tmp_path / "gpu-run"  # the smoke run as a GPU trained it: device = "cuda"
    shutil.copytree(trained / "model", run / "model")
    text = (trained / "config.toml").read_text(encoding="utf-8")
    assert '\ndevice = "cpu"\n' in text
    (run / "config.toml").write_text(text.replace('\ndevice = "cpu"\n', '\ndevice = "cuda"\n'))
    assert resolve("eval", ["--run", str(run)]).device == "cuda"  # what the run says
    capsys.readouterr()
    assert main(["eval", "--run", str(run)]) == 0
    err = capsys.readouterr().err
    assert err.splitlines()[0] == (
        "mcgpo eval: note: the run trained on cuda, and CUDA is not available on this "
        "machine: evaluating on the CPU (--device cpu)"
    )
    assert err.splitlines()[1].startswith(f"[eval] {run / 'model'} on household: ")
    assert ", cpu; eval.json -> " in err.splitlines()[1]
    assert json.loads((run / "eval.json").read_text())["eval/episodes"] == 1.0
    # asked for on the command line: still one line naming the device, exit 2
    assert main(["eval", "--run", str(run), "--device", "cuda"]) == 2
    assert capsys.readouterr().err.strip() == (
        "mcgpo eval: error: --device cuda: CUDA is not available on this machine"
    )


def gpu_run(trained: Path, folder: Path, **saved: str) -> Path:
    """The smoke run as a GPU trained it (``device = "cuda"``), with other saved settings:
    ``nproc="2"``, ``backend='"nccl"'``, ``engine='"vllm"'`` (TOML values)."""
    import shutil

    shutil.copytree(trained / "model", folder / "model")
    text = (trained / "config.toml").read_text(encoding="utf-8")
    for key, value in {"device": '"cuda"', **saved}.items():
        line = next(x for x in text.splitlines() if x.startswith(f"{key} = "))
        text = text.replace(f"\n{line}\n", f"\n{key} = {value}\n")
    (folder / "config.toml").write_text(text, encoding="utf-8")
    return folder


def test_eval_of_a_distributed_vllm_gpu_run_without_cuda_is_one_cpu_process_with_hf(
    trained, tmp_path, capsys, monkeypatch
):
    import torch

    from mcgpo.training.preflight import preflight

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine: no CUDA
    run = gpu_run(trained, tmp_path / "gpu-run", nproc="2", backend='"nccl"', engine='"vllm"')
    saved = resolve("eval", ["--run", str(run)])
    assert (saved.device, saved.nproc, saved.backend, saved.rollout.engine) == (
        "cuda",
        2,
        "nccl",
        "vllm",
    )  # what the run says; before this fallback: 2 gloo processes, or nccl refused on CPU
    capsys.readouterr()
    assert main(["eval", "--run", str(run)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "mcgpo eval: note: the run trained on cuda with 2 processes and rollout.engine vllm, "
        "and CUDA is not available on this machine: evaluating in one process on the CPU with "
        "mcgpo's HF sampler (--device cpu --nproc 1 --backend auto --rollout.engine hf)"
    )
    assert err[1].startswith(f"[eval] {run / 'model'} on household: ") and ", cpu; " in err[1]
    assert json.loads((run / "eval.json").read_text())["processes"] == 1

    def here(*flags: str) -> tuple[RunConfig, str | None]:
        argv = ["--run", str(run), *flags]
        return preflight("eval", resolve("eval", argv), argv)

    # what the command line gives stays, and the note names only what changed
    cfg, note = here("--nproc", "2", "--rollout.engine", "hf")
    assert (cfg.device, cfg.nproc, cfg.backend, cfg.rollout.engine) == ("cpu", 2, "auto", "hf")
    assert note == (
        "the run trained on cuda, and CUDA is not available on this machine: evaluating on the "
        "CPU (--device cpu --backend auto)"
    )
    monkeypatch.setenv("WORLD_SIZE", "2")  # a rank of torchrun's 2: the processes stay
    cfg, note = here()
    assert (cfg.device, cfg.nproc, cfg.backend) == ("cpu", 2, "auto")
    assert note is not None and "one process" not in note and "2 processes" not in note
    monkeypatch.delenv("WORLD_SIZE")
    cfg, note = here("--backend", "gloo")
    assert (cfg.nproc, cfg.backend, cfg.rollout.engine) == (1, "gloo", "hf")
    assert note is not None and note.endswith("(--device cpu --nproc 1 --rollout.engine hf)")
    # what cannot run here is one line naming the option to pass, exit 2
    assert main(["eval", "--run", str(run), "--rollout.engine", "vllm"]) == 2
    assert one_line(capsys.readouterr().err) == (
        "mcgpo eval: error: --rollout.engine vllm: mcgpo eval samples with mcgpo's HF sampler "
        "(the engine serves mcgpo train's rollouts, docs/rollout.md section 9): drop the option"
    )
    assert main(["eval", "--run", str(run), "--backend", "nccl"]) == 2
    assert one_line(capsys.readouterr().err) == (
        "mcgpo eval: error: --backend nccl: the run trained on cuda, and CUDA is not available "
        "on this machine, so it is evaluated on the CPU: pass --backend gloo (or drop it)"
    )
    assert main(["eval", "--run", str(run), "--device", "cuda"]) == 2
    assert one_line(capsys.readouterr().err).endswith(
        "--device cuda: CUDA is not available on this machine"
    )


def test_the_nproc_launcher_leaves_the_note_to_its_rank_0(trained, tmp_path, capsys, monkeypatch):
    import torch

    import mcgpo.training.distributed as distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    started: list[tuple[int, list[str]]] = []
    monkeypatch.setattr(distributed, "launch_local", lambda n, argv: started.append((n, argv)) or 0)
    run = gpu_run(trained, tmp_path / "gpu-run")
    capsys.readouterr()
    argv = ["eval", "--run", str(run), "--nproc", "2"]
    assert main(argv) == 0
    assert started == [(2, argv)]  # each process runs the same command line and preflight
    assert capsys.readouterr().err == ""  # the launcher says nothing; its rank 0 says it once


def test_eval_of_a_model_in_a_run_folder_uses_the_runs_config(trained, capsys):
    capsys.readouterr()
    assert main(["eval", "--model", str(trained / "model")]) == 0
    out, err = capsys.readouterr()
    # the run's sizes (1 task, 3 turns), not the defaults (128 tasks, the env's 50 turns)
    assert err.startswith(
        f"[eval] {trained / 'model'} on household: 1 held-out tasks of valid_seen at T=0.4, cpu; "
        f"eval.json -> {trained}"
    )
    record = json.loads((trained / "eval.json").read_text())
    assert record["eval/episodes"] == 1.0 and record["eval/turns"] <= 3
    assert "evaluation of" in out
    # eval.* may change; the base is still the run (3 turns, the smoke preset's prompts)
    cfg = resolve("eval", ["--run", str(trained), "--eval.tasks", "5", "--set", "eval.split=train"])
    assert (cfg.eval.tasks, cfg.eval.split, cfg.env.max_turns) == (5, "train", 3)
    assert cfg.model == str(trained / "model") and cfg.out == str(trained)
    assert (cfg.rollout.history, cfg.rollout.response_format) == (1, "action")
    # a checkpoint's model names its run too
    checkpoint = trained / "checkpoints" / "update-000001" / "model"
    assert resolve("eval", ["--model", str(checkpoint)]).eval.tasks == 1
    # --out DIR names the run too; --run none evaluates with the defaults
    assert resolve("eval", ["--out", str(trained)]).eval.tasks == 1
    bare = resolve("eval", ["--run", "none", "--model", str(trained / "model")])
    assert (bare.eval.tasks, bare.out) == (RunConfig().eval.tasks, RunConfig().out)


def test_eval_names_every_setting_that_would_change_the_runs_tasks(trained, capsys):
    argv = ["eval", "--model", str(trained / "model"), "--env.name", "webshop",
            "--rollout.history", "3", "--env.n_receptacles", "9"]  # fmt: skip
    assert main(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"mcgpo eval: error: run folder '{trained}': env.n_receptacles is '9' ")
    assert (
        "env.n_receptacles is '9' but the run was started without it; env.name is 'webshop' "
        in line
    )
    assert "rollout.history is 3 but the run was started with 1" in line
    assert "out is" not in line and "--run none" in line


def test_eval_run_without_a_model_or_config_is_one_line(tmp_path, capsys):
    assert main(["eval", "--run", str(tmp_path)]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"mcgpo eval: error: --run '{tmp_path}': no config.toml there (not a run folder)"
    )


def test_eval_help_is_in_evals_words(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = capsys.readouterr().out
    assert "--run DIR" in text and "eval.json" in text and "--config" in text
    for training_only in ("--rollout.groups", "--rollout.temperature", "--eval.every",
                          "--env.train_split", "per update", "training rollouts"):  # fmt: skip
        assert training_only not in text, training_only


# ---------------------------------------------------------------- friction 8: start lines
def test_train_says_what_it_runs_before_the_first_evaluation(micro_model, tmp_path, capsys):
    argv = ["train", "--preset", "household-smoke", "--model", str(micro_model), "--out",
            str(tmp_path / "run"), "--train.updates", "1", "--threads", "1"]  # fmt: skip
    assert main([*argv, "--progress", "true"]) == 0
    err = capsys.readouterr().err
    assert "eval:   0%|" in err and "0/2 [" in err  # a bar over each evaluation's episodes
    assert main([*argv, "--out", str(tmp_path / "quiet")]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        f"[train] mcgpo on household: 1 updates of 2x4 rollouts, eval on 2 held-out tasks every "
        f"1 updates; model {micro_model} on cpu; run folder {tmp_path / 'quiet'}"
    )
    assert lines[1] == "[train] evaluating the policy before training (2 tasks)"
    assert all("%|" not in line for line in lines)  # --progress false (the preset's): no bars


def test_code_version_names_the_commit_where_git_knows_it(monkeypatch):
    import mcgpo
    from mcgpo.training.run_folder import code_version

    here = Path(mcgpo.__file__).parent
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True)
    code = code_version()
    assert code["version"] == mcgpo.__version__
    if head.returncode == 0:  # a source checkout (CI, this repository)
        assert code["commit"] == head.stdout.strip() and isinstance(code["dirty"], bool)
    monkeypatch.setenv("PATH", "")  # no git: unknown, not an error
    assert code_version()["commit"] is None and code_version()["dirty"] is None


def test_a_bare_train_on_the_cpu_names_the_smaller_presets():
    bare = resolve("train", [])  # `mcgpo train` with nothing: 150 updates of 16 x 8
    note = cpu_size_note(bare)
    assert note is not None
    assert note.startswith("[train] note: 150 updates of 16x8 rollouts (19,200 episodes) on the")
    assert "--preset household-smoke" in note and "mcgpo presets" in note
    assert "150 updates of 16x8 rollouts" in train_start_line(bare)
    assert cpu_size_note(resolve("train", ["--preset", "household-quick"])) is None
    assert cpu_size_note(resolve("train", ["--device", "cuda"])) is None
    assert cpu_size_note(bare, updates_done=148) is None  # a resume near its end


def test_sft_and_eval_start_lines_say_what_runs_on_what_and_where_it_writes():
    # household-smoke's warm start: 2 demonstrations, 2 held-out tasks (its [sft], [eval])
    smoke = resolve("sft", ["--preset", "household-smoke", "--out", "runs/w", "--sft.epochs", "2"])
    assert sft_start_line(smoke) == (
        "[sft] warm start of tiny on household: 2 expert episodes, 2 epochs, eval on 2 "
        "held-out tasks before and after; run folder runs/w"
    )
    cfg = resolve("eval", ["--run", "none", "--eval.tasks", "7", "--eval.temperature", "0"])
    assert eval_start_line(cfg) == (
        "[eval] tiny on household: 7 held-out tasks of valid_seen at T=0.0, cpu; "
        f"eval.json -> {RunConfig().out}"
    )


# ---------------------------------------------------------------- friction 10: one syntax
def test_every_run_command_takes_both_override_forms():
    for command in ("train", "sft", "eval"):
        a = resolve(command, ["--rollout.max_new_tokens", "7", "--seed=3", "--env.n_receptacles",
                              "12", "--config", "household-smoke"])  # fmt: skip
        b = resolve(command, ["--set", "rollout.max_new_tokens=7", "--set=seed=3", "--set",
                              "env.n_receptacles=12", "--preset", "household-smoke"])  # fmt: skip
        assert a == b, command
        assert (a.rollout.max_new_tokens, a.seed, a.preset) == (7, 3, "household-smoke")
        assert dict(a.env.options) == {"n_receptacles": "12"}
    cfg = resolve(
        "train", ["--set", "train.lr=1e-3", "--save_rollouts", "--set", "algo.pairs.kappa=2"]
    )
    assert cfg.train.lr == 1e-3 and cfg.save_rollouts is True and cfg.algo.pairs == {"kappa": "2"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--train.lrr", "1"], "unknown option --train.lrr (did you mean '--train.lr'?)"),
        (["train", "--set", "train.lrr=1"], "unknown option --train.lrr (did you mean"),
        (["train", "--set", "train.lr"], "--set expects KEY=VALUE, got 'train.lr'"),
        (["eval", "--confg", "x"], "unknown option --confg (did you mean '--config'?)"),
        (
            ["train", "--preset", "household-smok"],
            "unknown preset 'household-smok' (did you mean 'household-smoke'?); known: ",
        ),
        (["train", "--algo.name", "mcgop"], "unknown algorithm 'mcgop' (did you mean 'mcgpo'?)"),
        (
            ["train", "--algo.pairs.kapa", "2"],
            "unknown option --algo.pairs.kapa for mcgpo (did you mean 'kappa'?)",
        ),
        (
            ["eval", "--env.name", "webshp"],
            "unknown environment 'webshp' (did you mean 'webshop'?)",
        ),
    ],
)
def test_unknown_names_get_the_closest_known_one(capsys, tmp_path, argv, message):
    assert main([*argv, "--out", str(tmp_path)]) == 2
    assert message in one_line(capsys.readouterr().err)


# ---------------------------------------------------------------- hub ids, damaged metrics
def test_a_hub_id_is_told_to_pass_a_local_folder():
    proc = subprocess.run(
        [sys.executable, "-m", "mcgpo.cli", "train", "--model", "Qwen/Qwen2.5-1.5B-Instruct"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert one_line(proc.stderr) == (
        "mcgpo train: error: model folder 'Qwen/Qwen2.5-1.5B-Instruct' not found; pass a local "
        "folder: download the hub model first, e.g. `hf download Qwen/Qwen2.5-1.5B-Instruct "
        "--local-dir models/Qwen2.5-1.5B-Instruct`, then --model models/Qwen2.5-1.5B-Instruct "
        "(no download here)"
    )


def test_a_damaged_metrics_line_in_report_names_file_and_line(trained, tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    lines = (trained / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:25]  # a record cut short
    (broken / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["report", str(broken)]) == 2
    assert one_line(capsys.readouterr().err).startswith(
        f"mcgpo report: error: {broken / 'metrics.jsonl'} line 2: not a JSON record ("
    )


# ---------------------------------------------------------------- friction 9: webshop-smoke
@pytest.mark.slow
def test_webshop_smoke_runs_the_warm_start_and_training(tmp_path, capsys):
    sft, run = tmp_path / "sft", tmp_path / "run"
    assert main(["sft", "--preset", "webshop-smoke", "--out", str(sft)]) == 0
    argv = ["train", "--preset", "webshop-smoke", "--model", str(sft / "model"), "--out", str(run)]
    assert main(argv) == 0
    record = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert record["update"] == 2 and record["eval/episodes"] == 2.0
    assert "eval/score" in record  # WebShop grades each episode


def test_a_run_without_a_learning_signal_says_so(tmp_path, capsys):
    from mcgpo.training.trainer import _no_signal_note

    def note(*records):
        folder = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        lines = [json.dumps({"update": 0, "eval/success": 0.0})]
        lines += [json.dumps({"update": u + 1, **r}) for u, r in enumerate(records)]
        (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        return _no_signal_note(SimpleNamespace(folder=folder))

    flat = {"adv/std": 0.0, "pairs/preferences": 0.0}
    assert note(flat, {"adv/std": 0.0}).startswith(
        "[train] warning: none of the 2 updates had a learning signal"
    )
    assert note(flat, {"adv/std": 0.25, "pairs/preferences": 0.0}) is None  # one update learned
    assert note(flat, {"adv/std": 0.0, "pairs/preferences": 3.0}) is None  # pairs are a signal
    assert note() is None  # no update yet

    # the README's first run (a fresh tiny policy, smoke sizes) never succeeds: it says so
    out = tmp_path / "quick"
    assert main(["train", "--preset", "household-smoke", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    updates = [r for r in read_metrics(out / "metrics.jsonl") if "adv/std" in r]
    assert [r["adv/std"] for r in updates] == [0.0, 0.0]
    assert "[train] warning: none of the 2 updates had a learning signal" in err
