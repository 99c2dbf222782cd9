"""Position-aligned token log-probs and entropies; masks; chunking; gradients."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mcgpo.policy import (
    position_ids,
    token_entropy,
    token_log_probs,
    token_log_probs_and_entropy,
)
from mcgpo.policy.logprobs import PolicyForward
from mcgpo.rollout import TokenBatch


class Bigram(torch.nn.Module):
    """logits at position t = table[input_ids[t]]: a next-token table, easy to do by hand."""

    def __init__(self) -> None:
        super().__init__()
        weights = torch.tensor([[1.0, 1.0, 2.0], [1.0, 3.0, 4.0], [2.0, 1.0, 1.0]])
        self.table = torch.nn.Parameter(weights.log())  # softmax(log w) = w / sum(w)

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return SimpleNamespace(logits=self.table[input_ids])


def test_golden_values_by_hand():
    # next-token distributions: after 0 -> [1/4, 1/4, 1/2], after 1 -> [1/8, 3/8, 1/2],
    #                           after 2 -> [1/2, 1/4, 1/4]
    ids = torch.tensor([[0, 2, 1, 1], [1, 0, 0, 0], [0, 0, 1, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 1, 1]])  # full, right-, left-padded
    logp, ent = token_log_probs_and_entropy(Bigram(), ids, mask)
    ln = math.log
    expected = [
        [0.0, ln(1 / 2), ln(1 / 4), ln(3 / 8)],  # p(2|0), p(1|2), p(1|1)
        [0.0, ln(1 / 8), 0.0, 0.0],  # p(0|1), then padding
        [0.0, 0.0, 0.0, ln(1 / 8)],  # padding, first real token (no prefix), p(0|1)
    ]
    assert torch.allclose(logp, torch.tensor(expected), atol=1e-6)
    # H([1/4,1/4,1/2]) = 1/2 ln 4 + 1/2 ln 2 = 1.5 ln 2 (same for its permutation after 2);
    # H([1/8,3/8,1/2]) = 1/8 ln 8 + 3/8 ln(8/3) + 1/2 ln 2 = 2 ln 2 - 3/8 ln 3
    h0, h1 = 1.5 * ln(2), 2 * ln(2) - 3 / 8 * ln(3)
    expected_h = [[0.0, h0, h0, h1], [0.0, h1, 0.0, 0.0], [0.0, 0.0, 0.0, h1]]
    assert torch.allclose(ent, torch.tensor(expected_h), atol=1e-6)
    assert torch.equal(token_log_probs(Bigram(), ids, mask), logp)
    assert torch.equal(token_entropy(Bigram(), ids, mask), ent)


def test_position_ids_count_real_tokens_only():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert position_ids(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]]


def test_left_right_and_no_padding_agree(small_policy):
    model, tok = small_policy
    seqs = [tok(t)["input_ids"] for t in ("go to fridge 1", "open fridge 1 now", "click[Buy Now]")]
    width = max(map(len, seqs))
    right = torch.zeros((3, width), dtype=torch.long)
    left = torch.zeros((3, width), dtype=torch.long)
    rmask, lmask = torch.zeros_like(right), torch.zeros_like(left)
    for i, s in enumerate(seqs):
        right[i, : len(s)], rmask[i, : len(s)] = torch.tensor(s), 1
        left[i, width - len(s) :], lmask[i, width - len(s) :] = torch.tensor(s), 1
    with torch.no_grad():
        r, re = token_log_probs_and_entropy(model, right, rmask)
        lft, le = token_log_probs_and_entropy(model, left, lmask)
        for i, s in enumerate(seqs):
            alone, ae = token_log_probs_and_entropy(model, torch.tensor([s]), torch.ones(1, len(s)))
            assert torch.allclose(r[i, : len(s)], alone[0], atol=1e-5)
            assert torch.allclose(lft[i, width - len(s) :], alone[0], atol=1e-5)
            assert torch.allclose(re[i, : len(s)], ae[0], atol=1e-5)
            assert torch.allclose(le[i, width - len(s) :], ae[0], atol=1e-5)
    assert not torch.isnan(lft).any() and not torch.isnan(le).any()


def test_padding_ids_do_not_matter(small_policy):
    model, tok = small_policy
    batch = TokenBatch.from_sequences(
        [tok("go to")["input_ids"], tok("open the fridge 1 now")["input_ids"]],
        [[5, 6], [7]],
        [[0.0, 0.0], [0.0]],
        pad_token_id=0,
    )
    noisy = batch.input_ids.clone()
    noisy[batch.attention_mask == 0] = 9  # any id in the padding
    with torch.no_grad():
        a = token_log_probs(model, batch.input_ids, batch.attention_mask)
        b = token_log_probs(model, noisy, batch.attention_mask)
    assert torch.equal(a, b)


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_chunked_equals_whole_values_and_gradients(small_policy, chunk):
    model, tok = small_policy
    ids = torch.tensor([tok("take apple 1 from countertop 2")["input_ids"]] * 2)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    whole_lp, whole_h = token_log_probs_and_entropy(model, ids, mask)
    (whole_lp.sum() + whole_h.sum()).backward()
    whole_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    lp, h = token_log_probs_and_entropy(model, ids, mask, chunk_size=chunk)
    (lp.sum() + h.sum()).backward()
    assert torch.allclose(lp, whole_lp, atol=1e-5) and torch.allclose(h, whole_h, atol=1e-5)
    for p, g in zip(model.parameters(), whole_grads):
        assert torch.allclose(p.grad, g, atol=1e-5)
    model.zero_grad()


def _values_and_grads(model, params, ids, mask, chunk):
    lp, h = token_log_probs_and_entropy(model, ids, mask, chunk_size=chunk)
    (lp.sum() + h.sum()).backward()
    grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return lp.detach(), h.detach(), grads


def _one_rank_gloo(tmp_path):
    """A world of one process (gloo, a file store): DDP runs its reducer as with W ranks."""
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)


@pytest.mark.parametrize("chunk", [None, 3])
def test_policy_forward_and_ddp_around_it_give_the_plain_values_and_gradients(
    small_policy, tmp_path, chunk
):
    """The wrapper DDP and FSDP2 see (one forward for body and chunked head) gives exactly
    the numbers of the plain model: the same operations in the same order, so equal bits."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model, tok = small_policy
    params = list(model.parameters())
    ids = torch.tensor([tok("take apple 1 from countertop 2")["input_ids"]] * 2)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    plain = _values_and_grads(model, params, ids, mask, chunk)
    wrapped = PolicyForward(model)
    assert [n for n, _ in wrapped.named_parameters()] == [
        f"policy.{n}" for n, _ in model.named_parameters()
    ]
    _one_rank_gloo(tmp_path)
    try:
        ddp = DistributedDataParallel(wrapped)
        for learner in (wrapped, ddp):
            lp, h, grads = _values_and_grads(learner, params, ids, mask, chunk)
            assert torch.equal(lp, plain[0]) and torch.equal(h, plain[1])
            assert all(torch.equal(g, ref) for g, ref in zip(grads, plain[2]))
        # the unchunked call through the wrapper is the policy's own output
        out = ddp(input_ids=ids, attention_mask=mask)
        assert torch.equal(out.logits, model(input_ids=ids, attention_mask=mask).logits)
    finally:
        dist.destroy_process_group()


def test_masked_loss_gives_no_gradient_to_prompt_positions(small_policy):
    """Observation/prompt tokens carry no loss: only response log-probs receive gradient,
    and the parameter gradient equals the one from response tokens computed row by row."""
    model, tok = small_policy
    prompts = [
        tok("You arrive at fridge 1.\n")["input_ids"],
        tok("On the countertop 2\n")["input_ids"],
    ]
    responses = [tok("open fridge 1", add_special_tokens=False)["input_ids"] + [2], [7, 8]]
    batch = TokenBatch.from_sequences(
        prompts, responses, [[0.0] * len(r) for r in responses], pad_token_id=0
    )
    adv = torch.tensor([1.5, -0.5])
    logp = token_log_probs(model, batch.input_ids, batch.attention_mask)
    logp.retain_grad()
    loss = -(logp * batch.per_token(adv)).sum()
    model.zero_grad()
    loss.backward()
    assert (logp.grad[~batch.response_mask] == 0).all()  # prompt and padding: zero gradient
    assert (logp.grad[batch.response_mask] != 0).all()
    batch_grads = [p.grad.clone() for p in model.parameters()]
    # reference: each row alone, summing log-probs of its response tokens by explicit indexing
    model.zero_grad()
    ref = torch.zeros(())
    for p, r, a in zip(prompts, responses, adv):
        seq = torch.tensor([p + r])
        logits = model(input_ids=seq).logits[0].float().log_softmax(-1)
        for k, token in enumerate(r):
            ref = ref - a * logits[len(p) + k - 1, token]
    ref.backward()
    assert torch.allclose(loss, ref, atol=1e-5)
    for p, g in zip(model.parameters(), batch_grads):
        assert torch.allclose(p.grad, g, atol=1e-6)
    model.zero_grad()


def test_bad_shapes_and_chunk_size(small_policy):
    model, _ = small_policy
    ids = torch.ones((2, 3), dtype=torch.long)
    with pytest.raises(ValueError, match=r"must both be \[R, L\]; got \(2, 3\) and \(2, 2\)"):
        token_log_probs(model, ids, torch.ones((2, 2)))
    with pytest.raises(ValueError, match="chunk_size must be >= 1 or None, got 0"):
        token_log_probs(model, ids, torch.ones_like(ids), chunk_size=0)


def _response_rows(tok):
    """Two rows, one left-padded, with the last 3 (row 0) and 2 (row 1) tokens as response."""
    ids = torch.tensor([tok("open fridge 1 then take apple 1")["input_ids"]] * 2)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    positions = torch.zeros_like(ids, dtype=torch.bool)
    positions[0, -3:] = True
    positions[1, -2:] = True
    return ids, mask, positions


@pytest.mark.parametrize("chunk", [None, 1, 2])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_positions_give_the_whole_rows_values_there_and_zero_elsewhere(
    small_policy, chunk, with_entropy
):
    """The head on the wanted positions only: the same log-probs and entropies there as the
    whole-row pass, 0 elsewhere, and the same gradient for a loss on those positions."""
    model, tok = small_policy
    ids, mask, positions = _response_rows(tok)
    whole_lp, whole_h = token_log_probs_and_entropy(model, ids, mask, with_entropy=with_entropy)
    (whole_lp[positions].sum() + whole_h[positions].sum()).backward()
    whole_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    lp, h = token_log_probs_and_entropy(
        model, ids, mask, with_entropy=with_entropy, chunk_size=chunk, positions=positions
    )
    (lp[positions].sum() + h[positions].sum()).backward()
    assert torch.allclose(lp[positions], whole_lp[positions], atol=1e-6)
    assert torch.allclose(h[positions], whole_h[positions], atol=1e-6)
    assert (lp[~positions] == 0).all() and (h[~positions] == 0).all()
    assert (lp[positions] < 0).all()
    for p, g in zip(model.parameters(), whole_grads):
        assert torch.allclose(p.grad, g, atol=1e-6)
    model.zero_grad()
    assert torch.equal(token_log_probs(model, ids, mask, positions=positions), lp.detach())


def test_positions_on_padding_or_the_first_token_stay_zero(small_policy):
    """A wanted position without a real prefix (t = 0, left padding) is 0, as in the whole
    pass; no position wanted gives all zeros."""
    model, tok = small_policy
    ids, mask, _ = _response_rows(tok)
    everywhere = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        whole = token_log_probs(model, ids, mask)
        lp = token_log_probs(model, ids, mask, positions=everywhere)
        none = token_log_probs(model, ids, mask, positions=torch.zeros_like(everywhere))
    assert torch.allclose(lp, whole, atol=1e-6)
    assert (lp[:, 0] == 0).all() and (lp[1, :3] == 0).all()
    assert (none == 0).all() and none.shape == ids.shape


def test_positions_through_policy_forward_and_ddp(small_policy, tmp_path):
    """The wrapper DDP/FSDP2 see routes the positions through its one forward: the plain
    model's values and gradients, bit for bit."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model, tok = small_policy
    params = list(model.parameters())
    ids, mask, positions = _response_rows(tok)

    def values_and_grads(learner):
        lp, h = token_log_probs_and_entropy(learner, ids, mask, positions=positions)
        (lp.sum() + h.sum()).backward()
        grads = [p.grad.clone() for p in params]
        for p in params:
            p.grad = None
        return lp.detach(), h.detach(), grads

    plain = values_and_grads(model)
    _one_rank_gloo(tmp_path)
    try:
        wrapped = PolicyForward(model)
        for learner in (wrapped, DistributedDataParallel(wrapped)):
            lp, h, grads = values_and_grads(learner)
            assert torch.equal(lp, plain[0]) and torch.equal(h, plain[1])
            assert all(torch.equal(g, ref) for g, ref in zip(grads, plain[2]))
    finally:
        dist.destroy_process_group()


def test_positions_bad_shape_and_soft_capped_models(small_policy):
    model, _ = small_policy
    ids = torch.ones((2, 3), dtype=torch.long)
    with pytest.raises(ValueError, match=r"positions must be \[R, L\] like input_ids"):
        token_log_probs(model, ids, torch.ones_like(ids), positions=torch.ones((2, 2)))
    model.config.final_logit_softcapping = 30.0
    try:
        with pytest.raises(ValueError, match="final_logit_softcapping set"):
            token_log_probs(model, ids, torch.ones_like(ids), positions=torch.ones_like(ids))
    finally:
        model.config.final_logit_softcapping = None


class CountingBigram(Bigram):
    """The Bigram that records the batch size of every forward."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        self.batches.append(input_ids.shape[0])
        return super().forward(input_ids, attention_mask, position_ids, use_cache)


def test_identical_rows_go_through_the_model_once():
    # rows 0, 2 and 3 hold the same real tokens and mask (row 3's padding id differs: it does
    # not count); row 1 differs. The model sees 2 rows; every copy gets its row's values,
    # bit-equal to running all 4 (the Bigram treats rows independently).
    ids = torch.tensor([[0, 2, 1, 0], [1, 0, 0, 0], [0, 2, 1, 0], [0, 2, 1, 2]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]])
    model = CountingBigram()
    lp, h = token_log_probs_and_entropy(model, ids, mask)
    assert model.batches == [2]
    all_lp, all_h = token_log_probs_and_entropy(model, ids, mask, unique_rows=False)
    assert model.batches == [2, 4]
    assert torch.equal(lp, all_lp) and torch.equal(h, all_h)
    # log p(2 | 0) = ln 1/2, log p(1 | 2) = ln 1/4 in every copy
    for row in (0, 2, 3):
        assert lp[row].tolist() == pytest.approx([0.0, math.log(1 / 2), math.log(1 / 4), 0.0])


@pytest.mark.parametrize("chunk", [None, 2])
def test_identical_rows_keep_every_copys_gradient(small_policy, chunk):
    """A loss that weighs the copies of a row differently: the gradient with identical rows
    computed once (their upstream gradients summed by the indexing) equals the all-rows one;
    rows equal in tokens but not in ``positions`` are not merged."""
    model, tok = small_policy
    ids, mask, positions = _response_rows(tok)
    ids = torch.cat([ids, ids[:1], ids[:1], ids[:1]])
    mask = torch.cat([mask, mask[:1], mask[:1], mask[:1]])
    positions = torch.cat([positions, positions[:1], positions[:1], positions[:1]])
    positions[4, -3] = False  # the last copy asks for fewer positions: a row of its own
    weights = torch.tensor([1.0, -0.5, 2.0, 3.0, 0.25]).unsqueeze(1)
    results = []
    for unique in (True, False):
        lp, h = token_log_probs_and_entropy(
            model, ids, mask, chunk_size=chunk, positions=positions, unique_rows=unique
        )
        ((lp * weights).sum() + (h * weights).sum()).backward()
        results.append((lp.detach(), h.detach(), [p.grad.clone() for p in model.parameters()]))
        model.zero_grad()
    (lp1, h1, g1), (lp2, h2, g2) = results
    assert torch.allclose(lp1, lp2, atol=1e-6) and torch.allclose(h1, h2, atol=1e-6)
    assert torch.equal(lp1[0], lp1[2]) and torch.equal(lp1[0], lp1[3])
    assert lp1[4, -3] == 0 and lp1[0, -3] < 0
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-6)


@given(st.lists(st.lists(st.integers(0, 2), min_size=3, max_size=3), min_size=1, max_size=12))
def test_distinct_rows_name_the_first_copy_of_each_row(rows):
    from mcgpo.policy.logprobs import _distinct_rows

    ids = torch.tensor(rows)
    mask = (ids != 0).long()  # id 0 is padding here: its value must not matter
    first, inverse = _distinct_rows(torch.where(mask.bool(), ids, 7), mask, None)
    keys = [tuple(r) for r in rows]
    assert first.tolist() == sorted({keys.index(k) for k in keys})  # first copies, in order
    for i, k in enumerate(keys):
        assert keys[first[inverse[i]]] == k
