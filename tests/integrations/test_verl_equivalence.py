"""verl's actor update with the plugin equals mcgpo's own update (verl_update_equivalence.py).

One batch of 48 step rows with every advantage nonzero and 6 MCGPO pairs (3 per mini-batch),
from the same weights: verl's ``ActorRolloutRefWorker`` (FSDP2 in fp32 on gloo, its own
``compute_log_prob`` for pi_old, a ref worker on another checkpoint for the KL term, then
``update_actor`` with ``mcgpo_ppo_loss``) against :func:`mcgpo.training.update.
update_policy` with the same settings (2 mini-batches of 24 rows, micro-batches of 4,
clip 0.2, dual clip 3, KL 0.5 low_var_kl, entropy 0.01, lambda_pair 1, grad clip 1,
AdamW lr 1e-2). The script takes ~15 s.

Tolerances, derived:

* log-probs (pi_old, reference): the two paths compute the same float32 forward with
  different padding (verl: unpadded rows; mcgpo: a right-padded batch), so the logits'
  sums are ordered differently: a few float32 ulps of values ~6 (log 400), 2e-6.
* losses: token means of O(1) terms over <= 80 tokens, from those log-probs: 1e-6.
* weights: AdamW with eps = 1. With the default eps = 1e-8 the first step is
  lr * g / (|g| + 1e-8), i.e. lr * sign(g): an entry whose gradient is 0 up to rounding
  may move by +lr on one path and -lr on the other, and the comparison would test
  rounding, not the update. With eps = 1 the step u = m_hat / (sqrt(v_hat) + 1) is a
  smooth function of the gradient, |du/dg| <= 2 per step here (|g| <= 1 after clipping).
  The gradients of the two paths differ by float32 rounding: <= 2.5e-6 (eps_32 = 1.2e-7
  times ~20 accumulated operations on values <= 1). So |dw| <= lr * steps * 2 * 2.5e-6 =
  1e-2 * 2 * 5e-6 = 1e-7. Observed: ~4e-9.
* controls: mcgpo's update without the pair term (lambda 0), or without the KL term, ends
  >= 1e-5 from verl's weights (observed ~2e-4 and ~1e-4), 100 x the tolerance, so a
  verl path that dropped either term would fail; the update itself moves the weights
  by ~2e-3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

verl = pytest.importorskip("verl")

pytestmark = [pytest.mark.verl, pytest.mark.slow]
HERE = Path(__file__).resolve().parent
TIMEOUT_S = 300
WEIGHT_TOL, LOSS_TOL, LOGPROB_TOL, CONTROL_MIN = 1e-7, 1e-6, 2e-6, 1e-5


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("verl_update_equivalence")
    env = dict(os.environ, VERL_PLATFORM="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    src = str(HERE.parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    log = out / "driver.log"
    with log.open("wb") as sink:
        proc = subprocess.run(
            [sys.executable, str(HERE / "verl_update_equivalence.py"), str(out)], env=env,
            stdout=sink, stderr=subprocess.STDOUT, timeout=TIMEOUT_S, check=False,
        )  # fmt: skip
    if proc.returncode != 0:
        pytest.fail(f"verl_update_equivalence.py exited with {proc.returncode}:\n"
                    f"{log.read_text(errors='replace')[-6000:]}")  # fmt: skip
    return json.loads((out / "result.json").read_text())


def test_the_batch_has_signal(result):
    adv = np.asarray(result["mcgpo_advantages"])
    assert result["rows"] == 48 and np.count_nonzero(adv) == 48 and adv.std() > 0.5
    assert len(result["mcgpo_pairs"]) == 6
    metrics = result["verl_metrics"]
    assert metrics["actor/pairs"] == [3.0, 3.0] and metrics["actor/pairs_split"] == [0.0, 0.0]
    assert min(metrics["grad_norm"]) > 0.1
    assert min(metrics["kl_loss"]) > 1e-3  # the reference is another checkpoint
    assert min(abs(v) for v in metrics["actor/pg_loss"]) > 1e-2


def test_advantages_and_pairs_are_exactly_mcgpos(result):
    assert result["plugin_advantages"] == result["mcgpo_advantages"]  # bit for bit
    assert [tuple(p) for p in result["plugin_pairs"]] == [tuple(p) for p in result["mcgpo_pairs"]]
    assert result["layout_pairs"] == 6


def test_log_probs_agree(result):
    assert result["old_logprob_diff"] <= LOGPROB_TOL
    assert result["ref_logprob_diff"] <= LOGPROB_TOL


def test_each_mini_batch_loss_agrees(result):
    metrics = result["verl_metrics"]
    np.testing.assert_allclose(metrics["loss"], result["mcgpo_step_losses"], rtol=0, atol=LOSS_TOL)
    np.testing.assert_allclose(metrics["kl_loss"], result["mcgpo_step_kl"], rtol=0, atol=LOSS_TOL)
    np.testing.assert_allclose(metrics["actor/pg_loss"], result["mcgpo_step_pg"], rtol=0,
                               atol=LOSS_TOL)  # fmt: skip


def test_weights_after_the_update_agree(result):
    assert result["names_only_verl"] == result["names_only_mcgpo"] == []
    assert result["stepwise_vs_single_call"] == 0.0  # the per-mini-batch calls are the update
    assert result["weights_vs_verl"] <= WEIGHT_TOL
    assert result["weights_moved"] > 1e3 * WEIGHT_TOL


def test_dropping_the_pair_or_kl_term_is_detected(result):
    assert result["control_no_pair_vs_verl"] >= CONTROL_MIN
    assert result["control_no_kl_vs_verl"] >= CONTROL_MIN
