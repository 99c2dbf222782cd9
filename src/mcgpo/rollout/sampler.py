"""Batched KV-cache sampling that returns the log-probs of the sampled tokens (pi_old).

One prefill pass over the distinct left-padded prompts (siblings that share a prompt share
its prefill), then one single-token pass per new token with
the key/value cache. Position ids are ``cumsum(mask) - 1`` (the rule of
:func:`mcgpo.policy.position_ids`), so a left-padded row sees exactly the positions it would
see alone, and the trainer's forward pass over the right-padded ``prompt + response`` row
reproduces the same log-probs.

Log-probs, stated exactly: a token is *drawn* from ``softmax(logits / temperature)``
(greedy argmax when ``temperature == 0``), and the log-prob returned for it is that of the
distribution that drew it, ``log_softmax(logits / temperature)[token]`` (``temperature ==
0``: ``log_softmax(logits)[token]``, the policy at temperature 1). These are the behaviour
log-probs log mu of the rollout correction (:mod:`mcgpo.objectives.correction`), the same
for every engine (vLLM's ``processed_logprobs``; verl's convention too). At temperature 1
they are also the policy's own log-probs, the pi_old of the PPO ratio, and reusing them
saves the training forward that verl runs after sampling; at any other temperature pi_old
(the policy at temperature 1, what the update differentiates) comes from that forward
(``train.old_logprobs``).

A row stops at the first EOS (kept in the response, with its log-prob, so the policy learns
to stop), at the first token that completes a stop string (kept; the text after the stop
string inside that token is kept too), or after ``max_new_tokens``. Finished rows are dropped
from the batch and from the cache, so the remaining rows run faster.

Determinism: given the same model, prompts and generator state(s) the output is the same.
Two ways to draw at ``temperature > 0``:

- ``generator`` one ``torch.Generator`` (or None): one ``torch.multinomial`` call per step
  for the whole batch, so a row's tokens depend on which other rows share the batch;
- ``generator`` a sequence of generators, one per prompt: **each row draws from its own**.
  At the start of the call row i takes ``max_new_tokens`` uniforms ``u[i, :]`` from its
  generator (one ``torch.rand`` call, on that generator's device, whether or not the row
  uses them all), and at step t its token is the inverse CDF of its own distribution at
  ``u[i, t]``: the first token k with ``cumsum(p)[k] > u[i, t] * sum(p)``, ``p =
  softmax(logits / T)`` (so a token of probability 0 is never drawn). A row's tokens then
  depend on its prompt, its generator and the model only: the same alone or in any batch,
  and a row that finishes early shifts no other row's stream. (The logits of a row can
  differ in the last float bits between batch compositions, as in any batched forward pass;
  a draw changes only if its uniform lies within that rounding of a CDF step.)

Greedy (``temperature == 0``) ignores the generators.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import torch

from mcgpo.policy.logprobs import position_ids

__all__ = ["Samples", "inverse_cdf", "row_uniforms", "sample", "sampling_log_probs"]


class Samples(NamedTuple):
    """What :func:`sample` returns, one entry per prompt, in prompt order."""

    response_ids: list[list[int]]  # sampled token ids (EOS / stop tokens included)
    # log mu(token | prefix) of the sampling distribution (temperature T; T = 0: 1)
    log_probs: list[list[float]]


def _cache_keyword(model: Any) -> str:
    """transformers >= 5.2x calls the KV cache argument ``cache``; older ones ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@torch.inference_mode()
def sample(
    model: Any,
    prompts_ids: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    max_new_tokens: int = 32,
    eos_token_id: int | Iterable[int],
    pad_token_id: int | None = None,
    stop_strings: Sequence[str] = (),
    tokenizer: Any = None,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    prefill_rows: int = 8,
) -> Samples:
    """Sample one response per prompt; see the module docstring for the exact semantics.

    Args:
        model: a Hugging Face causal LM (any device; inputs follow ``model.device``).
        prompts_ids: token ids of each prompt (different lengths are left-padded).
        temperature: sampling temperature; 0 means greedy.
        max_new_tokens: the most tokens sampled per response.
        eos_token_id: one id or several ids that end a response.
        pad_token_id: id used for left padding (default: the first EOS id); never attended.
        stop_strings: texts that end a response once the decoded response contains one
            (e.g. ``"</action>"``, ``"\\n"``); need ``tokenizer``.
        tokenizer: decodes sampled tokens for the stop-string check.
        generator: one torch generator for the whole batch (on the model's device), or one
            generator per prompt, each row then drawn from its own (module docstring).
        prefill_rows: distinct prompts per prefill pass (sorted by length, see
            ``_prefill``); a speed knob only, results agree to float rounding.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if prefill_rows < 1:
        raise ValueError(f"prefill_rows must be >= 1, got {prefill_rows}")
    if stop_strings and tokenizer is None:
        raise ValueError("stop_strings need a tokenizer to decode the sampled tokens")
    eos = {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(e) for e in eos_token_id}
    if not eos:
        raise ValueError("eos_token_id is empty")
    n = len(prompts_ids)
    if n == 0:
        return Samples([], [])
    for i, p in enumerate(prompts_ids):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty")
    if generator is not None and not isinstance(generator, torch.Generator):
        generator = list(generator)
        if len(generator) != n:
            raise ValueError(f"generator: {len(generator)} generators for {n} prompts")
    pad = min(eos) if pad_token_id is None else int(pad_token_id)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        return _sample(
            model, prompts_ids, temperature, max_new_tokens, eos, pad, stop_strings, tokenizer,
            generator, device, prefill_rows,
        )  # fmt: skip
    finally:
        model.train(was_training)


def _left_pad(
    prompts: Sequence[Sequence[int]], width: int, pad: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def _forward_prompts(
    model: Any, prompts: Sequence[Sequence[int]], width: int, pad: int, device: torch.device,
    cache_kw: str,
) -> tuple[Any, torch.Tensor]:  # fmt: skip
    """One left-padded prefill pass; returns (cache, last-position logits [b, V] float32)."""
    from transformers import DynamicCache

    ids, mask = _left_pad(prompts, width, pad, device)
    cache = DynamicCache()
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=True,
        logits_to_keep=1, **{cache_kw: cache},
    )  # fmt: skip
    return cache, out.logits[:, -1].float()


def _plain_layers(cache: Any) -> bool:
    """True if every cache layer is a plain full-attention DynamicLayer (safe to re-pad)."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return False
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _prefill(
    model: Any,
    prompts_ids: Sequence[Sequence[int]],
    pad: int,
    device: torch.device,
    cache_kw: str,
    chunk_rows: int,
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefill every *distinct* prompt once, in length-sorted chunks; expand to the rows.

    - Siblings of a group rollout share their first prompt (often later ones too): each
      distinct prompt is run once and its cache rows are copied to the rows that use it.
    - Distinct prompts are sorted by length and run ``chunk_rows`` at a time, so little
      compute goes to padding; the chunk caches are then left-padded with zeros (masked,
      never attended) to the longest prompt and stacked into one cache. Models whose cache
      is not plain full attention (sliding windows, ...) get one unchunked pass instead.

    Returns (cache, last logits [B, V] float32, attention mask [B, W], next position [B]).
    """
    from transformers import DynamicCache

    first: dict[tuple[int, ...], int] = {}
    owner = [first.setdefault(tuple(p), len(first)) for p in prompts_ids]
    unique = list(first)
    width = max(len(p) for p in unique)
    order = sorted(range(len(unique)), key=lambda i: len(unique[i]))
    chunks = [order[k : k + chunk_rows] for k in range(0, len(order), chunk_rows)]
    cache, logits = None, None
    if len(chunks) > 1:
        parts = []
        for chunk in chunks:
            ps = [unique[i] for i in chunk]
            part_cache, part_logits = _forward_prompts(
                model, ps, max(len(p) for p in ps), pad, device, cache_kw
            )
            if not _plain_layers(part_cache):
                break
            parts.append((part_cache, part_logits))
        else:
            back = torch.empty(len(order), dtype=torch.long)
            back[torch.tensor(order)] = torch.arange(len(order))  # sorted position of prompt i
            back = back.to(device)
            logits = torch.cat([lg for _, lg in parts])[back]
            cache = DynamicCache()
            for layer in range(len(parts[0][0].layers)):
                keys, values = [], []
                for part_cache, _ in parts:
                    k, v = part_cache.layers[layer].keys, part_cache.layers[layer].values
                    shift = width - k.shape[-2]
                    keys.append(torch.nn.functional.pad(k, (0, 0, shift, 0)))
                    values.append(torch.nn.functional.pad(v, (0, 0, shift, 0)))
                cache.update(torch.cat(keys)[back], torch.cat(values)[back], layer)
    if cache is None:
        cache, logits = _forward_prompts(model, unique, width, pad, device, cache_kw)
    _, mask = _left_pad(unique, width, pad, device)
    next_pos = mask.sum(1)  # position of the token about to be sampled = prompt length
    if len(unique) < len(owner):
        index = torch.tensor(owner, device=device)
        cache.batch_select_indices(index)  # repeated indices copy a shared prompt's cache
        logits, mask, next_pos = logits[index], mask[index], next_pos[index]
    return cache, logits, mask, next_pos


def _sample(
    model: Any,
    prompts_ids: Sequence[Sequence[int]],
    temperature: float,
    max_new_tokens: int,
    eos: set[int],
    pad: int,
    stops: Sequence[str],
    tokenizer: Any,
    generator: torch.Generator | list[torch.Generator] | None,
    device: torch.device,
    prefill_rows: int,
) -> Samples:
    n = len(prompts_ids)
    cache_kw = _cache_keyword(model)
    cache, logits, mask, next_pos = _prefill(
        model, prompts_ids, pad, device, cache_kw, prefill_rows
    )
    rows = list(range(n))  # original index of each row still sampling
    responses: list[list[int]] = [[] for _ in range(n)]
    log_probs: list[list[float]] = [[] for _ in range(n)]
    tails = [""] * n  # decoded tail of each response, long enough to catch a stop string
    keep_chars = max((len(s) for s in stops), default=0)
    pieces: dict[int, str] = {}
    eos_tensor = torch.tensor(sorted(eos), device=device)
    uniforms = None  # [rows, max_new_tokens]: each row's own draws (a generator per row)
    if isinstance(generator, list) and temperature > 0:
        uniforms = row_uniforms(generator, max_new_tokens, device)
    for step in range(max_new_tokens):
        logp = sampling_log_probs(logits, temperature)
        if temperature == 0:
            token = logits.argmax(-1)
        elif uniforms is not None:
            token = inverse_cdf(torch.softmax(logits / temperature, dim=-1), uniforms[:, step])
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        chosen = logp.gather(1, token[:, None]).squeeze(1)
        finished = torch.isin(token, eos_tensor)
        token_list, lp_list = token.tolist(), chosen.tolist()
        done = finished.tolist()
        for j, r in enumerate(rows):
            responses[r].append(token_list[j])
            log_probs[r].append(lp_list[j])
            if stops and not done[j]:
                t = token_list[j]
                if t not in pieces:
                    pieces[t] = tokenizer.decode([t])
                text = tails[r] + pieces[t]
                if any(s in text for s in stops):
                    done[j] = True
                tails[r] = text[-keep_chars:]
        if step == max_new_tokens - 1:
            break
        keep = [j for j, d in enumerate(done) if not d]
        if not keep:
            break
        if len(keep) < len(rows):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            mask, next_pos, token = mask[index], next_pos[index], token[index]
            uniforms = None if uniforms is None else uniforms[index]
            rows = [rows[j] for j in keep]
        mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
        out = model(
            input_ids=token[:, None], attention_mask=mask, position_ids=next_pos[:, None],
            use_cache=True, **{cache_kw: cache},
        )  # fmt: skip
        logits = out.logits[:, -1].float()
        next_pos = next_pos + 1
    return Samples(responses, log_probs)


def sampling_log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log_softmax(logits / temperature)``, the log-probs of the distribution a token is
    drawn from (``temperature`` 0, greedy: the logits' own, temperature 1)."""
    if temperature in (0, 1):
        return torch.log_softmax(logits, dim=-1)
    return torch.log_softmax(logits / temperature, dim=-1)


def row_uniforms(
    generators: list[torch.Generator], steps: int, device: torch.device
) -> torch.Tensor:
    """``steps`` uniforms in [0, 1) from each row's generator (drawn on the generator's own
    device), stacked as [rows, steps] float32 on ``device``."""
    return torch.stack(
        [torch.rand(steps, generator=g, device=g.device).to(device) for g in generators]
    )


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Row i's token: the first k with ``cumsum(probs[i])[k] > u[i] * sum(probs[i])`` [b]."""
    cdf = probs.cumsum(-1)
    target = (u * cdf[:, -1]).unsqueeze(1).contiguous()
    token = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return token.clamp_(max=probs.shape[-1] - 1)
