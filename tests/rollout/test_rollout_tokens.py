"""TokenBatch: right-padded collation, masks, row selection, broadcasting, bad input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from mcgpo.rollout import TokenBatch, TokenBatchError

PAD = 0


def small_batch() -> TokenBatch:
    # row 0: prompt [5, 6, 7], response [8, 9]   -> length 5
    # row 1: prompt [5],       response [4]      -> length 2
    # row 2: prompt [5, 6],    response [9, 9, 3] -> length 5
    return TokenBatch.from_sequences(
        [[5, 6, 7], [5], [5, 6]],
        [[8, 9], [4], [9, 9, 3]],
        [[-0.5, -1.0], [-2.0], [-0.1, -0.2, -0.3]],
        pad_token_id=PAD,
    )


def test_golden_collation():
    tb = small_batch()
    assert tb.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 4, 0, 0, 0], [5, 6, 9, 9, 3]]
    assert tb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert tb.response_mask.tolist() == [
        [False, False, False, True, True],
        [False, True, False, False, False],
        [False, False, True, True, True],
    ]
    expected = [[0, 0, 0, -0.5, -1.0], [0, -2.0, 0, 0, 0], [0, 0, -0.1, -0.2, -0.3]]
    assert torch.allclose(tb.old_log_probs, torch.tensor(expected))
    assert tb.sequence_lengths().tolist() == [5, 2, 5]
    assert tb.response_lengths().tolist() == [2, 1, 3]
    assert len(tb) == 3


def test_select_keeps_order_and_trims_padding_columns():
    tb = small_batch()
    sub = tb.select([1])
    assert sub.input_ids.tolist() == [[5, 4]]  # the three all-padding columns are dropped
    sub = tb.select(np.array([2, 1]))
    assert sub.input_ids.tolist() == [[5, 6, 9, 9, 3], [5, 4, 0, 0, 0]]
    mask = torch.tensor([True, False, True])
    assert torch.equal(tb.select(mask).input_ids, tb.input_ids[[0, 2]])
    assert len(tb.select(np.array([], dtype=np.int64))) == 0
    with pytest.raises(TokenBatchError, match=r"boolean index has shape \(2,\), expected \(3,\)"):
        tb.select(np.array([True, False]))


def test_per_token_broadcasts_row_values_onto_response_tokens_only():
    tb = small_batch()
    out = tb.per_token(np.array([1.0, -2.0, 0.5]))
    assert out.tolist() == [[0, 0, 0, 1, 1], [0, -2, 0, 0, 0], [0, 0, 0.5, 0.5, 0.5]]
    with pytest.raises(TokenBatchError, match="per_token expects 3 values, got shape"):
        tb.per_token(np.zeros(2))


def test_to_device_returns_an_equal_batch():
    tb = small_batch().to("cpu")
    assert tb.device == torch.device("cpu")
    assert torch.equal(tb.input_ids, small_batch().input_ids)


def test_bad_input_names_the_problem():
    with pytest.raises(TokenBatchError, match="row 1: 2 response tokens but 1 log-probs"):
        TokenBatch.from_sequences([[1], [1]], [[2], [2, 3]], [[0.0], [0.0]], pad_token_id=0)
    with pytest.raises(TokenBatchError, match="row 0: empty prompt"):
        TokenBatch.from_sequences([[]], [[2]], [[0.0]], pad_token_id=0)
    with pytest.raises(TokenBatchError, match="differ in length: 2, 1, 1"):
        TokenBatch.from_sequences([[1], [1]], [[2]], [[0.0]], pad_token_id=0)
    tb = small_batch()
    with pytest.raises(TokenBatchError, match=r"old_log_probs has dtype torch\.float64"):
        TokenBatch(tb.input_ids, tb.attention_mask, tb.response_mask, tb.old_log_probs.double())
    with pytest.raises(TokenBatchError, match=r"attention_mask has shape \(3, 4\)"):
        TokenBatch(tb.input_ids, tb.attention_mask[:, :4], tb.response_mask, tb.old_log_probs)
    bad = tb.response_mask.clone()
    bad[1, 4] = True  # a padding position of row 1
    with pytest.raises(TokenBatchError, match="row 1: response_mask is True on a padding"):
        TokenBatch(tb.input_ids, tb.attention_mask, bad, tb.old_log_probs)


def test_concatenate_pads_to_the_widest_and_keeps_every_row():
    a = TokenBatch.from_sequences([[5, 6]], [[7]], [[-0.5]], pad_token_id=9)  # width 3
    b = TokenBatch.from_sequences(
        [[1], [2, 3, 4]], [[8], [8, 8]], [[-1.0], [-2.0, -3.0]], pad_token_id=9
    )
    both = TokenBatch.concatenate([a, b])
    assert both.input_ids.tolist() == [[5, 6, 7, 0, 0], [1, 8, 9, 9, 9], [2, 3, 4, 8, 8]]
    assert both.attention_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert both.response_mask.tolist() == [
        [False, False, True, False, False],
        [False, True, False, False, False],
        [False, False, False, True, True],
    ]
    assert both.old_log_probs[2, 3:].tolist() == [-2.0, -3.0]
    for i, part in enumerate([a.select([0]), b.select([0]), b.select([1])]):
        row = both.select([i])  # the same real tokens, masks and log-probs as before
        real = row.attention_mask.bool()
        assert torch.equal(row.input_ids[real], part.input_ids[part.attention_mask.bool()])
        assert torch.equal(row.response_mask, part.response_mask)
        assert torch.equal(row.old_log_probs, part.old_log_probs)
    empty = TokenBatch.concatenate([])
    assert len(empty) == 0 and len(TokenBatch.concatenate([a, empty.select([])])) == 1


def test_behaviour_log_probs_are_the_samplers_and_survive_a_new_pi_old():
    tb = small_batch()
    # as collected, mu = pi_old: the same tensor (nothing extra to carry)
    assert tb.behaviour_log_probs is tb.old_log_probs
    assert tb.select([2, 0]).behaviour_log_probs is not None
    # the update replaces pi_old by a training forward (mcgpo.training.old_logprobs);
    # the sampler's log-probs stay in behaviour_log_probs, through select, to, concatenate
    fresh = tb.old_log_probs - 0.25 * tb.response_mask
    new = dataclasses.replace(tb, old_log_probs=fresh)
    assert torch.equal(new.behaviour_log_probs, tb.old_log_probs)
    assert torch.equal(new.old_log_probs, fresh)
    sub = new.select([2, 0])
    assert torch.equal(sub.behaviour_log_probs, tb.old_log_probs[[2, 0]])
    assert torch.equal(sub.old_log_probs, fresh[[2, 0]])
    assert torch.equal(new.to("cpu").behaviour_log_probs, tb.old_log_probs)
    # concatenating a batch with its own mu and one whose mu is pi_old keeps each row's
    both = TokenBatch.concatenate([new.select([1]), tb.select([0])])
    assert both.behaviour_log_probs.tolist() == [[0, -2.0, 0, 0, 0], [0, 0, 0, -0.5, -1.0]]
    assert both.old_log_probs[0, 1].item() == -2.25
    with pytest.raises(TokenBatchError, match=r"behaviour_log_probs has shape \(3, 4\)"):
        TokenBatch(*(getattr(tb, k) for k in FIELDS), tb.old_log_probs[:, :4])
    with pytest.raises(TokenBatchError, match=r"behaviour_log_probs has dtype torch\.float64"):
        TokenBatch(*(getattr(tb, k) for k in FIELDS), tb.old_log_probs.double())


FIELDS = ("input_ids", "attention_mask", "response_mask", "old_log_probs")
