"""Resume equivalence: stopped after update 2 and resumed equals the uninterrupted run.

Bit-identical on CPU with ``--deterministic`` and one thread: the checkpoint holds the
weights (safetensors, exact), the AdamW state, the RNG states and the task cursor, and the
rollout seeds derive from (seed, update).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from mcgpo.cli import main
from mcgpo.training.checkpoint import latest_checkpoint, load_checkpoint
from mcgpo.training.metrics import read_metrics

pytestmark = pytest.mark.slow  # three short runs


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


def test_resume_refuses_a_changed_config(run, smoke_args, tmp_path, capsys):
    out = tmp_path / "run"
    run(out, "--train.updates", "1")
    capsys.readouterr()
    args = smoke_args(out, "--deterministic", "--threads", "1", "--resume")
    assert main([*args, "--train.lr", "0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "mcgpo train: error: --resume: train.lr is 0.5 but the run was started with 0.001"
    )
