"""Stop strings as token-level automata, so a sampler can check them on the device.

A response ends at the first token after which the concatenation of the decoded pieces
(``tokenizer.decode([t])`` for each sampled token ``t``) contains a stop string: the rule of
:func:`mcgpo.rollout.sample`. Each stop string is a Knuth-Morris-Pratt automaton over
characters whose state is the length of the matched prefix; running it over every token's
piece from every state gives two ``[len(s), V]`` tables (the state after the token, and
whether the token completes the string), so one sampling step checks a batch of rows with two
gathers. The tables are built once per (tokenizer, stop strings, vocabulary size, device),
vectorised over the vocabulary with numpy (about a second for a 150k vocabulary).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

__all__ = ["StopTables", "stop_tables"]


class StopTables(NamedTuple):
    """Per stop string, the KMP automaton's transitions over whole tokens."""

    next_state: list[torch.Tensor]  # per stop string [len(s), V] long: state after the token
    hit: list[torch.Tensor]  # per stop string [len(s), V] bool: the token completes s


_TABLES: weakref.WeakKeyDictionary[Any, dict[tuple, StopTables]] = weakref.WeakKeyDictionary()


def _kmp_automaton(stop: str) -> tuple[np.ndarray, dict[str, int]]:
    """delta[q, c]: matched-prefix length after char class c from state q (c = len(alpha): other)."""
    alpha = {ch: i for i, ch in enumerate(dict.fromkeys(stop))}
    n = len(stop)
    fail = [0] * (n + 1)  # fail[q]: longest proper border of stop[:q]
    for q in range(2, n + 1):
        k = fail[q - 1]
        while k and stop[k] != stop[q - 1]:
            k = fail[k]
        fail[q] = k + 1 if stop[k] == stop[q - 1] else 0
    delta = np.zeros((n + 1, len(alpha) + 1), dtype=np.int64)
    for q in range(n + 1):
        for ch, c in alpha.items():
            k = fail[q] if q == n else q
            while k and stop[k] != ch:
                k = fail[k]
            delta[q, c] = k + 1 if stop[k] == ch else 0
    return delta, alpha


def _token_pieces(tokenizer: Any, vocab: int) -> list[str]:
    """``tokenizer.decode([t])`` for every id (ids past the tokenizer decode to "")."""
    n = min(vocab, len(tokenizer))
    pieces = list(tokenizer.batch_decode([[t] for t in range(n)]))
    return pieces + [""] * (vocab - n)


def stop_tables(
    tokenizer: Any, stops: Sequence[str], vocab: int, device: torch.device
) -> StopTables:
    """Transition tables of the stop strings over whole tokens (cached per tokenizer).

    A response ends at the first token after which the concatenated decoded pieces contain a
    stop string, the rule of the dynamic sampler; the KMP state (length of the matched
    prefix) carries partial matches across tokens.
    """
    key = (tuple(stops), vocab, str(device))
    per_tok = _TABLES.setdefault(tokenizer, {})
    if key in per_tok:
        return per_tok[key]
    pieces = _token_pieces(tokenizer, vocab)
    width = max(1, max(len(p) for p in pieces))
    next_states, hits = [], []
    for stop in stops:
        if not stop:  # "" is in every text: the first token ends the response
            next_states.append(torch.zeros((1, vocab), dtype=torch.long, device=device))
            hits.append(torch.ones((1, vocab), dtype=torch.bool, device=device))
            continue
        delta, alpha = _kmp_automaton(stop)
        other = len(alpha)
        chars = np.full((vocab, width), -1, dtype=np.int64)  # -1: past the piece's end
        for t, piece in enumerate(pieces):
            chars[t, : len(piece)] = [alpha.get(ch, other) for ch in piece]
        nxt = np.zeros((len(stop), vocab), dtype=np.int64)
        hit = np.zeros((len(stop), vocab), dtype=bool)
        for q0 in range(len(stop)):
            state = np.full(vocab, q0, dtype=np.int64)
            for c in range(width):
                valid = chars[:, c] >= 0
                moved = delta[state, np.where(valid, chars[:, c], 0)]
                hit[q0] |= valid & (moved == len(stop))
                state = np.where(valid, moved, state)
            nxt[q0] = np.minimum(state, len(stop) - 1)  # after a hit the row is done anyway
        next_states.append(torch.from_numpy(nxt).to(device))
        hits.append(torch.from_numpy(hit).to(device))
    per_tok[key] = StopTables(next_states, hits)
    return per_tok[key]
