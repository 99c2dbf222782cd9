"""GQA-native decode attention: equal to repeat_kv + SDPA, registered with its mask, and the
static sampler with it samples the dynamic sampler's tokens on a 12-query / 2-KV-head model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from mcgpo.rollout import sample
from mcgpo.rollout import static_decode as sd
from mcgpo.rollout.decode_attention import (
    ATTENTION_NAME,
    DECODE_ATTENTIONS,
    gqa_decode_attention,
    use_decode_attention,
)

EPS = torch.finfo(torch.float32).eps


class Attn(torch.nn.Module):
    """What transformers' attention functions read from the module (Qwen2Attention's)."""

    def __init__(self, group: int):
        super().__init__()
        self.num_key_value_groups, self.is_causal = group, True


def reference(q, k, v, mask, scale):
    """transformers' expanded path: repeat_kv to every query head, SDPA, [B, 1, H, D]."""
    group = q.shape[1] // k.shape[1]
    out = F.scaled_dot_product_attention(
        q, repeat_kv(k, group), repeat_kv(v, group), attn_mask=mask, scale=scale
    )
    return out.transpose(1, 2)


@settings(max_examples=80, deadline=None)
@given(
    batch=st.integers(1, 3),
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 6),
    length=st.integers(1, 40),
    dim=st.sampled_from([4, 8, 16]),
    kind=st.sampled_from(["bool", "additive", "per-head", "none"]),
    spread=st.sampled_from([1.0, 3.0]),
    cut=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_gqa_decode_equals_repeat_kv_sdpa(
    batch, kv_heads, group, length, dim, kind, spread, cut, seed
):
    """Random q, k, v, padding masks (every row keeps one column at least) and a column
    bucket past the last attended column: ours equals repeat_kv + SDPA over all columns.

    Tolerance, derived: both sides compute the same float32 dot products, softmax and
    weighted sum in different summation orders. Two orders of a length-D dot product differ
    by at most about 2 D eps sum_i |q_i k_i| (the gamma_D bound), so a score s * q.k by at most
    2 D eps S with S = s * max_j sum_i |q_i k_ji|; the softmax weights then move by at most
    twice that relatively, and the sum of <= L weighted values adds L eps max|v| per
    order. Hence |diff| <= max|v| eps (4 D S + 2 L). (Observed: under 1 % of this bound over
    3,000 random cases with D up to 128.)"""
    g = torch.Generator().manual_seed(seed)
    heads = kv_heads * group
    q = torch.randn(batch, heads, 1, dim, generator=g) * spread
    k = torch.randn(batch, kv_heads, length, dim, generator=g) * spread
    v = torch.randn(batch, kv_heads, length, dim, generator=g)
    keep = torch.rand(batch, 1, 1, length, generator=g) < 0.6
    keep[..., int(cut * (length - 1))] = True
    columns = int(keep.nonzero()[:, -1].max()) + 1  # a bucket past every attended column
    columns += int(cut * (length - columns))
    if kind == "per-head":
        keep = keep.expand(batch, heads, 1, length).clone()
        keep[:, :, :, int(cut * (length - 1))] = True
        keep[:, 0, 0, : columns - 1] = False  # head 0 attends to one column only
    mask = {
        "bool": keep,
        "per-head": keep,
        "additive": torch.where(keep, 0.0, torch.finfo(torch.float32).min),
        "none": None,
    }[kind]
    scale = dim**-0.5
    ref = reference(q, k, v, mask, scale)
    out, weights = gqa_decode_attention(Attn(group), q, k, v, mask, scaling=scale)
    kk = repeat_kv(k, group)
    dots = (q.abs() @ kk.abs().transpose(-1, -2)).amax() * scale
    tol = float(v.abs().max() * EPS * (4 * dim * dots + 2 * length))
    assert out.shape == (batch, 1, heads, dim) and out.is_contiguous() and weights is None
    assert (out - ref).abs().max() <= tol
    if kind != "none":  # the columns past the bucket are masked: the same result without them
        short, _ = gqa_decode_attention(
            Attn(group), q, k, v, mask, scaling=scale, decode_columns=columns
        )
        assert (short - ref).abs().max() <= tol


def test_head_order_output_layout_and_no_causal_mask_golden():
    """By hand. Head order: KV head k has key 0 at column 0 and 50 e_0 at column 1, values
    10k at column 0 and 10k + 1 at column 1; query head h is +e_0 (picks column 1: weights
    1 : e^-50) or -e_0 (picks column 0), pattern 1 0 0 1 1 0. Query head h = k*G + j reads KV
    head k (repeat_kv's order), so heads 0..5 return 1 0 0 11 11 10. Grouping the heads as
    j*Hk + k instead would pair query 4 with slot 2 (1 instead of 0)."""
    b, kv_heads, group, length, dim = 2, 2, 3, 4, 2
    picks = torch.tensor([1.0, 0, 0, 1, 1, 0])
    q = torch.zeros(b, kv_heads * group, 1, dim)
    q[:, :, 0, 0] = picks * 2 - 1
    k = torch.zeros(b, kv_heads, length, dim)
    k[:, :, 1, 0] = 50.0
    v = torch.zeros(b, kv_heads, length, dim)
    v[:, :, 0] = 10 * torch.arange(float(kv_heads)).view(1, kv_heads, 1)
    v[:, :, 1] = v[:, :, 0] + 1
    mask = torch.tensor([True, True, False, False]).view(1, 1, 1, length)
    out, _ = gqa_decode_attention(Attn(group), q, k, v, mask, scaling=1.0)
    assert out.shape == (b, 1, 6, dim)  # [B, q_len, H, D], what the caller reshapes
    assert out[1, 0, :, 1].tolist() == pytest.approx([1, 0, 0, 11, 11, 10], abs=1e-6)
    # No causal mask over the G rows: with q = 0 every score is 0 and each row averages the
    # attended columns. No mask (all 4 columns, values 2 6 1 3): 3 for every head, where a
    # causal call would give row 0 the value 2 (column 0 only); columns 0, 1 masked in: 4.
    v2 = torch.tensor([2.0, 6.0, 1.0, 3.0]).view(1, 1, length, 1).expand(b, kv_heads, -1, dim)
    for m, mean in ((None, 3.0), (mask.expand(b, 1, 1, -1), 4.0)):
        out, _ = gqa_decode_attention(Attn(group), torch.zeros_like(q), k, v2, m, scaling=0.5)
        assert torch.allclose(out, torch.full_like(out, mean))
    # one attended column: its value exactly, for a boolean and an additive mask alike
    one = torch.tensor([False, False, True, False]).view(1, 1, 1, length)
    v3 = torch.randn(b, kv_heads, length, dim)
    for m in (one, torch.where(one, 0.0, float("-inf"))):
        out, _ = gqa_decode_attention(Attn(group), q, k, v3, m, scaling=0.5)
        expect = v3[:, :, 2].repeat_interleave(group, dim=1)  # [B, H, D]
        assert torch.allclose(out[:, 0], expect, atol=1e-6)


def test_multi_token_calls_are_transformers_sdpa_bit_for_bit():
    """The prefill path: any q_len > 1 call returns exactly sdpa_attention_forward's output,
    masked or causal (mask None), and drops the decode-only keyword."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 6, 5, 8, generator=g)
    k, v = torch.randn(2, 2, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g)
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    mask[0, :, :, :2] = False
    mask[0, :, :2, 0] = True  # a padded row's pad positions see one column, as sdpa_mask's
    for m in (mask, None):
        ours, _ = gqa_decode_attention(Attn(3), q, k, v, m, scaling=0.3, decode_columns=2)
        theirs, _ = sdpa_attention_forward(Attn(3), q, k, v, m, scaling=0.3)
        assert torch.equal(ours, theirs)


@pytest.fixture(scope="module")
def gqa_policy(counter_policy):
    """A 2-layer Qwen2 with 12 query heads over 2 KV heads (G = 6, head dim 4), offline."""
    from mcgpo.policy import tiny_model

    _, tok = counter_policy
    model = tiny_model(tok, seed=3, hidden_size=48, num_layers=2, num_heads=12, num_kv_heads=2)
    return model.eval(), tok


def test_registered_with_its_mask_so_the_prefill_is_unchanged(gqa_policy):
    """A left-padded forward (the prefill) inside ``use_decode_attention(model, "gqa")``
    equals the sdpa forward, because the name is registered with sdpa's mask function too;
    a name registered in AttentionInterface alone gets no mask at all (transformers'
    create_causal_mask exit for custom attentions): the probe's flaw (module docstring)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import create_causal_mask

    model, _ = gqa_policy
    ids = torch.randint(3, 200, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, :4], mask[2, :1] = 0, 0
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        with use_decode_attention(model, "gqa"):
            assert model.config._attn_implementation == ATTENTION_NAME
            ours = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
            built = create_causal_mask(model.config, torch.zeros(3, 9, 48), mask, None, pos)
        assert model.config._attn_implementation == "sdpa"
        assert torch.equal(ours, ref)
        assert built is not None and built.dtype == torch.bool and not bool(built[0, 0, 5, 0])
        AttentionInterface.register("mcgpo_test_unmasked", gqa_decode_attention)
        model.set_attn_implementation("mcgpo_test_unmasked")
        try:
            unmasked = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
            assert create_causal_mask(model.config, torch.zeros(3, 9, 48), mask, None, pos) is None
        finally:
            model.set_attn_implementation("sdpa")
    assert not torch.allclose(unmasked[0], ref[0], atol=1e-3)  # the padded row changed
    assert torch.allclose(unmasked[1], ref[1], atol=1e-5)  # the unpadded one did not


def test_switch_restores_the_model_and_refuses_bad_values(gqa_policy):
    model, _ = gqa_policy
    assert DECODE_ATTENTIONS == ("gqa", "sdpa")
    with pytest.raises(RuntimeError, match="inside"), use_decode_attention(model, "gqa"):
        raise RuntimeError("inside")
    assert model.config._attn_implementation == "sdpa"
    with use_decode_attention(model, "sdpa"):
        assert model.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="decode_attention must be one of gqa, sdpa, got 'flash'"):
        sd.sample_static(model, [[3, 4]], eos_token_id=[-1], decode_attention="flash")
    model.set_attn_implementation("eager")
    try:
        with (
            pytest.raises(
                ValueError, match="this model uses 'eager' \\(use decode_attention 'sdpa'\\)"
            ),
            use_decode_attention(model, "gqa"),
        ):
            pass
    finally:
        model.set_attn_implementation("sdpa")


def random_prompts(tok, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, len(tok), (n,), generator=g).tolist() for n in lengths]


def per_row(n, base):
    return [torch.Generator().manual_seed(base + i) for i in range(n)]


CASES = [  # (prompt lengths, column bucket): 1, 3 (-> 4 static rows) and 6 (-> 8) rows
    ([7], 256),
    ([3, 12, 12], 8),  # buckets of 8 columns: every few steps the next bucket
    ([1, 5, 9, 20, 14, 30], 16),
    ([25, 2, 8, 8, 40, 17], 256),
]


@pytest.mark.parametrize(("lengths", "bucket"), CASES)
def test_static_gqa_samples_the_dynamic_samplers_tokens(gqa_policy, monkeypatch, lengths, bucket):
    """Per-row generators, T = 1, some rows ending early: the static sampler with the GQA
    attention (and with transformers' sdpa) draws exactly the dynamic sampler's tokens,
    log-probs within 1e-5, across column buckets."""
    model, tok = gqa_policy
    monkeypatch.setattr(sd, "_COLUMN_BUCKET", bucket)
    prompts = random_prompts(tok, lengths, seed=len(lengths))
    kw = dict(temperature=1.0, max_new_tokens=12, eos_token_id=set(range(3, len(tok), 11)))
    dyn = sample(model, prompts, generator=per_row(len(prompts), 40), **kw)
    for attention in ("gqa", "sdpa"):
        sta = sd.sample_static(
            model, prompts, generator=per_row(len(prompts), 40), decode_attention=attention,
            sync_every=5, **kw,
        )  # fmt: skip
        assert sta.response_ids == dyn.response_ids, attention
        for a, b in zip(dyn.log_probs, sta.log_probs):
            assert b == pytest.approx(a, abs=1e-5)
    assert model.config._attn_implementation == "sdpa"


def test_column_buckets_reach_the_attention(gqa_policy, monkeypatch):
    """_columns rounds the filled count up to the bucket, capped at the cache length; the
    gqa step passes it to every layer's attention, the sdpa step passes nothing."""
    from transformers import AttentionInterface

    assert [sd._columns(f, 768) for f in (1, 256, 257, 700, 768)] == [256, 256, 512, 768, 768]
    model, tok = gqa_policy
    seen: list[tuple[int, int | None]] = []

    def spy(module, query, *args, **kwargs):
        seen.append((query.shape[2], kwargs.get("decode_columns")))
        return gqa_decode_attention(module, query, *args, **kwargs)

    monkeypatch.setattr(sd, "_COLUMN_BUCKET", 8)
    AttentionInterface.register(ATTENTION_NAME, spy)
    try:
        kw = dict(max_new_tokens=6, eos_token_id=[-1], pad_token_id=tok.pad_token_id)
        prompts = random_prompts(tok, [4, 6], seed=1)
        sd.sample_static(model, prompts, temperature=0.0, **kw)
    finally:
        AttentionInterface.register(ATTENTION_NAME, gqa_decode_attention)
    # width 6, cache 256 columns; the step feeding token t fills 7 + t columns (t = 0..4)
    # -> buckets 8, 8, 16, 16, 16, one call per layer (2 layers); the prefill (q_len 6)
    # gets no bucket
    assert seen == [(6, None)] * 2 + [(1, c) for c in (8, 8, 16, 16, 16) for _ in range(2)]


@pytest.mark.slow
def test_compiled_gqa_step_across_a_bucket_equals_the_dynamic_sampler(gqa_policy, monkeypatch):
    """The compiled step (inductor on the CPU) with the GQA attention, crossing from a
    16-column bucket to the next: the dynamic sampler's tokens, log-probs within 1e-5."""
    model, tok = gqa_policy
    monkeypatch.setattr(sd, "_COLUMN_BUCKET", 16)
    prompts = random_prompts(tok, [5, 13, 9], seed=7)  # width 13: columns 14 .. 20 -> 16, then 32
    kw = dict(temperature=1.0, max_new_tokens=8, eos_token_id=[-1], pad_token_id=tok.pad_token_id)
    dyn = sample(model, prompts, generator=per_row(3, 70), **kw)
    sta = sd.sample_static(model, prompts, generator=per_row(3, 70), compile=True, **kw)
    assert sta.response_ids == dyn.response_ids
    for a, b in zip(dyn.log_probs, sta.log_probs):
        assert b == pytest.approx(a, abs=1e-5)
