"""The pair probe (``train.pair_probe``, mcgpo.training.pair_probe).

The probe measures the task and pair terms' gradients on each update's first optimiser step;
it must not change the update, and its two gradients must add up to the step's gradient.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from test_update import TEXTS, make_batch, step

from mcgpo.policy.tiny import tiny_model, train_tokenizer
from mcgpo.training.config import ConfigError, RunConfig, TrainConfig
from mcgpo.training.distributed import check_world
from mcgpo.training.pair_probe import GradProbe, PairFit
from mcgpo.training.update import PairBatch

SIMPLE = TrainConfig(grad_clip=0.0, kl_coef=0.0, entropy_coef=0.0, weight_decay=0.0)
PROBED = dataclasses.replace(SIMPLE, pair_probe=True)
# rows 0-3 in two micro-batches of two; one pair inside each micro-batch
PAIRS = PairBatch(np.array([0, 3]), np.array([1, 2]), np.array([1.0, 0.5]))
ADV = [1.0, -0.5, 0.25, -2.0]
LENGTHS = [(4, 2), (3, 3), (5, 2), (2, 4)]


@pytest.fixture(scope="module")
def policy():
    tokenizer = train_tokenizer(TEXTS * 4, vocab_size=300)
    return tiny_model(tokenizer, seed=0, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)


@pytest.mark.parametrize("micro", [1, 2, 4])
def test_the_probe_leaves_the_update_bit_for_bit_unchanged(policy, micro):
    batch = make_batch(policy, LENGTHS)
    off = dataclasses.replace(SIMPLE, micro_batch_size=micro)
    on = dataclasses.replace(PROBED, micro_batch_size=micro)
    _, stats_off, delta_off = step(policy, batch, ADV, off, pairs=PAIRS, lambda_pair=3.0)
    _, stats_on, delta_on = step(policy, batch, ADV, on, pairs=PAIRS, lambda_pair=3.0)
    for name in delta_off:
        assert torch.equal(delta_off[name], delta_on[name]), name
    assert "pairs/grad_ratio" not in stats_off
    assert stats_on["update/grad_norm"] == stats_off["update/grad_norm"]


@pytest.mark.parametrize("micro", [2, 4])
def test_the_two_gradients_add_up_to_the_steps_gradient(policy, micro):
    # One optimiser step (the whole batch), no clipping: the step's gradient is
    # g = g_task + g_pair, so ||g||^2 = t^2 + p^2 + 2 t p cos (t, p the two norms).
    batch = make_batch(policy, LENGTHS)
    cfg = dataclasses.replace(PROBED, micro_batch_size=micro)
    _, stats, _ = step(policy, batch, ADV, cfg, pairs=PAIRS, lambda_pair=3.0)
    t, p, cos = stats["loss/task_grad_norm"], stats["pairs/grad_norm"], stats["pairs/grad_cos"]
    assert t > 0 and p > 0 and -1 <= cos <= 1
    assert stats["pairs/grad_ratio"] == pytest.approx(p / t, rel=1e-12)
    whole = math.sqrt(t * t + p * p + 2 * t * p * cos)
    assert whole == pytest.approx(stats["update/grad_norm"], rel=1e-4)


def test_the_task_gradient_is_the_whole_gradient_without_pairs(policy):
    batch = make_batch(policy, LENGTHS)
    cfg = dataclasses.replace(PROBED, micro_batch_size=2)
    _, stats, _ = step(policy, batch, ADV, cfg)
    assert stats["loss/task_grad_norm"] == pytest.approx(stats["update/grad_norm"], rel=1e-5)
    assert stats["pairs/grad_norm"] == 0.0 and stats["pairs/grad_ratio"] == 0.0
    assert "pairs/grad_cos" not in stats


def test_the_pair_gradient_scales_with_lambda(policy):
    # g_pair is linear in lambda_pair and g_task does not depend on it (first step,
    # theta = theta_old): lambda 1 -> 4 multiplies the pair norm by 4 exactly (in float
    # rounding) and leaves the task norm and the cosine unchanged.
    batch = make_batch(policy, LENGTHS)
    cfg = dataclasses.replace(PROBED, micro_batch_size=2)
    _, one, _ = step(policy, batch, ADV, cfg, pairs=PAIRS, lambda_pair=1.0)
    _, four, _ = step(policy, batch, ADV, cfg, pairs=PAIRS, lambda_pair=4.0)
    assert four["pairs/grad_norm"] == pytest.approx(4 * one["pairs/grad_norm"], rel=1e-5)
    assert four["loss/task_grad_norm"] == pytest.approx(one["loss/task_grad_norm"], rel=1e-6)
    assert four["pairs/grad_cos"] == pytest.approx(one["pairs/grad_cos"], abs=1e-5)


def test_probe_golden_on_a_linear_model():
    # w = (1, 2); task term 3 * w0 -> g_task = (3, 0); pair term w0 + w1 -> g_pair = (1, 1).
    # ||g_task|| = 3, ||g_pair|| = sqrt 2, ratio sqrt(2)/3, cos = 3 / (3 sqrt 2) = 1/sqrt 2.
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    probe = GradProbe([w])
    probe.add(3 * w[0], w[0] + w[1])
    stats = probe.stats()
    assert stats["loss/task_grad_norm"] == pytest.approx(3.0)
    assert stats["pairs/grad_norm"] == pytest.approx(math.sqrt(2))
    assert stats["pairs/grad_ratio"] == pytest.approx(math.sqrt(2) / 3)
    assert stats["pairs/grad_cos"] == pytest.approx(1 / math.sqrt(2))
    assert w.grad is None  # the probe never touches .grad


def test_a_constant_pair_term_counts_as_zero():
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    probe = GradProbe([w])
    probe.add(2 * w[1], torch.zeros(()))
    probe.add(w[0], w[0])
    stats = probe.stats()
    # g_task = (1, 2); g_pair = (0, 0) + (1, 0)
    assert stats["loss/task_grad_norm"] == pytest.approx(math.sqrt(5))
    assert stats["pairs/grad_norm"] == pytest.approx(1.0)


def test_the_margin_after_is_the_pairs_change_of_d(policy):
    # d of a row = the mean over its response tokens of log pi_new - log pi_before; the
    # margin of a pair is d+ - d-. Recomputed here by hand from the two models.
    from mcgpo.policy import token_log_probs

    batch = make_batch(policy, LENGTHS)
    cfg = dataclasses.replace(PROBED, micro_batch_size=2)
    new, stats, _ = step(policy, batch, ADV, cfg, pairs=PAIRS, lambda_pair=3.0, lr=0.05)
    mask = batch.response_mask
    with torch.no_grad():
        before = token_log_probs(policy, batch.input_ids, batch.attention_mask)
        after = token_log_probs(new, batch.input_ids, batch.attention_mask)
    d = ((after - before) * mask).sum(1) / mask.sum(1)
    margins = (d[PAIRS.plus] - d[PAIRS.minus]).double().numpy()
    assert stats["pairs/margin_after"] == pytest.approx(margins.mean(), abs=1e-6)
    assert stats["pairs/accuracy_after"] == (margins > 0).mean()
    weighted = (PAIRS.weight * margins).sum() / PAIRS.weight.sum()
    assert stats["pairs/weighted_margin_after"] == pytest.approx(weighted, abs=1e-6)


def test_the_pair_term_raises_the_margin_after_and_lambda_zero_is_measured(policy):
    # A small gradient step on c * softplus(-(d+ - d-)) raises d+ - d- (first order);
    # with the task term the same in both runs, a larger lambda gives a larger weighted
    # margin after the update. At lambda 0 the pairs do not train but are still measured,
    # and the update is GraphGPO's (no pairs) bit for bit.
    batch = make_batch(policy, LENGTHS)
    cfg = dataclasses.replace(PROBED, micro_batch_size=2)
    _, zero, delta_zero = step(policy, batch, ADV, cfg, pairs=PAIRS, lambda_pair=0.0, lr=0.02)
    _, big, _ = step(policy, batch, ADV, cfg, pairs=PAIRS, lambda_pair=30.0, lr=0.02)
    _, _, delta_none = step(policy, batch, ADV, cfg, lr=0.02)
    assert big["pairs/weighted_margin_after"] > zero["pairs/weighted_margin_after"]
    assert big["pairs/weighted_margin_after"] > 0
    for name in delta_zero:
        assert torch.equal(delta_zero[name], delta_none[name]), name
    assert "pairs/grad_ratio" in zero and zero["pairs/grad_norm"] == 0.0


def test_pair_fit_without_pairs_is_none(policy):
    batch = make_batch(policy, LENGTHS)
    assert PairFit.before_update(policy, batch, PairBatch.empty(), "fp32", 2) is None


def test_the_probe_is_refused_on_several_processes():
    cfg = RunConfig()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, pair_probe=True))
    check_world(cfg, 1)
    with pytest.raises(ConfigError, match=r"train\.pair_probe"):
        check_world(
            dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, groups=16)), 2
        )
