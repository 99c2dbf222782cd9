"""The rollout correction with vLLM as the rollout engine, on vLLM's CPU build (.venv-vllm).

Run: ``.venv-vllm/bin/python -m pytest -q -p no:randomly -n 0 -m vllm
tests/rollout/test_vllm_rollout_correction.py`` (as tests/rollout/test_vllm_engine.py).

``mcgpo train --rollout.engine vllm`` keeps vLLM's own log-probs of the sampled tokens as the
behaviour log-probs, recomputes pi_old with the training forward, and weights the policy
gradient by their ratio (``train.rollout_correction``; auto = tis with vLLM). On the CPU
build in float32 the two differ by at most ~1.4e-6 (test_vllm_engine.py), so the ratios are
1 up to that and nothing is truncated; on a GPU (bf16 vLLM kernels) they are not.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

SMOKE = ("train", "--preset", "household-smoke", "--rollout.engine", "vllm", "--deterministic")
METRICS = ("ratio_mean", "ratio_max", "clipped_frac", "masked_frac", "seq_log_ratio_sd")


def _train(out, *extra: str) -> list[dict]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "mcgpo", *SMOKE, "--out", str(out), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "time/weight_sync" in r]


@pytest.mark.vllm
@pytest.mark.parametrize(
    "extra",
    [("--train.rollout_correction", "tis"), ("--train.updates", "1")],
    ids=["tis", "auto-is-tis"],
)
def test_vllm_smoke_run_corrects_and_logs_the_metrics(tmp_path, extra):
    pytest.importorskip("vllm")
    updates = _train(tmp_path / "run", *extra)
    assert updates and all(r["pi_old/recomputed"] == 1.0 for r in updates)
    for r in updates:
        for name in METRICS:
            assert math.isfinite(r[f"rollout_correction/{name}"]), name
        # float32 vLLM (CPU) vs the float32 training forward: |log ratio| <= 1e-5 per token
        assert abs(r["rollout_correction/ratio_max"] - 1.0) < 1e-4
        assert abs(r["rollout_correction/ratio_mean"] - 1.0) < 1e-4
        assert r["rollout_correction/clipped_frac"] == 0.0
        assert r["rollout_correction/masked_frac"] == 0.0
        # the ratios are the engine's log-probs against the recomputed pi_old's (pi_old/*)
        gap = r["pi_old/max_abs_diff"]
        assert math.exp(-gap) * (1 - 1e-6) <= r["rollout_correction/ratio_max"]
        assert r["rollout_correction/ratio_max"] <= math.exp(gap) * (1 + 1e-6)
