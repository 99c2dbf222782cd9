"""Shared by the benchmark tests: a stand-in for ``mcgpo train`` that the runner launches."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def make_fake_launcher(calls, exit_code=0):
    """Instead of training, write two evaluation records and exit with ``exit_code``."""

    def launch(argv, log):
        calls.append(list(argv))
        folder = argv[argv.index("--out") + 1]
        recs = [
            {"update": 0, "eval/success": 0.25, "eval/success/pick": 0.5},
            {"update": 2, "time/rollout": 1.0, "time/update": 0.5, "pairs/count": 3},
            {"update": 2, "eval/success": 0.75, "eval/success/pick": 1.0},
        ]
        text = "".join(json.dumps(r) + "\n" for r in recs)
        code = f"open({folder + '/metrics.jsonl'!r}, 'w').write({text!r}); raise SystemExit({exit_code})"
        return subprocess.Popen([sys.executable, "-c", code])

    return launch


@pytest.fixture
def fake_launcher():
    """:func:`make_fake_launcher`: ``fake_launcher(calls, exit_code=0)`` is a launcher."""
    return make_fake_launcher
