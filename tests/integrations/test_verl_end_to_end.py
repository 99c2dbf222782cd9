"""verl's trainer, one update end to end on the CPU: Ray (local, logical GPU), TransferQueue,
the FSDP2 engine on gloo (platform ``cpu``), the ``mcgpo_cpu`` rollout replica serving the
tiny model, the ``mcgpo_env`` agent loop on ``household``, the ``mcgpo`` trainer's
advantage step and the ``set_loss_fn`` loss, and the weight sync back to the replica.
2 prompts x 2 samples x at most 2 turns (verl_cpu_run.py), in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

verl = pytest.importorskip("verl")

pytestmark = [pytest.mark.verl, pytest.mark.slow]
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[dict, dict]:
    """(result.json, the step's metrics) of one verl_cpu_run.py run."""
    out = tmp_path_factory.mktemp("verl_cpu_run")
    src = str(HERE.parents[1] / "src")
    env = dict(os.environ, VERL_PLATFORM="cpu", VERL_FILE_LOGGER_PATH=str(out / "metrics.jsonl"))
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, str(HERE / "verl_cpu_run.py"), str(out)], env=env,
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 1  # one training step logged
    return result, lines[0]["data"]


def test_one_update_runs_through_verl_trainer(run):
    result, metrics = run
    assert result["global_steps"] == 2  # fit() ran step 1 and stopped (total_training_steps=1)
    assert metrics["training/global_step"] == 1
    # every environment turn is one request to the mcgpo_cpu replica and one batch row:
    # 2 prompts x 2 sessions x 1..2 turns; the advantage step saw all of them
    requests = result["server"]["requests"]
    assert 4 <= requests <= 8
    assert metrics["mcgpo/pairs/rows_eligible"] == requests
    assert metrics["mcgpo/errored_rows"] == 0
    for key in ("actor/pg_loss", "actor/pair_loss", "actor/pairs", "actor/pairs_split"):
        assert key in metrics


def test_update_steps_the_optimizer_and_syncs_the_weights_to_the_replica(run):
    result, metrics = run
    # The untrained tiny model earns no household reward in 2 turns, so every advantage is
    # 0 and (no KL, no entropy term) the gradient is exactly 0. AdamW then only decays:
    # p <- p * (1 - lr * weight_decay) per optimizer step, lr = 1e-2, weight_decay = 1e-2,
    # and there is one step per mini-batch of ppo_mini_batch_size * n = 2 * 2 = 4 rows
    # (verl pads the rows up to a multiple of 4). The replica's weights after on_step_end's
    # sync are the trained ones, version 1.
    assert metrics["actor/grad_norm"] == 0.0 and metrics["actor/pg_loss"] == 0.0
    steps = -(-result["server"]["requests"] // 4)
    expected = result["initial_checksum"] * (1 - 1e-2 * 1e-2) ** steps
    assert result["server"]["global_steps"] == 1
    assert result["server"]["checksum"] == pytest.approx(expected, rel=1e-6)
    assert result["server"]["checksum"] != pytest.approx(result["initial_checksum"], rel=1e-6)
