"""The micro-batched PPO update with the MCGPO pair loss (mcgpo.training.update).

A 1-layer, 16-wide Qwen2 model and a hand-made batch keep every test well under a second.
Steps use plain SGD with lr 1 and no clipping where a test compares gradients: the change of
the parameters is then exactly minus the accumulated gradient.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mcgpo.policy import token_log_probs
from mcgpo.policy.tiny import tiny_model, train_tokenizer
from mcgpo.rollout.tokens import TokenBatch
from mcgpo.training.config import TrainConfig
from mcgpo.training.update import PairBatch, plan_mini_batches, update_policy

TEXTS = ["go to fridge 1", "open drawer 2", "take mug 1 from table 1", "put mug 1 in/on sink 1"]


@pytest.fixture(scope="module")
def policy():
    tokenizer = train_tokenizer(TEXTS * 4, vocab_size=300)
    model = tiny_model(tokenizer, seed=0, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
    return model, tokenizer


def make_batch(model, lengths, seed=0) -> TokenBatch:
    """Rows of random tokens: (prompt length, response length) each; pi_old = the model."""
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prompts = [torch.randint(3, vocab, (p,), generator=gen).tolist() for p, _ in lengths]
    responses = [torch.randint(3, vocab, (r,), generator=gen).tolist() for _, r in lengths]
    zeros = [[0.0] * len(r) for r in responses]
    batch = TokenBatch.from_sequences(prompts, responses, zeros, pad_token_id=0)
    with torch.no_grad():
        old = token_log_probs(model, batch.input_ids, batch.attention_mask)
    old = torch.where(batch.response_mask, old, torch.zeros_like(old))
    return dataclasses.replace(batch, old_log_probs=old)


def step(model, batch, advantages, cfg, *, pairs=None, lambda_pair=0.0, lr=1.0, groups=None):
    """Run update_policy on a copy of ``model`` with SGD; return (new model, stats, delta)."""
    model = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ref = copy.deepcopy(model).requires_grad_(False) if cfg.kl_coef > 0 else None
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    stats = update_policy(
        model, opt, batch, np.asarray(advantages, dtype=np.float32), cfg,
        pairs=pairs, lambda_pair=lambda_pair, ref_model=ref, groups=groups,
    )  # fmt: skip
    delta = {n: p.detach() - before[n] for n, p in model.named_parameters()}
    return model, stats, delta


def assert_same_delta(a, b, atol=1e-6):
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=1e-5, msg=name)


SIMPLE = TrainConfig(grad_clip=0.0, kl_coef=0.0, entropy_coef=0.0, weight_decay=0.0)


def test_policy_loss_is_the_token_mean_over_the_mini_batch(policy):
    # Two rows with 2 and 3 response tokens and advantages +1 and -2. At the first step
    # pi = pi_old, so every ratio is 1, nothing is clipped and the per-token loss is -A:
    #   token mean over the batch = -(2 * 1 + 3 * (-2)) / 5 = 4 / 5 = 0.8.
    # One row per micro-batch gives micro means -1 and +2, weighted by their token shares
    # 2/5 and 3/5: -0.4 + 1.2 = 0.8 (an unweighted mean of micro-batches would give 0.5).
    model, _ = policy
    batch = make_batch(model, [(4, 2), (3, 3)])
    for micro in (1, 2):
        cfg = dataclasses.replace(SIMPLE, micro_batch_size=micro)
        _, stats, _ = step(model, batch, [1.0, -2.0], cfg)
        assert stats["loss/policy"] == pytest.approx(0.8, abs=1e-6)
        assert stats["policy/pg_clipfrac"] == 0.0
        assert stats["update/optimizer_steps"] == 1.0
        assert stats["update/tokens"] == 5.0


@pytest.mark.parametrize("micro", [1, 2, 4])
def test_gradient_does_not_depend_on_the_micro_batch_split(policy, micro):
    # KL and entropy on, pairs on: the accumulated gradient of micro-batches of 2 or 4 rows
    # equals the whole-batch gradient (token-share weights for the task loss, row-share
    # weights for the pair loss with an even micro-batch size; module docstring, items 1-2).
    # micro = 1 cannot hold a pair: then only the task terms are compared.
    model, _ = policy
    lengths = [(5, 2), (3, 4), (6, 1), (2, 3), (4, 4), (3, 2), (5, 5), (2, 1)]
    batch = make_batch(model, lengths, seed=1)
    adv = np.array([1.0, -0.5, 0.3, -1.2, 0.8, 0.0, -0.3, 2.0])
    cfg = dataclasses.replace(SIMPLE, kl_coef=0.05, entropy_coef=0.01)
    # perturb the policy first so that KL and the ratios are not trivially at their optimum
    moved, _, _ = step(model, batch, adv, dataclasses.replace(cfg, micro_batch_size=8), lr=0.5)
    pairs = PairBatch(np.array([0, 5]), np.array([3, 2]), np.array([1.0, 0.5]))
    lam = 0.0 if micro == 1 else 0.7
    whole = dataclasses.replace(cfg, micro_batch_size=8)
    split = dataclasses.replace(cfg, micro_batch_size=micro)
    _, s_whole, d_whole = step(moved, batch, adv, whole, pairs=pairs, lambda_pair=lam)
    _, s_split, d_split = step(moved, batch, adv, split, pairs=pairs, lambda_pair=lam)
    assert_same_delta(d_whole, d_split)
    assert s_split["pairs/split_mini"] == s_split["pairs/split_micro"] == 0.0
    assert s_split["pairs/used"] == (0.0 if lam == 0 else 2.0)
    for key in ("loss/policy", "loss/kl", "policy/entropy"):
        assert s_split[key] == pytest.approx(s_whole[key], rel=1e-5, abs=1e-7)


def test_lambda_zero_ignores_the_pairs(policy):
    model, _ = policy
    batch = make_batch(model, [(3, 2), (4, 3), (2, 2), (5, 1)], seed=2)
    adv = [0.5, -0.5, 1.0, 0.0]
    pairs = PairBatch(np.array([0]), np.array([1]), np.array([1.0]))
    _, stats, d_pairs = step(model, batch, adv, SIMPLE, pairs=pairs, lambda_pair=0.0)
    _, _, d_none = step(model, batch, adv, SIMPLE)
    assert_same_delta(d_pairs, d_none, atol=0)
    assert "loss/pair" not in stats and stats["pairs/given"] == 0.0


def test_pair_loss_raises_the_preferred_decision(policy):
    # Only the pair term (advantages 0, no KL, no entropy). At pi = pi_old, d = 0 for every
    # row, so L_pair = c * softplus(0) / floor(4/2) = log(2) / 2 for the one pair; one
    # gradient step must make d(+) - d(-) positive.
    model, _ = policy
    batch = make_batch(model, [(3, 3), (4, 2), (2, 3), (5, 2)], seed=3)
    pairs = PairBatch(np.array([2]), np.array([1]), np.array([1.0]))
    new, stats, _ = step(model, batch, [0.0] * 4, SIMPLE, pairs=pairs, lambda_pair=1.0, lr=0.5)
    assert stats["loss/pair"] == pytest.approx(np.log(2) / 2, rel=1e-6)
    assert stats["loss/policy"] == 0.0
    with torch.no_grad():
        lp = token_log_probs(new, batch.input_ids, batch.attention_mask)
    mask = batch.response_mask.float()
    d = ((lp - batch.old_log_probs) * mask).sum(1) / mask.sum(1)
    assert float(d[2] - d[1]) > 0


def test_values_at_masked_positions_do_not_matter(policy):
    # old log-probs on prompt and padding positions are never read
    model, _ = policy
    batch = make_batch(model, [(4, 2), (2, 4), (3, 3)], seed=4)
    noisy = batch.old_log_probs.clone()
    noisy[~batch.response_mask] = torch.randn(int((~batch.response_mask).sum()))
    other = dataclasses.replace(batch, old_log_probs=noisy)
    cfg = dataclasses.replace(SIMPLE, kl_coef=0.01, entropy_coef=0.001, micro_batch_size=2)
    _, _, d1 = step(model, batch, [1.0, -1.0, 0.5], cfg)
    _, _, d2 = step(model, other, [1.0, -1.0, 0.5], cfg)
    assert_same_delta(d1, d2, atol=0)


def test_mini_batches_and_epochs_count_optimizer_steps(policy):
    model, _ = policy
    batch = make_batch(model, [(3, 2)] * 6, seed=5)
    cfg = dataclasses.replace(SIMPLE, ppo_epochs=2, mini_batch_size=4, micro_batch_size=2)
    # 6 rows in mini-batches of at most 4 -> 2 mini-batches; 2 epochs -> 4 optimiser steps
    _, stats, _ = step(model, batch, [1.0, -1.0] * 3, cfg, lr=0.01)
    assert stats["update/optimizer_steps"] == 4.0
    assert np.isfinite(stats["policy/ppo_kl"])


def test_non_finite_gradient_skips_the_step(policy):
    model, _ = policy
    batch = make_batch(model, [(3, 2), (2, 2)], seed=6)
    _, stats, delta = step(model, batch, [float("nan"), 1.0], SIMPLE)
    assert stats["update/skipped"] == 1.0 and stats["update/optimizer_steps"] == 0.0
    assert all(float(d.abs().max()) == 0.0 for d in delta.values())


def test_an_empty_batch_is_a_no_op(policy):
    # every trajectory of a batch can hit an environment error; then no row is learnable
    model, _ = policy
    batch = make_batch(model, [(3, 2)], seed=8).select(np.zeros(0, dtype=np.int64))
    _, stats, delta = step(model, batch, [], SIMPLE)
    assert stats["update/optimizer_steps"] == 0.0 and stats["update/rows"] == 0.0
    assert all(float(d.abs().max()) == 0.0 for d in delta.values())


def test_bad_input(policy):
    model, _ = policy
    batch = make_batch(model, [(3, 2), (2, 2)], seed=7)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with pytest.raises(ValueError, match=r"advantages has shape \(3,\), expected \(2,\)"):
        update_policy(model, opt, batch, np.zeros(3, dtype=np.float32), SIMPLE)
    with pytest.raises(ValueError, match="kl_coef > 0 needs a reference model"):
        update_policy(model, opt, batch, np.zeros(2, dtype=np.float32), TrainConfig())


@pytest.mark.parametrize(("dual_clip", "expected"), [(3.0, 3.0), (0.0, math.exp(2.0))])
def test_train_dual_clip_reaches_the_loss_and_zero_turns_it_off(policy, dual_clip, expected):
    # pi_old two nats below pi on every response token: r = e^2 = 7.39, A = -1 everywhere.
    # Token loss max(-A r, -A clip(r, 0.8, 1.2)) = max(7.39, 1.2) = 7.39; the dual clip caps
    # it at -A * 3 = 3 (every token hits it), train.dual_clip = 0 leaves 7.39.
    model, _ = policy
    batch = make_batch(model, [(3, 2), (2, 3)])
    shifted = torch.where(batch.response_mask, batch.old_log_probs - 2.0, batch.old_log_probs)
    batch = dataclasses.replace(batch, old_log_probs=shifted)
    cfg = dataclasses.replace(SIMPLE, dual_clip=dual_clip)
    _, stats, _ = step(model, batch, [-1.0, -1.0], cfg, lr=0.0)
    assert stats["loss/policy"] == pytest.approx(expected, rel=1e-5)
    assert stats["policy/pg_clipfrac_lower"] == (1.0 if dual_clip else 0.0)


# --------------------------------------------------------------------------- mini-batches
def test_mini_batches_are_whole_groups_packed_in_row_order():
    # group sizes 3, 2, 4, 1 (rows 0-2, 3-4, 5-8, 9), size 5:
    #   group 0 (3 rows) opens step 0; group 1 fits (3 + 2 = 5 <= 5);
    #   group 2 (4 rows) would make 9 > 5 -> step 1; group 3 fits (4 + 1 = 5)
    groups = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])
    minis = plan_mini_batches(10, 5, groups)
    assert [m.tolist() for m in minis] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    # size 3: group 0 alone (3); group 1 alone (2 + 4 > 3); group 2 is larger than the size
    # and stays whole (never cut); group 3 follows it in a step of its own (4 + 1 > 3)
    minis = plan_mini_batches(10, 3, groups)
    assert [m.tolist() for m in minis] == [[0, 1, 2], [3, 4], [5, 6, 7, 8], [9]]


def test_mini_batches_without_groups_or_size():
    # no group ids: every row its own group, i.e. plain chunks in row order
    assert [m.tolist() for m in plan_mini_batches(6, 4)] == [[0, 1, 2, 3], [4, 5]]
    # size 0 (or >= the rows): the whole batch in one step
    for size in (0, 6, 10):
        assert [m.tolist() for m in plan_mini_batches(6, size, np.zeros(6))] == [list(range(6))]


def test_mini_batches_take_groups_in_order_of_their_first_row():
    # group ids need not be sorted or contiguous: group 7 first (rows 0, 3), then group 2
    # (rows 1, 2), then group 5 (row 4); size 2 -> one group per step
    minis = plan_mini_batches(5, 2, np.array([7, 2, 2, 7, 5]))
    assert [m.tolist() for m in minis] == [[0, 3], [1, 2], [4]]


def test_mini_batches_bad_groups():
    with pytest.raises(ValueError, match=r"groups has shape \(3,\), expected \(4,\)"):
        plan_mini_batches(4, 2, np.zeros(3))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=12), st.integers(0, 20))
def test_mini_batches_keep_groups_whole_and_every_row_once(sizes, size):
    # groups of the given sizes, laid out in row order: every row once, in row order inside
    # a step, no group cut, and a step larger than ``size`` only when it is a single group
    groups = np.repeat(np.arange(len(sizes)), sizes)
    n = len(groups)
    minis = plan_mini_batches(n, size, groups)
    assert np.concatenate(minis).tolist() == list(range(n))
    step_of_row = np.concatenate([np.full(len(m), k) for k, m in enumerate(minis)])
    for g in range(len(sizes)):
        assert len(set(step_of_row[groups == g].tolist())) == 1
    for m in minis:
        assert len(m) >= 1
        if 0 < size < n and len(m) > size:
            assert len(set(groups[m].tolist())) == 1


def test_split_pairs_are_counted_per_update_by_kind(policy):
    # 4 rows; without group ids each row is its own group, and mini-batches of 2 rows are
    # [0, 1] and [2, 3]. Two PPO epochs of 2 steps each: 4 optimiser steps.
    model, _ = policy
    batch = make_batch(model, [(3, 2)] * 4, seed=9)
    adv = [1.0, -1.0, 0.5, -0.5]
    cfg = dataclasses.replace(SIMPLE, ppo_epochs=2, mini_batch_size=2, micro_batch_size=1)
    # pairs (0, 1) and (2, 3) lie inside one mini-batch each; micro-batches of one row split
    # both: split_micro 2, counted once per update (not once per epoch: that would be 4)
    inside = PairBatch(np.array([0, 2]), np.array([1, 3]), np.array([1.0, 1.0]))
    _, stats, _ = step(model, batch, adv, cfg, pairs=inside, lambda_pair=1.0)
    assert stats["update/optimizer_steps"] == 4.0
    assert stats["pairs/split_mini"] == 0.0 and stats["pairs/split_micro"] == 2.0
    # pairs (0, 3) and (2, 1) straddle the two mini-batches: split_mini 2, never scored
    across = PairBatch(np.array([0, 2]), np.array([3, 1]), np.array([1.0, 1.0]))
    _, stats, _ = step(model, batch, adv, cfg, pairs=across, lambda_pair=1.0)
    assert stats["pairs/split_mini"] == 2.0 and stats["pairs/split_micro"] == 0.0
    assert stats["pairs/used"] == 0.0
    # the same pairs with the rows' groups [0, 1, 1, 0]: mini-batches [0, 3] and [1, 2]
    cfg = dataclasses.replace(cfg, micro_batch_size=2)
    groups = np.array([0, 1, 1, 0])
    _, stats, _ = step(model, batch, adv, cfg, pairs=across, lambda_pair=1.0, groups=groups)
    assert stats["pairs/split_mini"] == stats["pairs/split_micro"] == 0.0
    assert stats["pairs/used"] == 2.0  # both pairs scored in each of the 2 epochs, / epochs
