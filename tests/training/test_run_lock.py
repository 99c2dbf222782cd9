"""One process writes a run folder at a time (mcgpo.training.run_lock): a second mcgpo train
into the --out of a run still going is one line naming it, and writes nothing there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcgpo.cli import main
from mcgpo.training.config import ConfigError
from mcgpo.training.run_lock import lock_run_folder

SRC = Path(__file__).resolve().parents[2] / "src"
HOLD = (
    "import sys; from mcgpo.training.run_lock import lock_run_folder; "
    "lock_run_folder(sys.argv[1], 'mcgpo train --out first'); print('held', flush=True); "
    "sys.stdin.read()"
)  # holds the lock until its stdin closes, as a run still going


@pytest.fixture
def held(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "held"
    yield folder, proc
    proc.kill()
    proc.wait(timeout=600)


def test_a_second_train_into_a_folder_in_use_is_one_line_and_writes_nothing(
    held, micro_model, capsys
):
    folder, proc = held
    argv = ["train", "--preset", "household-smoke", "--model", str(micro_model), "--out", str(folder)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"mcgpo train: error: run folder {str(folder)!r} is in use by process {proc.pid} "
        "(mcgpo train --out first); wait for it to end or use another --out"
    )
    assert sorted(p.name for p in folder.iterdir()) == [".lock"]  # no config.toml written
    proc.stdin.close()  # the run ends: the system drops its lock
    proc.wait(timeout=600)
    lock_run_folder(folder, "mcgpo train")  # now this process may write there
    lock_run_folder(folder, "mcgpo train --resume")  # and take it again (a run, its resume)


def test_the_lock_is_the_folders_not_the_paths(held):
    folder, _ = held
    with pytest.raises(ConfigError, match="is in use by process"):
        lock_run_folder(folder / ".." / folder.name)
