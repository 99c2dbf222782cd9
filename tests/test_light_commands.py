"""The read-only commands import neither torch nor transformers.

``mcgpo --help``, ``mcgpo <command> --help``, ``mcgpo report`` (and ``--plot``), ``mcgpo
presets`` and every bad command line that exits 2 before a run starts (an unknown option,
algorithm option, environment or environment option with its did-you-mean, a bad value, a
missing model folder, a run folder that holds a run, an export of a run without adapters)
answer without loading torch or transformers, which take seconds to import. Each case runs
``main`` in one fresh interpreter, in turn, and records what ``sys.modules`` holds after it;
the last step imports the checkpoint module, which needs torch, to show that the record
would see it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
HEAVY = ("torch", "transformers")

# Runs each case's argv through mcgpo.cli.main in this one process; prints one JSON line:
# per case [exit code, stderr, heavy modules loaded so far], then the control's modules.
PROBE = """
import contextlib, io, json, sys
from mcgpo.cli import main
HEAVY = ("torch", "transformers")
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as stop:  # --help
            code = stop.code
    results.append([code, err.getvalue(), [m for m in HEAVY if m in sys.modules]])
import mcgpo.training.checkpoint  # the control: this one needs torch
control = [m for m in HEAVY if m in sys.modules]
print(json.dumps({"cases": results, "control": control}))
"""


def finished_run(folder: Path) -> Path:
    """A run folder as ``mcgpo train`` leaves it: config.toml, evaluations in metrics.jsonl."""
    folder.mkdir()
    (folder / "config.toml").write_text('[algo]\nname = "grpo"\n', encoding="utf-8")
    records = [
        {"update": 0, "eval/success": 0.25, "eval/score": 0.5, "eval/episodes": 4},
        {"update": 1, "rollout/success_rate": 0.5, "rollout/score_mean": 0.5, "loss/policy": 0.1},
        {"update": 1, "eval/success": 0.75, "eval/score": 0.8, "eval/episodes": 4},
    ]
    text = "".join(json.dumps(r) + "\n" for r in records)
    (folder / "metrics.jsonl").write_text(text, encoding="utf-8")
    return folder


def test_read_only_commands_and_early_errors_import_neither_torch_nor_transformers(tmp_path):
    run = finished_run(tmp_path / "run")
    png = tmp_path / "curves.png"
    # (argv, exit code, text stderr must hold)
    cases = [
        (["--help"], 0, ""),
        (["train", "--help"], 0, ""),
        (["eval", "--help"], 0, ""),
        (["sft", "--help"], 0, ""),
        (["bench", "--help"], 0, ""),
        (["sweep", "--help"], 0, ""),
        (["ablate", "--help"], 0, ""),
        (["export", "--help"], 0, ""),
        (["presets"], 0, ""),
        (["report", str(run)], 0, ""),
        (["report", str(run), "--plot", str(png)], 0, ""),
        (["trian"], 2, "did you mean 'train'"),
        (["train", "--trian.lr", "1"], 2, "did you mean"),
        (["train", "--train.lr", "abc"], 2, "train.lr: expected a number"),
        (["train", "--train.kl_kind", "k9"], 2, "train.kl_kind must be one of"),
        (["train", "--train.precision", "fp8"], 2, "train.precision must be one of"),
        (["train", "--algo.omeg", "0.5"], 2, "did you mean 'omega'"),
        (["train", "--env.name", "hosehold"], 2, "did you mean 'household'"),
        (["train", "--env.max_turn", "5"], 2, "option 'max_turn' (did you mean 'max_turns'?)"),
        (["sft", "--env.n_receptacle", "5"], 2, "did you mean 'n_receptacles'"),
        (["eval", "--run", "none", "--env.nope", "1"], 2, "unknown household option 'nope'"),
        (["train", "--env.name", "webshop", "--env.top", "5"], 2, "did you mean 'top_n'"),
        (["train", "--preset", "no-such-preset"], 2, "unknown preset 'no-such-preset'"),
        (["train", "--model", "Qwen/Qwen2.5-0.5B"], 2, "hf download Qwen/Qwen2.5-0.5B"),
        (["train", "--out", str(run)], 2, "already holds a run; use --resume"),
        (["train", "--resume", "--out", str(tmp_path / "empty")], 2, "--resume: no run folder"),
        (["eval", "--run", str(tmp_path / "empty")], 2, "no config.toml there"),
        (["report", str(tmp_path / "empty")], 2, "not found"),
        (["bench", "--algos", "grpo,nope"], 2, "unknown algorithm 'nope'"),
        (["bench", "--set", "train.lrr=1"], 2, "did you mean '--train.lr'"),
        (["ablate", "--set", "env.nope=1"], 2, "unknown household option 'nope'"),
        (["export", "--merge", str(run)], 2, "holds no LoRA adapter folder"),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps([argv for argv, _, _ in cases])],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for (argv, code, text), (got_code, stderr, heavy) in zip(cases, out["cases"], strict=True):
        assert heavy == [], f"mcgpo {' '.join(argv)} imported {heavy}"
        assert got_code == code, f"mcgpo {' '.join(argv)}: exit {got_code}; {stderr}"
        assert text in stderr, f"mcgpo {' '.join(argv)}: {stderr!r}"
        if code == 2:  # one line, never a traceback
            assert len(stderr.strip().splitlines()) == 1, stderr
    assert png.is_file()
    assert out["control"] == ["torch"]  # the record sees a heavy import when there is one
