"""How a batch of prompts becomes vLLM requests, and vLLM's tokens a response (the engine's
bookkeeping, apart from the engine): each row's seed, the waves of the CPU backend, and the
HF sampler's end rule applied to the tokens vLLM returns."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["cut_at_stop", "prefill_waves", "row_seeds"]


def cut_at_stop(
    ids: Sequence[int],
    eos: set[int],
    stop_strings: Sequence[str],
    tokenizer: Any,
    pieces: dict[int, str] | None = None,
) -> int:
    """How many of ``ids`` a response keeps under the HF sampler's rule: up to and including
    the first EOS id, or the first token after which the concatenated pieces
    ``tokenizer.decode([t])`` contain a stop string; all of them otherwise."""
    pieces = {} if pieces is None else pieces
    keep_chars = max((len(s) for s in stop_strings), default=0)
    tail = ""
    for j, t in enumerate(ids):
        if t in eos:
            return j + 1
        if stop_strings:
            if t not in pieces:
                pieces[t] = tokenizer.decode([t])
            text = tail + pieces[t]
            if any(s in text for s in stop_strings):
                return j + 1
            tail = text[-keep_chars:]
    return len(ids)


def prefill_waves(lengths: Sequence[int], tokens: int, rows: int) -> list[range]:
    """Consecutive rows cut into waves of at most ``tokens`` prompt tokens and ``rows`` rows.

    One ``generate`` call per wave, so that vLLM's scheduler prefills every prompt of a wave
    in its first step: a seeded request whose prefill is split over steps crashes vLLM's CPU
    worker (0.32.0: ``CPU Generator does not use offset``, raised when it rewinds the
    request's generator). Rows draw from their own seeds, so waves change no row's tokens."""
    out, start, used = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and (used + n > tokens or i - start >= rows):
            out.append(range(start, i))
            start, used = i, 0
        used += n
    out.append(range(start, len(lengths)))
    return out


def row_seeds(
    generator: torch.Generator | Sequence[torch.Generator] | None, n: int, temperature: float
) -> list[int | None]:
    """Each row's vLLM seed: drawn from its own generator, or n draws from one generator;
    None (the engine's stream) without generators or when greedy."""
    if generator is None or temperature == 0:
        return [None] * n
    if isinstance(generator, torch.Generator):
        gens = [generator] * n
    else:
        gens = list(generator)
        if len(gens) != n:
            raise ValueError(f"generator: {len(gens)} generators for {n} prompts")
    return [int(torch.randint(0, 2**62, (1,), generator=g, device=g.device)) for g in gens]
