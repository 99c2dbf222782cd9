"""Ctrl-C (SIGINT): one line saying what is left and how to go on, exit 130, and the run
folder left resumable (tests/training/test_resume.py: a run stopped before its first
checkpoint resumes from update 0)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mcgpo.cli import main, resolve
from mcgpo.training.checkpoint import latest_checkpoint, load_checkpoint
from mcgpo.training.run_folder import interrupted_line

SRC = Path(__file__).resolve().parents[2] / "src"


def test_ctrl_c_in_train_says_how_to_go_on_and_the_run_goes_on(micro_model, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [
        sys.executable, "-m", "mcgpo", "train", "--preset", "household-smoke", "--model",
        str(micro_model), "--out", str(out), "--train.updates", "1000", "--eval.every", "0",
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(  # SIGINT as a terminal's Ctrl-C delivers it (not ignored)
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600  # a wide margin on a busy machine: not a timing
        while latest_checkpoint(out) is None and proc.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint within 10 minutes"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    saved = load_checkpoint(latest_checkpoint(out)).update
    assert err.strip().splitlines()[-1] == (
        f"mcgpo train: interrupted; mcgpo train --resume --out {out} goes on from its "
        f"checkpoint at update {saved}"
    )
    # the line's command goes on from there
    assert main(["train", "--resume", "--out", str(out), "--train.updates", str(saved + 1)]) == 0
    assert load_checkpoint(latest_checkpoint(out)).update == saved + 1
    capsys.readouterr()


def test_the_ctrl_c_line_of_each_command(tmp_path):
    def cfg(command, out):
        return resolve(command, ["--preset", "household-smoke", "--out", str(out)])

    started = tmp_path / "started"  # config.toml, no checkpoint yet
    started.mkdir()
    (started / "config.toml").write_text("# mcgpo train --out started\n")
    assert interrupted_line("train", cfg("train", started)) == (
        f"mcgpo train: interrupted before the first checkpoint; mcgpo train --resume --out "
        f"{started} starts it again"
    )
    assert interrupted_line("sft", cfg("sft", tmp_path / "warm")) == (
        "mcgpo sft: interrupted before the policy was saved; run the same command again"
    )
    assert interrupted_line("eval", cfg("train", started)) == (
        "mcgpo eval: interrupted; nothing was written (eval.json is written at the end)"
    )
    assert interrupted_line("train", None) == "mcgpo train: interrupted"  # before the checks
    assert interrupted_line("", None) == "mcgpo: interrupted"
