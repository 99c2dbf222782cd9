"""train.async_lag: exact resume with batches in flight, and two processes as one.

A checkpoint after update u of a k = 1 run holds batch u + 1 (sampled with θ_{u-1}, which the
checkpoint no longer has); ``--resume`` restores it. So a run killed (SIGKILL, at random
moments: during a rollout, an update, a checkpoint write) and resumed until it finishes
ends with the weights and the update records of the uninterrupted run, bit for bit.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from ranks import launch, saved_weights

from mcgpo.cli import main
from mcgpo.rollout.records import Rollout
from mcgpo.training.config import ConfigError
from mcgpo.training.metrics import read_metrics
from mcgpo.training.pending import PENDING_FILE, Batch, read_pending, write_pending

# one-token actions: some are empty (format penalty), so the advantages are not all 0
NONZERO = ("--rollout.max_new_tokens", "1", "--eval.tasks", "1", "--tensorboard", "false")


def _records(folder: Path) -> list[dict]:
    out = []
    for r in read_metrics(folder / "metrics.jsonl"):
        # times, memory and compile counters are the process's (an in-process run after
        # other tests has compiled graphs a fresh process has not)
        out.append({k: v for k, v in r.items()
                    if not k.startswith(("time", "memory/", "rollout/compile_", "compile/"))
                    and not k.endswith("seconds")})  # fmt: skip
    return out


def _same(a: Path, b: Path) -> bool:
    wa, wb = saved_weights(a / "model"), saved_weights(b / "model")
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# ------------------------------------------------------------------------- pending file
def _rollout() -> Rollout:
    from mcgpo.rollout.tokens import TokenBatch
    from mcgpo.steps import StepTable

    rows = [
        {"group": 0, "traj": t, "slot": t, "turn": 0, "reward": 0.5 * t, "done": True,
         "success": float(t == 1), "score": 0.0, "action": f"go to desk {t}", "action_valid": True,
         "anchor": "room", "next_anchor": f"desk {t}", "errored": t == 2}
        for t in range(3)
    ]  # fmt: skip
    tokens = TokenBatch.from_sequences(
        [[1, 2], [1, 2, 3], [4]], [[5], [6, 7], [8, 9, 10]],
        [[-0.5], [-0.25, -1.0], [-2.0, -0.125, -3.0]], pad_token_id=0,
    )  # fmt: skip
    return Rollout(StepTable.from_records(rows), tokens, {"rows": 3.0}, ("a", "b", "c"), {2: "x"})


def test_pending_batches_round_trip_and_load_weights_only(tmp_path):
    batch = Batch(number=5, version=3, rollout=_rollout(), stats={"time/env": 0.25})
    write_pending(tmp_path, 2, [[batch], []])
    torch.load(tmp_path / PENDING_FILE, weights_only=True)  # plain types and tensors only
    (back,) = read_pending(tmp_path, 2, rank=0, world_size=2)
    assert read_pending(tmp_path, 2, rank=1, world_size=2) == []
    assert (back.number, back.version, back.stats) == (5, 3, {"time/env": 0.25})
    a, b = batch.rollout, back.rollout
    for name, column in a.table.columns().items():
        np.testing.assert_array_equal(column, b.table.columns()[name], err_msg=name)
        assert column.dtype == b.table.columns()[name].dtype, name
    for name in ("input_ids", "attention_mask", "response_mask", "old_log_probs"):
        assert torch.equal(getattr(a.tokens, name), getattr(b.tokens, name)), name
    assert (b.stats, b.responses, b.errors) == (a.stats, a.responses, a.errors)


def test_a_checkpoint_of_another_lag_is_refused_in_one_line(tmp_path):
    write_pending(tmp_path, 1, [[]])
    with pytest.raises(ConfigError) as info:
        read_pending(tmp_path, 2, rank=0, world_size=1)
    assert str(info.value) == (
        f"--resume: train.async_lag is 2 but the checkpoint {tmp_path.name} was written "
        f"with 1; resume with --train.async_lag 1"
    )
    # a checkpoint without the file is one of a sequential run (lag 0)
    with pytest.raises(ConfigError, match=r"written with 0; resume with --train\.async_lag 0$"):
        read_pending(tmp_path / "nothing", 1, rank=0, world_size=1)


def test_the_cli_refuses_a_resume_with_another_lag(smoke_args, tmp_path, capsys):
    out = tmp_path / "r"
    args = smoke_args(out, *NONZERO, "--train.updates", "1", "--train.async_lag", "1")
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args, "--resume", "--train.async_lag", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "mcgpo train: error: --resume: train.async_lag is 2 but the run was started with 1 "
        f"(config.toml of {str(out)!r} is the base; drop these options)"
    )


# ------------------------------------------------------------------------------ resume
@pytest.mark.slow
def test_stopped_and_resumed_equals_uninterrupted(smoke_args, tmp_path):
    base = ("--deterministic", "--threads", "1", *NONZERO, "--train.async_lag", "1")
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main(smoke_args(whole, *base, "--train.updates", "4")) == 0
    assert main(smoke_args(parts, *base, "--train.updates", "2")) == 0
    (pending,) = read_pending(parts / "checkpoints" / "update-000002", 1, 0, 1)
    assert (pending.number, pending.version) == (3, 1)  # batch 3, sampled with θ_1
    assert main(smoke_args(parts, *base, "--train.updates", "4", "--resume")) == 0
    assert _same(whole, parts)
    assert _records(whole) == _records(parts)


def _python_m_mcgpo(args: list[str]) -> subprocess.Popen:
    src = str(Path(__file__).parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    return subprocess.Popen(
        [sys.executable, "-m", "mcgpo", *args], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.slow
def test_sigkill_at_random_moments_and_resume_gives_the_same_weights(smoke_args, tmp_path):
    """Kill -9 three times at random moments after the first checkpoint, resume each time,
    then let it finish: the weights and records of the uninterrupted run."""
    base = ("--deterministic", "--threads", "1", *NONZERO, "--train.async_lag", "1")
    updates = ("--train.updates", "6")
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert main(smoke_args(whole, *base, *updates)) == 0

    moments = random.Random(46)
    args = smoke_args(killed, *base, *updates)
    latest = killed / "checkpoints" / "latest"
    kills = 0
    for attempt in range(4):
        before = latest.read_text() if latest.exists() else ""
        proc = _python_m_mcgpo(args if attempt == 0 else [*args, "--resume"])
        if attempt < 3:  # wait for a new checkpoint, then kill at a random moment after it
            deadline = time.monotonic() + 300  # a wide margin: an update takes < 1 s
            while proc.poll() is None and (latest.read_text() if latest.exists() else "") == before:
                assert time.monotonic() < deadline, "no checkpoint was written"
                time.sleep(0.02)
            time.sleep(moments.uniform(0.0, 0.8))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
        _, err = proc.communicate(timeout=300)
        if attempt == 3 or proc.returncode == 0:
            assert proc.returncode == 0, err[-2000:]
            break
    assert kills >= 1  # at least one kill landed mid-run
    assert _same(whole, killed)
    assert _records(whole) == _records(killed)


# ------------------------------------------------------------------------- two processes
@pytest.mark.slow
def test_two_processes_sample_ahead_as_one_and_resume(smoke_args, tmp_path):
    """k = 1 on 2 ranks (each rank's producer samples its block of groups) equals one process
    (weights within 1e-5: DDP sums the ranks' gradients in another order); a 2-rank run
    stopped after update 1 and resumed (every rank's pending batch restored) ends within
    1e-6 of the uninterrupted 2-rank run."""
    base = (*NONZERO, "--train.async_lag", "1", "--train.updates", "3")
    one, two, split = tmp_path / "one", tmp_path / "two", tmp_path / "split"
    assert main(smoke_args(one, *base)) == 0
    launch(smoke_args(two, *base, "--nproc", "2"))
    wa, wb = saved_weights(one / "model"), saved_weights(two / "model")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5
    lags = [r["async/lag"] for r in read_metrics(two / "metrics.jsonl") if "async/lag" in r]
    assert lags == [0, 1, 1]
    launch(smoke_args(split, *base, "--nproc", "2", "--train.updates", "1"))
    launch(smoke_args(split, *base, "--nproc", "2", "--resume"))
    wc = saved_weights(split / "model")
    assert max(float((wb[k] - wc[k]).abs().max()) for k in wb) < 1e-6


@pytest.mark.slow
def test_lag_zero_on_two_processes_is_the_sequential_trainer(smoke_args, tmp_path):
    base = (*NONZERO, "--deterministic", "--threads", "1")
    launch(smoke_args(tmp_path / "default", *base, "--nproc", "2"))
    launch(smoke_args(tmp_path / "zero", *base, "--nproc", "2", "--train.async_lag", "0"))
    assert _same(tmp_path / "default", tmp_path / "zero")
    assert _records(tmp_path / "default") == _records(tmp_path / "zero")
