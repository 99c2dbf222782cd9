"""The README's code, run as printed: the Python example, and the quickstart's commands.

Both read README.md itself, so the README and these tests cannot drift apart: a changed
command or example is what runs here.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SETUP = "bash scripts/setup.sh && . .venv/bin/activate"


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.S | re.M)


def quickstart_lines() -> list[str]:
    """The commands of the README's quickstart block, comments dropped."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    block = code_blocks(section, "bash")[0]
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.strip()]


def test_the_python_example_runs_as_printed():
    (example,) = [b for b in code_blocks(README.read_text(encoding="utf-8"), "python")
                  if b.startswith("import mcgpo")]  # fmt: skip
    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(example, str(README), "exec"), namespace)  # the README's own code
    table, adv, prefs = namespace["table"], namespace["adv"], namespace["prefs"]
    # 8 siblings x 2 turns; the winners (even slots) take the mug at the desk
    assert len(table) == 16 and table.success.tolist() == [1.0, 1.0, 0.0, 0.0] * 4
    won = table.success == 1
    assert (adv[won] > 0).all() and (adv[~won] < 0).all()
    assert len(prefs.plus) > 0
    assert set(table.action[prefs.plus]) == {"take mug 1"}
    assert set(table.action[prefs.minus]) == {"go to shelf 2"}
    assert np.all(table.state[prefs.plus] == table.state[prefs.minus])  # matched context
    assert namespace["res"].info["action_valid"] and "->" in printed.getvalue()


def test_the_quickstart_starts_with_the_set_up_and_runs_only_mcgpo_after_it():
    lines = quickstart_lines()
    assert lines[0] == SETUP
    assert all(line.startswith("mcgpo ") for line in lines[1:]) and len(lines) >= 5


@pytest.mark.slow  # the printed commands at smoke sizes: about a minute or two on 2 cores
def test_the_quickstart_runs_as_printed(tmp_path, monkeypatch, capsys):
    from mcgpo.cli import main, resolve

    monkeypatch.chdir(tmp_path)  # the commands' runs/ folders land here
    commands = [shlex.split(line) for line in quickstart_lines()[1:]]
    for argv in commands:
        if argv[1] == "eval":
            # eval reads the run it points into (issue 42; --model inside a run folder)
            assert resolve("eval", argv[2:]).eval.tasks == 2  # the smoke run's, not the default
        assert main(argv[1:]) == 0, argv
    capsys.readouterr()
    run = tmp_path / "runs" / "quick"
    assert (run / "model" / "config.json").is_file()
    assert (run / "eval.json").is_file()
    assert (run / "curves.png").stat().st_size > 10_000
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert (tmp_path / "runs" / "bench-quick" / "results.md").is_file()
