"""train.async_lag 1 on the vLLM engine (vLLM's CPU build, .venv-vllm; scripts/test.sh).

Run: ``.venv-vllm/bin/python -m pytest -q -p no:randomly -n 0 -m vllm tests/rollout/test_vllm_async.py``

The rollout producer samples with the run's engine and loads θ_s(v) = θ_{max(0, v-2)}
before batch v. A checkpoint after update u holds batch u + 1 (sampled with θ_{u-1}) in
``pending.pt``, with the engine's log-probs of every sampled token: they equal the
training forward of θ_{u-1} (the checkpoint before, whose weights are kept) within the
bound of tests/rollout/test_vllm_engine.py, and not that of θ_u. Bound: float32, measured
<= 1.4e-6 there; ``BOUND = 1e-5``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BOUND = 1e-5  # engine vs training forward, float32 (tests/rollout/test_vllm_engine.py)
SMOKE = ("train", "--preset", "household-smoke", "--rollout.engine", "vllm", "--deterministic",
         "--train.async_lag", "1", "--tensorboard", "false")  # fmt: skip


def _cli(*args: str) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "mcgpo", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


def _gap(checkpoint: Path, folder: Path) -> float:
    """max |engine log-prob - training forward of the policy in ``folder``| over the sampled
    tokens of the batch pending in ``checkpoint``."""
    from mcgpo.policy import load_policy
    from mcgpo.policy.logprobs import token_log_probs
    from mcgpo.training.pending import read_pending

    (batch,) = read_pending(checkpoint, 1, rank=0, world_size=1)
    tokens = batch.rollout.tokens
    mask = tokens.response_mask
    assert int(mask.sum()) > 0
    model, _ = load_policy(folder)
    with torch.no_grad():
        ref = token_log_probs(model, tokens.input_ids, tokens.attention_mask)
    return float((ref - tokens.old_log_probs)[mask].abs().max())


def _pending(checkpoint: Path) -> tuple[int, int]:
    from mcgpo.training.pending import read_pending

    (batch,) = read_pending(checkpoint, 1, rank=0, world_size=1)
    return batch.number, batch.version


@pytest.mark.vllm
def test_lag_one_on_the_engine_samples_with_the_lagged_weights_and_resumes_exactly(tmp_path):
    """2 updates, then --resume to 3: batch 3 (sampled after the engine loaded θ_1) and
    batch 4 (θ_2, the resumed engine's start) carry the log-probs of θ_1 and θ_2, not of
    the newer weights. A 3-update run without the stop ends with the same weights bit for
    bit (reproducible, and exact across the resume); only batch 3 needed a weight load."""
    pytest.importorskip("vllm")
    from safetensors.torch import load_file

    parts, whole = tmp_path / "parts", tmp_path / "whole"
    ckpt = parts / "checkpoints"
    _cli(*SMOKE, "--train.updates", "2", "--out", str(parts))
    assert _pending(ckpt / "update-000002") == (3, 1)
    theta_1, theta_2 = ckpt / "update-000001" / "model", ckpt / "update-000002" / "model"
    assert _gap(ckpt / "update-000002", theta_1) < BOUND
    assert _gap(ckpt / "update-000002", theta_2) > 10 * BOUND  # not the newest weights

    _cli(*SMOKE, "--train.updates", "3", "--out", str(parts), "--resume")
    assert _pending(ckpt / "update-000003") == (4, 2)
    assert _gap(ckpt / "update-000003", theta_2) < BOUND
    assert _gap(ckpt / "update-000003", ckpt / "update-000003" / "model") > 10 * BOUND

    _cli(*SMOKE, "--train.updates", "3", "--out", str(whole))
    a = load_file(parts / "model" / "model.safetensors")
    b = load_file(whole / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    records = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in records if "async/lag" in r]
    assert [r["async/lag"] for r in updates] == [0, 1, 1]
    # batch 1 (θ_0) against π_old recomputed on θ_0: the engine's rounding; batches 2 and 3
    # against the newer θ_1 and θ_2: the lag
    lag = [r["pi_old/max_abs_diff"] for r in updates]
    assert lag[0] < BOUND and min(lag[1:]) > 10 * BOUND
    # batches 1 and 2 were sampled with θ_0, which the engine served from its start
    assert [r["time/weight_sync"] > 0 for r in updates] == [False, False, True]
