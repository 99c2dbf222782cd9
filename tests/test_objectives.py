"""Objectives: golden values derived by hand, gradients, masks, micro-batch planning."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mcgpo.objectives import (
    correction_stats_from_sums,
    entropy_from_logits,
    kl_penalty,
    masked_mean,
    pair_loss,
    plan_micro_batches,
    policy_loss,
    response_log_ratio,
    rollout_correction_sums,
    rollout_correction_weights,
    task_loss,
)

torch.set_num_threads(1)
LN = math.log
# The coefficients the golden values below were derived with (verl-agent's recipe, also the
# defaults of TrainConfig); the objectives take them as required arguments.
PPO = {"clip": 0.2, "dual_clip": 3.0}
TASK = {**PPO, "kl_coef": 0.01, "kl_kind": "low_var_kl", "entropy_coef": 0.001}


def t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


# --------------------------------------------------------------------------- masked mean
def test_masked_mean_golden_and_dims():
    x = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = t([[1, 1, 0], [0, 0, 0]], torch.bool)
    # all: (1 + 2) / 2 = 1.5; per row: 1.5 and 0 (no set position -> 0)
    assert masked_mean(x, m).item() == 1.5
    assert masked_mean(x, m, dim=1).tolist() == [1.5, 0.0]
    assert masked_mean(x, m, dim=0).tolist() == [1.0, 2.0, 0.0]


def test_masked_positions_do_not_matter_even_inf():
    x = t([[1.0, float("inf")], [float("nan"), 3.0]])
    m = t([[1, 0], [0, 1]], torch.bool)
    assert masked_mean(x, m).item() == 2.0


# --------------------------------------------------------------------------- policy loss
def test_policy_loss_clip_cases():
    # One row, four tokens, eps = 0.2, dual clip 3; token loss l = max(-A r, -A clip(r)):
    #   r = 1.1, A = +1:  max(-1.1, -1.1) = -1.1                     (inside the trust region)
    #   r = 1.5, A = +1:  max(-1.5, -1.2) = -1.2                     (clipped above)
    #   r = 0.5, A = -1:  max( 0.5,  0.8) =  0.8                     (clipped below)
    #   r = 5.0, A = -1:  max( 5.0,  1.2) =  5.0 -> min(5.0, 3) = 3  (dual clip)
    # token-mean: (-1.1 - 1.2 + 0.8 + 3) / 4 = 1.5 / 4 = 0.375
    ratio = t([[1.1, 1.5, 0.5, 5.0]])
    old = t([[-1.0, -2.0, -0.5, -3.0]])
    new = old + torch.log(ratio)
    adv = t([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, stats = policy_loss(new, old, adv, mask, **PPO)
    assert loss.item() == pytest.approx(0.375, abs=1e-12)
    # clipped tokens: 1.5 (above) and 0.5 (below) -> 2 of 4; dual clip hit: 1 of 4
    assert stats["pg_clipfrac"] == 0.5
    assert stats["pg_clipfrac_lower"] == 0.25
    # ppo_kl = mean(old - new) = -mean(ln r) = -(ln 1.1 + ln 1.5 + ln 0.5 + ln 5) / 4
    assert stats["ppo_kl"] == pytest.approx(-(LN(1.1) + LN(1.5) + LN(0.5) + LN(5.0)) / 4)
    # without dual clip the last token keeps 5.0: (-1.1 - 1.2 + 0.8 + 5) / 4 = 0.875
    loss_nodual, _ = policy_loss(new, old, adv, mask, clip=0.2, dual_clip=0.0)
    assert loss_nodual.item() == pytest.approx(0.875, abs=1e-12)
    # asymmetric clip (clip_high 0.6): the second token is no longer clipped: -1.5
    # (the others are unchanged: the dual clip still caps the last one at 3)
    # (-1.1 - 1.5 + 0.8 + 3) / 4 = 1.2 / 4 = 0.3
    loss_high, _ = policy_loss(new, old, adv, mask, **PPO, clip_high=0.6)
    assert loss_high.item() == pytest.approx(0.3, abs=1e-12)


def test_policy_loss_per_row_advantage_and_token_mean():
    # Row advantages broadcast: row 0 A = 2 over 1 token (r = 1), row 1 A = -1 over 3 tokens
    # (r = 1). Token losses: -2, 1, 1, 1 -> token-mean over 4 response tokens = 1/4.
    new = torch.zeros(2, 3, dtype=torch.float64)
    mask = t([[1, 0, 0], [1, 1, 1]], torch.bool)
    loss, _ = policy_loss(new, new.clone(), t([2.0, -1.0]), mask, **PPO)
    assert loss.item() == pytest.approx(0.25)


def test_policy_loss_gradient_at_ratio_one_is_minus_advantage():
    # At r = 1 d(-A r)/d log pi = -A r = -A; token-mean over 3 tokens divides by 3.
    lp = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    adv = t([[1.0, -2.0, 0.5]])
    loss, _ = policy_loss(lp, torch.zeros(1, 3, dtype=torch.float64), adv, torch.ones(1, 3), **PPO)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-1 / 3, 2 / 3, -0.5 / 3])


def test_policy_loss_rejects_bad_dual_clip():
    z = torch.zeros(1, 1)
    with pytest.raises(ValueError, match=r"'dual_clip' must be > 1 or 0 \(off\), got 0\.5"):
        policy_loss(z, z, z, z, clip=0.2, dual_clip=0.5)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_masked_tokens_do_not_matter(b, length, seed):
    g = torch.Generator().manual_seed(seed)
    lp, old, ref = (torch.randn(b, length, generator=g, dtype=torch.float64) for _ in range(3))
    adv = torch.randn(b, length, generator=g, dtype=torch.float64)
    mask = torch.rand(b, length, generator=g) > 0.4
    ent = torch.rand(b, length, generator=g, dtype=torch.float64)
    noise = [torch.where(mask, x, torch.randn_like(x) * 50) for x in (lp, old, ref, adv, ent)]
    a, _ = task_loss(lp, old, adv, mask, ref_log_probs=ref, entropy=ent, **TASK)
    c, _ = task_loss(
        noise[0], noise[1], noise[3], mask, ref_log_probs=noise[2], entropy=noise[4], **TASK
    )
    assert a.item() == pytest.approx(c.item(), abs=1e-12)
    d1 = response_log_ratio(lp, old, mask)
    d2 = response_log_ratio(noise[0], noise[1], mask)
    assert torch.equal(d1, d2)


# --------------------------------------------------------------------------- KL and entropy
def test_kl_estimators_golden():
    # log pi = ln 0.5, log pi_ref = ln 0.25 -> diff = ln 2
    #   k1 = ln 2;  k2 = (ln 2)^2 / 2;  k3: q = ln(0.25 / 0.5) = -ln 2, exp(q) - q - 1
    #   = 0.5 + ln 2 - 1 = ln 2 - 0.5
    lp, ref = t([[LN(0.5)]]), t([[LN(0.25)]])
    assert kl_penalty(lp, ref, "kl").item() == pytest.approx(LN(2))
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(LN(2))
    assert kl_penalty(lp, ref, "mse").item() == pytest.approx(LN(2) ** 2 / 2)
    assert kl_penalty(lp, ref, "low_var_kl").item() == pytest.approx(LN(2) - 0.5)
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(LN(2) - 0.5)
    assert kl_penalty(lp, ref, "abs").item() == pytest.approx(LN(2))
    # k3 clamp: q = 30 -> clamped to 20 -> exp(20) - 21 > 10 -> 10
    assert kl_penalty(t([[0.0]]), t([[30.0]])).item() == 10.0
    # equal policies: every estimator is 0
    for kind in ("kl", "mse", "low_var_kl"):
        assert kl_penalty(lp, lp, kind).item() == 0.0


def test_kl_unknown_kind():
    with pytest.raises(ValueError, match="kl_penalty: unknown kind 'k4'"):
        kl_penalty(t([[0.0]]), t([[0.0]]), "k4")


def test_entropy_golden():
    # uniform over 4: ln 4; one-hot (very peaked logits): ~0; [B, L, V] -> [B, L]
    logits = t([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]])
    ent = entropy_from_logits(logits)
    assert ent.shape == (1, 2)
    assert ent[0, 0].item() == pytest.approx(LN(4), rel=1e-6)
    assert ent[0, 1].item() == pytest.approx(0.0, abs=1e-6)
    # two-way p = (0.75, 0.25): logits (ln 3, 0) -> H = -(0.75 ln 0.75 + 0.25 ln 0.25)
    h = -(0.75 * LN(0.75) + 0.25 * LN(0.25))
    assert entropy_from_logits(t([[[LN(3), 0.0]]])).item() == pytest.approx(h, rel=1e-6)


def test_task_loss_combines_terms():
    # r = 1 everywhere, A = 1 on both tokens: pg = -1. KL (k1) tokens 0.2, 0.4 -> 0.3;
    # entropy 1, 3 -> 2. L = -1 + 0.5 * 0.3 - 0.1 * 2 = -1.05
    lp = torch.zeros(1, 2, dtype=torch.float64)
    ref = t([[-0.2, -0.4]])
    loss, stats = task_loss(
        lp,
        lp.clone(),
        t([1.0]),
        torch.ones(1, 2),
        ref_log_probs=ref,
        entropy=t([[1.0, 3.0]]),
        **PPO,
        kl_coef=0.5,
        kl_kind="kl",
        entropy_coef=0.1,
    )
    assert loss.item() == pytest.approx(-1.05)
    assert stats["pg_loss"] == -1.0
    assert stats["kl"] == pytest.approx(0.3) and stats["entropy"] == 2.0


# --------------------------------------------------------------------------- rollout correction
# A tiny batch: 2 rows, 3 columns; row 0 has 2 response tokens (column 2 is padding with
# garbage: pi_old 9, mu -inf), row 1 has 3. Token ratios rho = pi_old / mu:
#   row 0: 1, 3          (log-ratios 0, ln 3)
#   row 1: 0.4, 1.5, 1   (log-ratios ln 0.4, ln 1.5, 0)
# Sequence ratios: row 0: 3; row 1: 0.4 * 1.5 * 1 = 0.6. cap = 2 (mis keeps [0.5, 2]).
CORR_MASK = t([[1, 1, 0], [1, 1, 1]], torch.bool)
CORR_OLD = t([[-1.0, -2.0, 9.0], [-0.5, -1.5, -0.7]])
CORR_BEH = CORR_OLD - t([[0.0, LN(3), 0.0], [LN(0.4), LN(1.5), 0.0]])
CORR_BEH[0, 2] = -math.inf


def corr(mode, level, beh=CORR_BEH, cap=2.0):
    return rollout_correction_weights(CORR_OLD, beh, CORR_MASK, mode=mode, level=level, cap=cap)


@pytest.mark.parametrize(
    "mode, level, weights, ratio_mean, clipped, masked",
    [
        # token level: ratio mean (1 + 3 + 0.4 + 1.5 + 1) / 5 = 1.38, max 3
        #   tis: min(rho, 2) -> 1, 2 | 0.4, 1.5, 1; 1 of 5 tokens truncated
        ("tis", "token", [[1, 2, 0], [0.4, 1.5, 1]], 1.38, 0.2, 0.0),
        #   mis: 3 > 2 and 0.4 < 0.5 are masked -> 1, 0 | 0, 1.5, 1; 2 of 5 masked
        ("mis", "token", [[1, 0, 0], [0, 1.5, 1]], 1.38, 0.0, 0.4),
        ("none", "token", [[1, 1, 0], [1, 1, 1]], 1.38, 0.0, 0.0),
        # sequence level: ratio mean over the 2 rows (3 + 0.6) / 2 = 1.8, max 3
        #   tis: row 0 min(3, 2) = 2 on both tokens, row 1 0.6 on its three; 1 of 2 rows cut
        ("tis", "sequence", [[2, 2, 0], [0.6, 0.6, 0.6]], 1.8, 0.5, 0.0),
        #   mis: row 0 (3 > 2) masked whole, row 1 (0.6 in [0.5, 2]) keeps 0.6
        ("mis", "sequence", [[0, 0, 0], [0.6, 0.6, 0.6]], 1.8, 0.0, 0.5),
        ("none", "sequence", [[1, 1, 0], [1, 1, 1]], 1.8, 0.0, 0.0),
    ],
)
def test_rollout_correction_golden(mode, level, weights, ratio_mean, clipped, masked):
    w, stats = corr(mode, level)
    torch.testing.assert_close(w, t(weights), rtol=0, atol=1e-12)
    assert not w.requires_grad
    assert stats["rollout_correction/ratio_mean"] == pytest.approx(ratio_mean)
    assert stats["rollout_correction/ratio_max"] == pytest.approx(3.0)
    assert stats["rollout_correction/clipped_frac"] == pytest.approx(clipped)
    assert stats["rollout_correction/masked_frac"] == pytest.approx(masked)
    # the mean weight over the 5 response tokens is the mean of the golden weights
    assert stats["rollout_correction/weight_mean"] == pytest.approx(sum(map(sum, weights)) / 5)
    # sequence log-ratios ln 3 and ln 0.6: population SD = |ln 3 - ln 0.6| / 2 = ln(5) / 2
    assert stats["rollout_correction/seq_log_ratio_sd"] == pytest.approx(LN(5) / 2)


@pytest.mark.parametrize(
    "mode, level, loss, grad",
    [
        # log pi = pi_old (PPO ratio 1), A = (+1, -1) per row, so l_t = -A w_t and
        # d L / d log pi_t = -A w_t / 5 (token mean over 5 response tokens):
        # none: (-1 - 1 + 1 + 1 + 1) / 5 = 0.2
        ("none", "token", 0.2, [[-0.2, -0.2, 0], [0.2, 0.2, 0.2]]),
        # tis token: (-1 - 2 + 0.4 + 1.5 + 1) / 5 = -0.02
        ("tis", "token", -0.02, [[-0.2, -0.4, 0], [0.08, 0.3, 0.2]]),
        # mis sequence: (0 + 0 + 3 * 0.6) / 5 = 0.36
        ("mis", "sequence", 0.36, [[0, 0, 0], [0.12, 0.12, 0.12]]),
    ],
)
def test_rollout_correction_weights_the_task_loss_golden(mode, level, loss, grad):
    w, _ = corr(mode, level)
    lp = CORR_OLD.clone().requires_grad_(True)
    out, stats = task_loss(
        lp, CORR_OLD, t([1.0, -1.0]), CORR_MASK, **TASK, rollout_weights=w
    )  # no reference, no entropy: L_task is the weighted policy loss
    assert out.item() == pytest.approx(loss, abs=1e-12)
    assert stats["pg_loss"] == pytest.approx(loss, abs=1e-12)
    out.backward()
    torch.testing.assert_close(lp.grad, t(grad), rtol=0, atol=1e-12)


def test_rollout_correction_weights_only_the_policy_gradient_term():
    # KL (k1) tokens log pi - log pi_ref = 0.5 on all 5 tokens -> 0.5, entropy 2 everywhere:
    # weighted pg (tis, token) -0.02 + kl_coef 0.1 * 0.5 - entropy_coef 0.01 * 2 = 0.01;
    # the KL and entropy token means are not weighted (verl weights pg_losses only).
    w, _ = corr("tis", "token")
    out, _ = task_loss(
        CORR_OLD, CORR_OLD, t([1.0, -1.0]), CORR_MASK, ref_log_probs=CORR_OLD - 0.5,
        entropy=torch.full((2, 3), 2.0, dtype=torch.float64), **PPO, kl_coef=0.1,
        kl_kind="kl", entropy_coef=0.01, rollout_weights=w,
    )  # fmt: skip
    assert out.item() == pytest.approx(-0.02 + 0.05 - 0.02, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 6),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["none", "tis", "mis"]),
    st.sampled_from(["token", "sequence"]),
)
def test_zero_mismatch_loss_is_the_uncorrected_loss_bit_for_bit(b, length, seed, mode, level):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, length, generator=g) * 3  # float32, as the trainer's log-probs
    new = (old + 0.3 * torch.randn(b, length, generator=g)).requires_grad_(True)
    adv = torch.randn(b, generator=g)
    mask = torch.rand(b, length, generator=g) < 0.7
    w, stats = rollout_correction_weights(old, old.clone(), mask, mode=mode, level=level, cap=2.0)
    plain, _ = task_loss(new, old, adv, mask, **TASK)
    (g_plain,) = torch.autograd.grad(plain, new)
    fixed, _ = task_loss(new, old, adv, mask, **TASK, rollout_weights=w)
    (g_fixed,) = torch.autograd.grad(fixed, new)
    assert torch.equal(plain, fixed) and torch.equal(g_plain, g_fixed)
    if mask.any():
        assert stats["rollout_correction/ratio_max"] == 1.0
        assert stats["rollout_correction/seq_log_ratio_sd"] == 0.0


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_injected_mismatch_changes_exactly_those_weights(b, length, seed):
    # mu shifted down by delta in [0.05, 3) on some response tokens: rho = exp(delta) > 1 there
    # (tis: min(rho, 2) != 1; mis: masked beyond ln 2), exactly 1 elsewhere; at the sequence
    # level exactly the rows holding a shifted token change (the shifts never cancel).
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, length, generator=g) * 3
    mask = torch.rand(b, length, generator=g) < 0.7
    shifted = mask & (torch.rand(b, length, generator=g) < 0.4)
    delta = 0.05 + 2.95 * torch.rand(b, length, generator=g)
    beh = torch.where(shifted, old - delta, old)
    for mode in ("tis", "mis"):
        w, _ = rollout_correction_weights(old, beh, mask, mode=mode, level="token", cap=2.0)
        assert torch.equal((w != 1) & mask, shifted)
        ws, _ = rollout_correction_weights(old, beh, mask, mode=mode, level="sequence", cap=2.0)
        assert torch.equal((ws != 1) & mask, shifted.any(1, keepdim=True) & mask)
    assert torch.equal(((w == 0) & mask), shifted & (delta > LN(2.0)))  # mis, token level


def test_rollout_correction_empty_mask_and_masked_positions():
    # no response token: all-zero weights and no statistics
    w, stats = rollout_correction_weights(
        torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.bool),
        mode="tis", level="sequence", cap=2.0,
    )  # fmt: skip
    assert w.tolist() == [[0, 0], [0, 0]] and stats == {}
    # padding values (inf, nan) never reach the weights or the stats
    beh = CORR_BEH.clone()
    beh[0, 2] = math.nan
    for level in ("token", "sequence"):
        w, stats = corr("tis", level, beh=beh)
        assert torch.isfinite(w).all() and all(math.isfinite(v) for v in stats.values())


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 6),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["none", "tis", "mis"]),
    st.sampled_from(["token", "sequence"]),
)
def test_pooled_correction_sums_give_the_whole_batchs_stats(b, length, seed, mode, level):
    """Rows split into two sets (two ranks): the sums of the two sets, added, give the
    statistics the whole batch gives (all but ratio_max, which the ranks merge by the
    largest); one set's sums give its own statistics. Within 1e-6 relative: the fractions
    of rollout_correction_weights are float32 means, the pooled ones float64."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, length, generator=g, dtype=torch.float64) * 3
    beh = old - 1.5 * torch.randn(b, length, generator=g, dtype=torch.float64)
    mask = torch.rand(b, length, generator=g) < 0.7
    first = torch.rand(b, generator=g) < 0.5
    args = {"mode": mode, "level": level, "cap": 2.0}
    _, whole = rollout_correction_weights(old, beh, mask, **args)
    parts = [
        rollout_correction_sums(old[rows], beh[rows], mask[rows], **args)
        for rows in (first, ~first)
    ]
    pooled = correction_stats_from_sums(parts[0] + parts[1])
    assert set(pooled) == set(whole) - {"rollout_correction/ratio_max"}
    for key, value in pooled.items():
        assert value == pytest.approx(whole[key], rel=1e-6, abs=1e-9), key
    _, own = rollout_correction_weights(old[first], beh[first], mask[first], **args)
    mine = correction_stats_from_sums(parts[0])
    assert set(mine) == set(own) - {"rollout_correction/ratio_max"}
    for key, value in mine.items():
        assert value == pytest.approx(own[key], rel=1e-6, abs=1e-9), key


def test_correction_sums_golden():
    # CORR_* at tis, token level: 5 units (response tokens), ratio sum 1 + 3 + 0.4 + 1.5 +
    # 1 = 6.9, 1 truncated, 0 masked, 5 tokens, weight sum 1 + 2 + 0.4 + 1.5 + 1 = 5.9,
    # 2 rows, sequence log-ratios ln 3 and ln 0.6 (sum ln 1.8, squares ln²3 + ln²0.6)
    sums = rollout_correction_sums(
        CORR_OLD, CORR_BEH, CORR_MASK, mode="tis", level="token", cap=2.0
    )
    expected = [5, 6.9, 1, 0, 5, 5.9, 2, LN(1.8), LN(3) ** 2 + LN(0.6) ** 2]
    np.testing.assert_allclose(sums, expected, rtol=1e-12)
    with pytest.raises(ValueError, match="mode must be one of none, tis, mis; got 'is'"):
        rollout_correction_sums(CORR_OLD, CORR_BEH, CORR_MASK, mode="is", level="token", cap=2.0)
    assert correction_stats_from_sums(np.zeros(9)) == {}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "is"}, "mode must be one of none, tis, mis; got 'is'"),
        ({"level": "row"}, "level must be one of token, sequence; got 'row'"),
        ({"cap": 1.0}, "cap must be a finite number > 1, got 1.0"),
        ({"cap": math.inf}, "cap must be a finite number > 1, got inf"),
    ],
)
def test_rollout_correction_bad_input(kwargs, message):
    args = {"mode": "tis", "level": "token", "cap": 2.0, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        rollout_correction_weights(CORR_OLD, CORR_BEH, CORR_MASK, **args)


def test_rollout_correction_shapes_must_agree():
    with pytest.raises(ValueError, match=re.escape("shapes differ: old (2, 3), behaviour (2, 2)")):
        rollout_correction_weights(
            CORR_OLD, CORR_BEH[:, :2], CORR_MASK, mode="tis", level="token", cap=2.0
        )


# --------------------------------------------------------------------------- pair loss
def test_response_log_ratio_is_length_normalised():
    # row 0: tokens (0.2, 0.4, masked 9) -> 0.3; row 1: one token -0.5; row 2: none -> 0
    lp = t([[0.2, 0.4, 9.0], [-0.5, 0.0, 0.0], [1.0, 1.0, 1.0]])
    mask = t([[1, 1, 0], [1, 0, 0], [0, 0, 0]], torch.bool)
    assert response_log_ratio(lp, torch.zeros_like(lp), mask).tolist() == pytest.approx(
        [0.3, -0.5, 0.0]
    )


def test_pair_loss_golden():
    # Micro-batch of 5 rows with global ids 10..14 and d = (0.3, -0.1, 0.0, 0.2, 0.5).
    # Pairs (global): 10 > 11 with c = 0.5; 13 > 12 with c = 2; 14 > 99 (99 not here: split).
    #   margins: 0.3 - (-0.1) = 0.4;  0.2 - 0.0 = 0.2
    #   sum = 0.5 * softplus(-0.4) + 2 * softplus(-0.2);  floor(5 / 2) = 2
    d = t([0.3, -0.1, 0.0, 0.2, 0.5])
    rows = np.array([10, 11, 12, 13, 14])
    loss, stats = pair_loss(d, [10, 13, 14], [11, 12, 99], [0.5, 2.0, 1.0], rows)
    sp = lambda x: math.log1p(math.exp(x))  # noqa: E731
    assert loss.item() == pytest.approx((0.5 * sp(-0.4) + 2 * sp(-0.2)) / 2)
    assert stats["pairs"] == 2 and stats["pairs_split"] == 1
    assert stats["pair_margin"] == pytest.approx(0.3) and stats["pair_accuracy"] == 1.0


def test_pair_loss_gradient_raises_plus_and_lowers_minus():
    # dL/dd+ = -c * sigmoid(-(d+ - d-)) / floor(B/2) < 0 -> gradient descent raises d+
    d = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    loss, _ = pair_loss(d, [2], [0], [1.5], np.arange(4))
    loss.backward()
    # at margin 0: sigmoid(0) = 0.5 -> dL/dd2 = -1.5 * 0.5 / 2 = -0.375, dL/dd0 = +0.375
    assert d.grad.tolist() == pytest.approx([0.375, 0.0, -0.375, 0.0])
    # end to end through log-probs: one step of gradient descent widens the margin
    lp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 3, dtype=torch.bool)
    loss, _ = pair_loss(
        response_log_ratio(lp, torch.zeros(2, 3, dtype=torch.float64), mask),
        [1],
        [0],
        [1.0],
        np.arange(2),
    )
    loss.backward()
    with torch.no_grad():
        step = lp - 0.5 * lp.grad
        d_new = step.mean(1)
    assert d_new[1] > 0 > d_new[0]


def test_pairs_split_across_micro_batches_contribute_nothing():
    # The pair (0, 3) is split: micro-batch {0, 1} sees only row 0 -> loss 0, no gradient.
    d = torch.tensor([0.4, -1.0], dtype=torch.float64, requires_grad=True)
    loss, stats = pair_loss(d, [0], [3], [1.0], np.array([0, 1]))
    loss.backward()
    assert loss.item() == 0.0 and d.grad.abs().sum().item() == 0.0
    assert stats["pairs"] == 0 and stats["pairs_split"] == 1


def test_pair_loss_bad_input():
    d = torch.zeros(3)
    with pytest.raises(ValueError, match=r"d has shape \(3,\), want \(2,\)"):
        pair_loss(d, [0], [1], [1.0], np.array([0, 1]))
    with pytest.raises(ValueError, match="plus, minus and weight differ in length"):
        pair_loss(d, [0], [1], [1.0, 2.0], np.arange(3))
    with pytest.raises(ValueError, match="batch_rows holds a row id twice"):
        pair_loss(d, [0], [1], [1.0], np.array([0, 1, 1]))


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 12), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_planned_micro_batches_reproduce_the_whole_batch_loss(half, half_mbs, seed):
    # An even number of rows and an even micro-batch size; pairs from a random matching.
    # Combining micro-batch losses with weights |B_b| / |B| gives the whole-batch loss.
    rng = np.random.default_rng(seed)
    n, mbs = 2 * half, 2 * half_mbs
    perm = rng.permutation(n)
    n_pairs = int(rng.integers(0, half + 1))
    plus, minus = perm[:n_pairs], perm[n_pairs : 2 * n_pairs]
    weight = rng.random(n_pairs)
    lp = torch.tensor(rng.normal(size=(n, 5)))
    old = torch.tensor(rng.normal(size=(n, 5)))
    adv = torch.tensor(rng.normal(size=n))
    mask = torch.tensor(rng.random((n, 5)) > 0.3)
    mask[:, 0] = True

    def loss_of(rows: np.ndarray) -> torch.Tensor:
        idx = torch.as_tensor(rows)
        task, _ = task_loss(lp[idx], old[idx], adv[idx], mask[idx], **{**TASK, "kl_coef": 0.0})
        d = response_log_ratio(lp[idx], old[idx], mask[idx])
        pair, _ = pair_loss(d, plus, minus, weight, rows)
        return task, pair

    _, whole_pair = loss_of(np.arange(n))
    plan = plan_micro_batches(n, mbs, plus, minus)
    assert plan.split_pairs == 0
    assert sorted(np.concatenate(plan.batches).tolist()) == list(range(n))
    combined = sum(len(b) / n * loss_of(b)[1] for b in plan.batches)
    assert float(combined) == pytest.approx(float(whole_pair), rel=1e-12, abs=1e-15)


# --------------------------------------------------------------------------- planner
def test_plan_keeps_partners_together_golden():
    # 7 rows, pairs (5, 1) and (2, 6), micro-batch 3. Units in order of smaller row id:
    # pair (1, 5), pair (2, 6), singles 0, 3, 4.
    #   batch 0: 1, 5, then one place left and the next unit is a pair -> single 0
    #   batch 1: 2, 6, then single 3;  batch 2: 4
    plan = plan_micro_batches(7, 3, np.array([5, 2]), np.array([1, 6]))
    assert [b.tolist() for b in plan.batches] == [[1, 5, 0], [2, 6, 3], [4]]
    assert plan.split_pairs == 0


def test_plan_never_splits_a_pair_when_only_pairs_are_left():
    # 6 rows, all paired: (0, 1), (2, 3), (4, 5); micro-batch 3. After pair (0, 1) one place
    # is left and no unpaired row can fill it, so pair (2, 3) starts a new batch (the
    # planner used to put 2 next to 0, 1 and 3 into the next batch, splitting the pair).
    plan = plan_micro_batches(6, 3, np.array([0, 2, 4]), np.array([1, 3, 5]))
    assert [b.tolist() for b in plan.batches] == [[0, 1], [2, 3], [4, 5]]
    assert plan.split_pairs == 0


def test_plan_fills_with_singles_until_they_run_out():
    # 7 rows, pairs (0, 1), (2, 3), (4, 5), single 6, micro-batch 3:
    #   batch 0: 0, 1, one place left -> single 6;  batch 1: 2, 3, one place, no single left
    #   -> batch 1 stays one short;  batch 2: 4, 5
    plan = plan_micro_batches(7, 3, np.array([0, 2, 4]), np.array([1, 3, 5]))
    assert [b.tolist() for b in plan.batches] == [[0, 1, 6], [2, 3], [4, 5]]
    assert plan.split_pairs == 0


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 30), st.integers(2, 9), st.data())
def test_plan_never_splits_a_pair_and_keeps_every_row_once(n, mbs, data):
    # Any matching of any rows, any micro-batch size >= 2: every row appears exactly once,
    # no batch is larger than the size or empty, and no pair is split.
    perm = data.draw(st.permutations(range(n)))
    n_pairs = data.draw(st.integers(0, n // 2))
    plus = np.array(perm[:n_pairs], dtype=np.int64)
    minus = np.array(perm[n_pairs : 2 * n_pairs], dtype=np.int64)
    plan = plan_micro_batches(n, mbs, plus, minus)
    rows = np.concatenate(plan.batches).tolist() if plan.batches else []
    assert sorted(rows) == list(range(n))
    assert all(1 <= len(b) <= mbs for b in plan.batches)
    where = {int(r): i for i, b in enumerate(plan.batches) for r in b}
    assert all(where[int(a)] == where[int(b)] for a, b in zip(plus, minus, strict=True))
    assert plan.split_pairs == 0


def test_plan_reports_split_pairs():
    # micro-batch size 1 cannot hold a pair: both pairs are split
    plan = plan_micro_batches(4, 1, np.array([0, 2]), np.array([1, 3]))
    assert plan.split_pairs == 2 and len(plan.batches) == 4


def test_plan_without_pairs_is_plain_chunking():
    plan = plan_micro_batches(5, 2, np.array([], dtype=int), np.array([], dtype=int))
    assert [b.tolist() for b in plan.batches] == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((4, 0, [0], [1]), "micro_batch_size must be >= 1, got 0"),
        ((4, 2, [0], [4]), r"a pair row lies outside 0..3"),
        ((4, 2, [1], [1]), "a pair joins a row with itself"),
        ((4, 2, [0, 0], [1, 2]), "a row belongs to two pairs"),
        ((4, 2, [0], [1, 2]), "plus and minus differ in length"),
    ],
)
def test_plan_bad_input(args, message):
    n, mbs, plus, minus = args
    with pytest.raises(ValueError, match=message):
        plan_micro_batches(n, mbs, np.array(plus), np.array(minus))
