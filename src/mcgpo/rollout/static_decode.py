"""The static-cache sampler: :func:`sample`'s results with fixed shapes, for CUDA graphs.

:func:`sample_static` returns what :func:`mcgpo.rollout.sample` returns (the same
:class:`~mcgpo.rollout.Samples`: response ids with the EOS / stop token, their log-probs under
the sampling distribution, the same stopping rules), computed another way:

- **Static cache.** The prompts are prefilled (each distinct prompt once, in length-sorted
  chunks of ``prefill_rows``, as the dynamic sampler does) and copied into a preallocated
  ``transformers.StaticCache`` of ``B x L`` slots (B rows rounded up to a power of two, L =
  prompt width + ``max_new_tokens`` rounded up to 256), left-aligned so that every row writes
  its next token to the same column. Nothing is reallocated while decoding, so the
  single-token decode step has fixed shapes within a call and can be compiled with
  ``torch.compile(mode="reduce-overhead")`` (CUDA graphs on a GPU; ``compile=None`` compiles
  on CUDA only). One static cache is kept per model, for its last shape.
- **Compiled graphs, bounded.** The step is compiled once, with dynamic shapes
  (``dynamic=True``): the cache length and the attended columns (the length buckets below)
  are symbols, so one graph serves every length and bucket of a row count. The row count
  (a power of two) is not: the static cache's tensors fix it, so a call with another row
  count compiles one more graph (at most ``log2(rows) + 1``, 8 for 128 rows); a graph is
  never specialised to a bucket (the cache holds ``_SLACK`` columns past the last one, so
  the attended columns are always a strict prefix). Compiled with ``dynamic=False`` (as
  before issue 43), every (rows, length, bucket) was a graph, dynamo's ``recompile_limit``
  (8 per code object) was met within one rollout of the paper presets (5,120 + 512 tokens:
  22 buckets), and the step then ran eagerly, with one warning. The step runs under a
  limit of ``RECOMPILE_LIMIT`` graphs (the step and its compiled form:
  :mod:`mcgpo.rollout.decode_step`, whose ``decode_compile_stats`` counts them
  (``rollout/compile_graphs``) and says whether the limit was reached,
  ``rollout/compile_limit_hit``). With CUDA graphs each new (rows, length, bucket) is still
  one CUDA-graph capture (no compile).
- **All rows run every step.** Finished rows are not dropped (that would change the shapes);
  a done mask on the device records each row's end. EOS and stop strings are checked on the
  device: each stop string is a KMP automaton over characters, run over every token's decoded
  piece once per (tokenizer, stop strings, vocabulary), giving per-token state transition
  tables that the step indexes (:func:`stop_tables`). The host reads the done mask only every
  ``sync_every`` steps (one device sync) and at the end.
- **Under autocast** (``train.precision bf16-mixed``) the sampler runs on a copy of the
  weights in autocast's dtype, without autocast (:mod:`mcgpo.rollout.sampling_weights`).
- **Decode attention** (``decode_attention``). ``"gqa"`` (default): for the call the model
  runs :mod:`mcgpo.rollout.decode_attention`, whose single-token steps never copy K/V per
  query head and attend to the filled cache columns rounded up to a multiple of 256 (a
  length bucket; one compiled step per bucket); the prefill is transformers' sdpa, unchanged.
  ``"sdpa"``: transformers' own attention over all columns.

Draws. With one shared generator a token is ``argmax(softmax(logits / T) / q)`` with
``q ~ Exp(1)`` per vocabulary entry, which is exactly what ``torch.multinomial(p, 1,
generator=g)`` computes from the same generator state (its one-sample path), so the draws
equal the dynamic sampler's *while every row is live*; afterwards they differ, because the
dynamic sampler draws only for live rows. With a list of generators (one per prompt row, what
``collect`` passes) each row's draws follow the dynamic sampler's own rule exactly
(:func:`mcgpo.rollout.sampler.row_uniforms` and :func:`~mcgpo.rollout.sampler.inverse_cdf`:
``max_new_tokens`` uniforms per row at the start of the call, inverse CDF per step), so a row's
tokens depend neither on the other rows nor on the sampler chosen.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from typing import Any, NamedTuple

import torch

from mcgpo.policy.logprobs import position_ids
from mcgpo.rollout.decode_attention import DECODE_ATTENTIONS, use_decode_attention
from mcgpo.rollout.decode_step import compiled_step, eager_step, step_limits
from mcgpo.rollout.sampler import (
    Samples,
    inverse_cdf,
    row_uniforms,
    sample,
    sampling_log_probs,
)
from mcgpo.rollout.sampling_weights import sampling_model
from mcgpo.rollout.stop_tables import stop_tables

__all__ = ["SAMPLERS", "sample_static"]

_LEN_BUCKET = 256  # cache length rounded up to a multiple of this (fewer reallocations)
_COLUMN_BUCKET = 256  # gqa: a step attends to the filled columns rounded up to a multiple
# cache columns past the rounded length: the attended columns never equal the cache's length,
# which would specialise a graph to the last bucket (a contiguity guard)
_SLACK = 8


def _columns(filled: int, length: int) -> int:
    """The cache columns a single-token step attends to when ``filled`` are in use: a
    multiple of ``_COLUMN_BUCKET`` (so a call compiles at most one step per bucket), at most
    the cache ``length``. The columns past ``filled`` are masked, so the result is that of
    all ``length`` columns up to the rounding of a shorter sum (docs/rollout.md)."""
    return min(length, -(-filled // _COLUMN_BUCKET) * _COLUMN_BUCKET)


def _pick(
    logits: torch.Tensor, temperature: float, draws: _Draws | None, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [B], its log-prob under the sampling distribution [B]) of one decode step."""
    logp = sampling_log_probs(logits, temperature)
    if temperature == 0 or draws is None:
        token = logits.argmax(-1)
    elif draws.uniforms is not None:  # per-row generators: the dynamic sampler's rule
        token = inverse_cdf(torch.softmax(logits / temperature, dim=-1), draws.uniforms[:, step])
    else:  # one shared generator: multinomial's one-sample rule
        token = (torch.softmax(logits / temperature, dim=-1) / draws.noise()).argmax(-1)
    return token, logp.gather(1, token[:, None]).squeeze(1)


class _Draws:
    """The randomness of the decode loop.

    Per-row generators: every row's ``max_new`` uniforms, drawn once at the start (rows past
    the prompts get zeros), so nothing depends on when the host learns that a row ended.
    Shared generator (or None): one ``[live, V]`` Exp(1) draw per step for the rows the host
    knows to be live, as ``multinomial`` on the live rows draws.
    """

    def __init__(
        self, generator: Any, n: int, rows: int, vocab: int, max_new: int, device: torch.device
    ):
        self.generator, self.n, self.rows, self.vocab, self.device = (
            generator, n, rows, vocab, device
        )  # fmt: skip
        self.live = list(range(n))
        self.uniforms: torch.Tensor | None = None
        if isinstance(generator, Sequence):
            u = torch.zeros((rows, max_new), device=device)
            if n:
                u[:n] = row_uniforms(list(generator), max_new, device)
            self.uniforms = u

    def noise(self) -> torch.Tensor:
        noise = torch.ones((self.rows, self.vocab), device=self.device)
        if self.live:
            drawn = torch.empty((len(self.live), self.vocab), device=self.device)
            drawn.exponential_(1, generator=self.generator)
            if len(self.live) == self.rows:
                return drawn
            noise[torch.tensor(self.live, device=self.device)] = drawn
        return noise

    def sync(self, done: list[bool]) -> None:
        """Drop the rows the host now knows to have ended (shared generator only)."""
        self.live = [r for r in self.live if not done[r]]


def _set_length(cache: Any, width: int) -> None:
    """Mark ``width`` columns of every static layer as filled (transformers 5.x)."""
    for layer in getattr(cache, "layers", ()):
        if getattr(layer, "is_sliding", False):
            raise ValueError("the static sampler supports full-attention models only")
        if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
            layer.cumulative_length.fill_(width)


def _decode(
    run: _Run, temperature: float, max_new: int, eos: set[int], stops: Sequence[str],
    tokenizer: Any, generator: Any, sync_every: int,
) -> Samples:  # fmt: skip
    """The decode loop: every row every step, ends on the device, a host read every k steps."""
    rows, n, device = run.rows, run.n, run.device
    logits = run.logits
    vocab = logits.shape[-1]
    cache = run.compiled.cache
    _set_length(cache, run.width)
    tokens = torch.zeros((rows, max_new), dtype=torch.long, device=device)
    logps = torch.zeros((rows, max_new), dtype=torch.float32, device=device)
    length = torch.full((rows,), max_new, dtype=torch.long, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    done[n:] = True
    eos_tensor = torch.tensor(sorted(eos), device=device)
    tables = stop_tables(tokenizer, stops, vocab, device) if stops else None
    states = [torch.zeros(rows, dtype=torch.long, device=device) for _ in stops]
    draws = _Draws(generator, n, rows, vocab, max_new, device) if temperature > 0 else None
    steps = 0
    for t in range(max_new):
        token, lp = _pick(logits, temperature, draws, t)
        tokens[:, t], logps[:, t] = token, lp
        ended = torch.isin(token, eos_tensor)
        if tables is not None:
            for s, state in enumerate(states):
                ended |= tables.hit[s][state, token]
                states[s] = tables.next_state[s][state, token]
        length = torch.where(ended & ~done, t + 1, length)
        done |= ended
        steps = t + 1
        if steps == max_new:
            break
        if steps % sync_every == 0:
            done_list = done.tolist()  # the host sync
            if draws is not None:
                draws.sync(done_list)
            if all(done_list):
                break
        run.mask[:, run.width + t] = 1
        column = torch.tensor([run.width + t], device=device) if run.takes_position else None
        columns = _columns(run.width + t + 1, run.mask.shape[1]) if run.buckets else None
        if run.compiled.step is not eager_step:
            torch.compiler.cudagraph_mark_step_begin()
        with step_limits():
            logits = run.compiled.step(
                run.model, cache, run.cache_kw, token, run.next_pos + t, run.mask, column, columns
            )
    lengths = length[:n].tolist()
    ids, lps = tokens[:n].tolist(), logps[:n].tolist()
    return Samples(
        [ids[i][: lengths[i]] for i in range(n)], [lps[i][: lengths[i]] for i in range(n)]
    )


@torch.inference_mode()
def sample_static(
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
    sync_every: int = 8,
    compile: bool | None = None,
    decode_attention: str = "gqa",
) -> Samples:
    """Sample one response per prompt with a static cache; see the module docstring.

    Arguments as :func:`mcgpo.rollout.sample`, and:
        generator: one generator, or a sequence of them, one per prompt row.
        sync_every: steps between reads of the done mask (the only host syncs); 1 makes a
            shared generator's draws equal the dynamic sampler's in every case.
        compile: compile the decode step (``None``: on CUDA only).
        decode_attention: ``"gqa"`` (:mod:`mcgpo.rollout.decode_attention`: single-token
            steps without copying K/V per query head, over the filled cache columns rounded
            up to a multiple of 256) or ``"sdpa"`` (transformers' own attention, all columns).
    """
    if decode_attention not in DECODE_ATTENTIONS:
        raise ValueError(
            f"decode_attention must be one of {', '.join(DECODE_ATTENTIONS)}, "
            f"got {decode_attention!r}"
        )
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if prefill_rows < 1:
        raise ValueError(f"prefill_rows must be >= 1, got {prefill_rows}")
    if sync_every < 1:
        raise ValueError(f"sync_every must be >= 1, got {sync_every}")
    if stop_strings and tokenizer is None:
        raise ValueError("stop_strings need a tokenizer to decode the sampled tokens")
    eos = {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(e) for e in eos_token_id}
    if not eos:
        raise ValueError("eos_token_id is empty")
    n = len(prompts_ids)
    if isinstance(generator, Sequence) and len(generator) != n:
        raise ValueError(f"generator has {len(generator)} entries for {n} prompts")
    if n == 0:
        return Samples([], [])
    for i, p in enumerate(prompts_ids):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty")
    pad = min(eos) if pad_token_id is None else int(pad_token_id)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    policy = model
    model, own_dtype = sampling_model(model)  # under autocast: a copy in its dtype
    try:
        need = max(map(len, prompts_ids)) + max_new_tokens
        compiled = device.type == "cuda" if compile is None else compile
        no_autocast = torch.autocast(device.type, enabled=False) if own_dtype else nullcontext()
        with no_autocast, use_decode_attention(model, decode_attention):
            run = _Run(model, n, need, device, compiled, buckets=decode_attention == "gqa")
            run.prefill(prompts_ids, pad, prefill_rows)
            return _decode(
                run, temperature, max_new_tokens, eos, stop_strings, tokenizer, generator,
                sync_every,
            )  # fmt: skip
    finally:
        policy.train(was_training)


def _forward_keyword(model: Any) -> tuple[str, bool]:
    """(name of the cache argument, whether forward takes ``cache_position``)."""
    params = inspect.signature(model.forward).parameters
    return ("cache" if "cache" in params else "past_key_values"), "cache_position" in params


def cache_dtype(model: Any) -> torch.dtype:
    """The dtype of the keys and values a forward of ``model`` computes here: autocast's
    (``train.precision bf16-mixed``: fp32 master weights, bf16 K/V) when it is on for the
    model's device, else the weights'."""
    p = next(model.parameters())
    if torch.is_autocast_enabled(p.device.type):
        return torch.get_autocast_dtype(p.device.type)
    return p.dtype


def _new_static_cache(model: Any, rows: int, length: int) -> Any:
    """A ``StaticCache`` of ``rows x length`` in :func:`cache_dtype` (transformers 5.x
    signature, else 4.4x-4.5x)."""
    from transformers import StaticCache

    if "max_batch_size" in inspect.signature(StaticCache.__init__).parameters:
        p = next(model.parameters())
        return StaticCache(
            config=model.config, max_batch_size=rows, max_cache_len=length,
            device=p.device, dtype=cache_dtype(model),
        )  # fmt: skip
    return StaticCache(config=model.config, max_cache_len=length)


def _layer_kv(cache: Any, i: int, like: torch.Tensor, rows: int) -> tuple[torch.Tensor, ...]:
    """Layer ``i``'s preallocated key and value tensors, allocating them on first use."""
    if hasattr(cache, "layers"):
        layer = cache.layers[i]
        if not getattr(layer, "is_initialized", True):
            cache.early_initialization(rows, like.shape[1], like.shape[-1], like.dtype, like.device)
        return layer.keys, layer.values
    return cache.key_cache[i], cache.value_cache[i]


class _Compiled(NamedTuple):
    cache: Any
    step: Callable[..., torch.Tensor]


# One static cache and decode step per model, for its last (rows, length, compiled, dtype).
_STEPS: weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], _Compiled]] = (
    weakref.WeakKeyDictionary()
)


class _Run:
    """The buffers of one :func:`sample_static` call: cache, mask, positions, first logits."""

    def __init__(
        self, model: Any, n: int, need: int, device: torch.device, compiled: bool, buckets: bool
    ):
        self.model, self.n, self.device, self.buckets = model, n, device, buckets
        self.rows = 1 << (n - 1).bit_length()  # a power of two: fewer shapes to compile
        length = -(-need // _LEN_BUCKET) * _LEN_BUCKET + _SLACK
        self.cache_kw, self.takes_position = _forward_keyword(model)
        key = (self.rows, length, compiled, cache_dtype(model))
        held = _STEPS.get(model)
        if held is not None and held[0] == key:
            held[1].cache.reset()
        else:
            step = compiled_step() if compiled else eager_step
            held = (key, _Compiled(_new_static_cache(model, self.rows, length), step))
            _STEPS[model] = held
        self.compiled = held[1]
        self.mask = torch.zeros((self.rows, length), dtype=torch.long, device=device)
        self.width = 0
        self.logits = torch.empty(0)
        self.next_pos = torch.empty(0)

    def prefill(self, prompts_ids: Sequence[Sequence[int]], pad: int, chunk_rows: int) -> None:
        """Each distinct prompt once, in length-sorted chunks, copied right-aligned at the
        prompt width into every row that uses it (rows past ``n`` repeat prompt 0)."""
        from transformers import DynamicCache

        first: dict[tuple[int, ...], int] = {}
        owner = [first.setdefault(tuple(p), len(first)) for p in prompts_ids]
        owner += [owner[0]] * (self.rows - self.n)
        unique = list(first)
        users: list[list[int]] = [[] for _ in unique]
        for row, u in enumerate(owner):
            users[u].append(row)
        self.width = max(len(p) for p in unique)
        order = sorted(range(len(unique)), key=lambda i: len(unique[i]))
        last: list[torch.Tensor] = [torch.empty(0)] * len(unique)
        for k in range(0, len(order), chunk_rows):
            chunk = order[k : k + chunk_rows]
            w = max(len(unique[i]) for i in chunk)
            ids = torch.full((len(chunk), w), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), w), dtype=torch.long)
            for j, i in enumerate(chunk):
                ids[j, w - len(unique[i]) :] = torch.tensor(unique[i])
                mask[j, w - len(unique[i]) :] = 1
            ids, mask = ids.to(self.device), mask.to(self.device)
            part = DynamicCache()
            out = self.model(
                input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
                use_cache=True, logits_to_keep=1, **{self.cache_kw: part},
            )  # fmt: skip
            self._place(part, [users[i] for i in chunk], w)
            for j, i in enumerate(chunk):
                last[i] = out.logits[j, -1].float()
                rows = torch.tensor(users[i], device=self.device)
                self.mask[rows, self.width - len(unique[i]) : self.width] = 1
        self.logits = torch.stack(last)[torch.tensor(owner, device=self.device)]
        self.next_pos = self.mask.sum(1)  # position of the token about to be sampled

    def _place(self, part: Any, users: list[list[int]], w: int) -> None:
        """Copy a prefilled chunk's keys/values into the static rows of its prompts' users."""
        src = torch.tensor([j for j, us in enumerate(users) for _ in us], device=self.device)
        dst = torch.tensor([r for us in users for r in us], device=self.device)
        cols = slice(self.width - w, self.width)
        for layer in range(len(part.layers)):
            k, v = part.layers[layer].keys, part.layers[layer].values
            keys, values = _layer_kv(self.compiled.cache, layer, k, self.rows)
            keys[dst, :, cols] = k[src]
            values[dst, :, cols] = v[src]


SAMPLERS: dict[str, Callable[..., Samples]] = {"dynamic": sample, "static": sample_static}
"""Sampler by name (``rollout.sampler``): both return the same :class:`Samples`."""
