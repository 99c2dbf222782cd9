"""The KV-cache sampler: pi_old log-probs equal a fresh forward pass, stops, determinism."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mcgpo.policy import token_log_probs
from mcgpo.rollout import TokenBatch, sample


def prompts_of_lengths(tokenizer, lengths):
    """Real prompt ids (BOS + text) cut to different lengths, so the batch is left-padded."""
    text = "Your task is to: count to 4. The counter shows 2. step wait step " * 4
    ids = tokenizer(text)["input_ids"]
    return [ids[:n] for n in lengths]


def draw(model, tok, prompts, seed=0, **kw):
    kw.setdefault("temperature", 1.0)
    kw.setdefault("max_new_tokens", 10)
    kw.setdefault("eos_token_id", tok.eos_token_id)
    return sample(
        model,
        prompts,
        pad_token_id=tok.pad_token_id,
        generator=torch.Generator().manual_seed(seed),
        **kw,
    )


def tempered_log_probs(model, batch, temperature):
    """[R, L] log_softmax(logits / T) of each token by a fresh full forward, by hand (T = 0:
    the logits' own); 0 at position 0."""
    from mcgpo.policy import position_ids

    with torch.no_grad():
        logits = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask,
            position_ids=position_ids(batch.attention_mask),
        ).logits.float()  # fmt: skip
    logp = torch.log_softmax(logits[:, :-1] / (temperature or 1.0), dim=-1)
    out = torch.zeros(batch.input_ids.shape)
    out[:, 1:] = logp.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return out


@pytest.mark.parametrize("sampler", ["dynamic", "static"])
@pytest.mark.parametrize(("temperature", "prefill_rows"), [(1.0, 8), (0.7, 2), (0.0, 1)])
def test_log_probs_are_the_sampling_distributions(
    counter_policy, sampler, temperature, prefill_rows
):
    """The behaviour log-probs log mu of every engine are those of the distribution that drew
    the tokens, log_softmax(logits / T) (issue 43 item 8; vLLM's processed_logprobs is
    tests/rollout/test_vllm_engine.py); at T = 1 (and greedy) the policy's own, pi_old."""
    from mcgpo.rollout.static_decode import SAMPLERS

    model, tok = counter_policy
    # left padding of 29 .. 0 tokens; with prefill_rows < 5 the prompts are prefilled in
    # length-sorted chunks whose caches are re-padded and stacked
    prompts = prompts_of_lengths(tok, [30, 1, 9, 4, 17])
    out = SAMPLERS[sampler](
        model, prompts, temperature=temperature, max_new_tokens=12, prefill_rows=prefill_rows,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    batch = TokenBatch.from_sequences(
        prompts, out.response_ids, out.log_probs, pad_token_id=tok.pad_token_id
    )
    mask = batch.response_mask
    assert mask.sum() == sum(len(r) for r in out.response_ids)
    mu = tempered_log_probs(model, batch, temperature)
    assert torch.allclose(mu[mask], batch.old_log_probs[mask], atol=1e-4, rtol=0)
    assert bool((batch.old_log_probs[mask] <= 0).all())
    with torch.no_grad():
        policy = token_log_probs(model, batch.input_ids, batch.attention_mask)  # T = 1
    gap = (policy[mask] - batch.old_log_probs[mask]).abs().max()
    if temperature in (0.0, 1.0):
        assert gap < 1e-4  # pi_old itself
    else:
        assert gap > 1e-2  # the sampling distribution is not the policy at T = 1


def test_same_seed_same_samples_other_seed_other_samples(counter_policy):
    model, tok = counter_policy
    prompts = prompts_of_lengths(tok, [3, 8, 8, 20]) * 4
    a = draw(model, tok, prompts, seed=7)
    b = draw(model, tok, prompts, seed=7)
    c = draw(model, tok, prompts, seed=8)
    assert a == b
    assert a.response_ids != c.response_ids


def test_shared_prompts_and_prefill_chunks_do_not_change_the_result(counter_policy):
    model, tok = counter_policy
    # duplicates (prefilled once, cache copied) and chunked prefill vs one pass per prompt
    prompts = prompts_of_lengths(tok, [7, 20, 7, 3, 20, 7, 12])
    greedy = {"temperature": 0.0, "max_new_tokens": 6, "eos_token_id": [-1]}
    ref = [draw(model, tok, [p], **greedy) for p in prompts]
    for rows in (1, 2, 3, 8):
        out = draw(model, tok, prompts, prefill_rows=rows, **greedy)
        for i, solo in enumerate(ref):
            assert out.response_ids[i] == solo.response_ids[0]
            assert out.log_probs[i] == pytest.approx(solo.log_probs[0], abs=1e-5)
    assert out.response_ids[0] == out.response_ids[2] == out.response_ids[5]


def test_greedy_matches_transformers_generate(counter_policy):
    model, tok = counter_policy
    prompts = prompts_of_lengths(tok, [5, 12, 21])
    ours = draw(model, tok, prompts, temperature=0.0, max_new_tokens=8, eos_token_id=[-1])
    for prompt, response in zip(prompts, ours.response_ids):
        ids = torch.tensor([prompt])
        ref = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=8,
            min_new_tokens=8,
            pad_token_id=tok.pad_token_id,
        )
        assert response == ref[0, len(prompt) :].tolist()


def test_finished_rows_leave_the_batch_without_changing_the_others(counter_policy):
    model, tok = counter_policy
    prompts = prompts_of_lengths(tok, [2, 6, 11, 19, 25])
    free = draw(model, tok, prompts, temperature=0.0, max_new_tokens=10, eos_token_id=[-1])
    # make the greedy token at step 3 of row 0 an EOS: row 0 (and any row that emits it)
    # finishes early, the batch shrinks, and every row must still equal its solo run
    eos = free.response_ids[0][2]
    batched = draw(model, tok, prompts, temperature=0.0, max_new_tokens=10, eos_token_id=eos)
    for i, prompt in enumerate(prompts):
        solo = draw(model, tok, [prompt], temperature=0.0, max_new_tokens=10, eos_token_id=eos)
        assert batched.response_ids[i] == solo.response_ids[0]
        assert batched.log_probs[i] == pytest.approx(solo.log_probs[0], abs=1e-4)
        expected = free.response_ids[i]
        stop = expected.index(eos) + 1 if eos in expected else len(expected)
        assert batched.response_ids[i] == expected[:stop]  # EOS kept, nothing after it
    assert len(batched.response_ids[0]) == free.response_ids[0].index(eos) + 1 <= 3


def test_stop_string_ends_the_response_at_the_token_that_completes_it(counter_policy):
    model, tok = counter_policy
    prompt = prompts_of_lengths(tok, [15])
    free = draw(model, tok, prompt, temperature=0.0, max_new_tokens=10, eos_token_id=[-1])
    ids = free.response_ids[0]
    pieces = [tok.decode([t]) for t in ids]
    k = next(i for i, p in enumerate(pieces) if p.strip())  # first token with visible text
    stop = pieces[k].strip()
    first = next(i for i in range(len(ids)) if stop in "".join(pieces[: i + 1]))
    out = draw(
        model, tok, prompt, temperature=0.0, max_new_tokens=10, eos_token_id=[-1],
        stop_strings=[stop], tokenizer=tok,
    )  # fmt: skip
    assert out.response_ids[0] == ids[: first + 1]


def test_max_new_tokens_and_empty_batch(counter_policy):
    model, tok = counter_policy
    out = draw(model, tok, prompts_of_lengths(tok, [4, 9]), max_new_tokens=3, eos_token_id=[-1])
    assert [len(r) for r in out.response_ids] == [3, 3]
    assert draw(model, tok, []) == ([], [])


def test_model_mode_is_restored(counter_policy):
    model, tok = counter_policy
    model.train()
    draw(model, tok, prompts_of_lengths(tok, [4]), max_new_tokens=2)
    assert model.training
    model.eval()


def test_bad_arguments_are_rejected(counter_policy):
    model, tok = counter_policy
    p = prompts_of_lengths(tok, [4])
    with pytest.raises(ValueError, match="temperature must be >= 0, got -1"):
        draw(model, tok, p, temperature=-1)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1, got 0"):
        draw(model, tok, p, max_new_tokens=0)
    with pytest.raises(ValueError, match="stop_strings need a tokenizer"):
        draw(model, tok, p, stop_strings=["\n"])
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        draw(model, tok, [p[0], []])
    with pytest.raises(ValueError, match="prefill_rows must be >= 1, got 0"):
        draw(model, tok, p, prefill_rows=0)
    with pytest.raises(ValueError, match="eos_token_id is empty"):
        draw(model, tok, p, eos_token_id=[])


# -- one generator per row ---------------------------------------------------------------


def row_draw(model, tok, prompts, seeds, **kw):
    """Sample with one generator per row, row i's seeded with ``seeds[i]``."""
    kw.setdefault("temperature", 1.0)
    kw.setdefault("max_new_tokens", 8)
    kw.setdefault("eos_token_id", tok.eos_token_id)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    return sample(model, prompts, pad_token_id=tok.pad_token_id, generator=gens, **kw)


def testinverse_cdf_golden_values():
    from mcgpo.rollout.sampler import inverse_cdf

    # p = [0.2, 0, 0.5, 0.3]: cdf = [0.2, 0.2, 0.7, 1.0]; the token is the first k with
    # cdf[k] > u, so u in [0, 0.2) -> 0, [0.2, 0.7) -> 2 (token 1 has p = 0: never), rest -> 3
    p = torch.tensor([[0.2, 0.0, 0.5, 0.3]] * 6)
    u = torch.tensor([0.0, 0.1999, 0.2, 0.6999, 0.7, 0.99999])
    assert inverse_cdf(p, u).tolist() == [0, 0, 2, 2, 3, 3]
    # unnormalised rows are scaled by their sum: p = [1, 1, 2] -> cdf/4 = [0.25, 0.5, 1]
    q = torch.tensor([[1.0, 1.0, 2.0]] * 3)
    assert inverse_cdf(q, torch.tensor([0.24, 0.25, 0.5])).tolist() == [0, 1, 2]


def testinverse_cdf_draws_follow_the_distribution():
    from mcgpo.rollout.sampler import inverse_cdf

    p = torch.tensor([0.1, 0.0, 0.6, 0.25, 0.05])
    n = 40_000
    u = torch.rand(n, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(inverse_cdf(p.expand(n, -1), u), minlength=5).double() / n
    # binomial SD of a share is at most sqrt(0.25 / 40000) = 0.0025; 4 SD = 0.01
    assert torch.allclose(counts, p.double(), atol=0.01, rtol=0)
    assert counts[1] == 0


@settings(max_examples=12, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=6), st.booleans())
def test_a_row_draws_the_same_alone_or_in_any_batch(counter_policy, picks, early_stop):
    """Row i (prompt i, generator seeded 100 + i) samples the same tokens whatever rows share
    its batch, duplicates included; with ``early_stop`` an EOS id the policy emits ends some
    rows early, and the other rows' streams do not move."""
    model, tok = counter_policy
    pool = prompts_of_lengths(tok, [3, 9, 14, 20, 26, 31])
    eos = [-1]
    if early_stop:  # the second token of prompt 0's own stream
        eos = [row_draw(model, tok, [pool[0]], [100], eos_token_id=[-1]).response_ids[0][1]]
    batch = row_draw(
        model, tok, [pool[i] for i in picks], [100 + i for i in picks], eos_token_id=eos
    )
    if early_stop and 0 in picks:
        assert len(batch.response_ids[picks.index(0)]) <= 2  # it did stop early
    for j, i in enumerate(picks):
        solo = row_draw(model, tok, [pool[i]], [100 + i], eos_token_id=eos)
        assert batch.response_ids[j] == solo.response_ids[0]
        assert batch.log_probs[j] == pytest.approx(solo.log_probs[0], abs=1e-5)


def test_row_generators_seeds_matter_and_greedy_ignores_them(counter_policy):
    model, tok = counter_policy
    prompts = prompts_of_lengths(tok, [5, 5, 5, 5, 12, 12, 12, 12])
    a = row_draw(model, tok, prompts, range(8), eos_token_id=[-1])
    assert a == row_draw(model, tok, prompts, range(8), eos_token_id=[-1])
    assert len({tuple(r) for r in a.response_ids}) > 2  # rows sharing a prompt still differ
    b = row_draw(model, tok, prompts, range(8, 16), eos_token_id=[-1])
    assert a.response_ids != b.response_ids
    greedy = {"temperature": 0.0, "eos_token_id": [-1]}
    assert row_draw(model, tok, prompts, range(8), **greedy) == draw(
        model, tok, prompts, max_new_tokens=8, **greedy
    )


def test_a_generator_per_row_needs_one_per_prompt(counter_policy):
    model, tok = counter_policy
    with pytest.raises(ValueError, match="generator: 1 generators for 2 prompts"):
        row_draw(model, tok, prompts_of_lengths(tok, [4, 6]), [0])
