"""Stop strings as token-level automata, so a sampler can check them on the device.

A response ends at the first token after which the concatenation of the decoded pieces
(``tokenizer.decode([t])`` for each sampled token ``t``) contains a stop string: the rule of
:func:`mcgpo.rollout.sample`. Each stop string is a Knuth-Morris-Pratt automaton over
characters whose state is the length of the matched prefix; running it over every token's
piece from every state gives two ``[len(s), V]`` tables (the state after the token, and
whether the token completes the string), so one sampling step checks a batch of rows with two
gathers. The tables are built once per (tokenizer, stop strings, vocabulary size, device),
vectorised with numpy: the work is the vocabulary's total characters times the stop
string's length (measured: 0.5 s for 151,936 synthetic pieces of 1-128 characters and the
stops ``</action>`` and ``\n``, 2 busy cores; plus one ``batch_decode`` of every id).
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


def _piece_chars(pieces: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(code points of all pieces concatenated, offset of each piece, length of each piece)."""
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    codes = np.frombuffer("".join(pieces).encode("utf-32-le"), dtype=np.uint32)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return codes, offsets, lengths


def _automaton_over_tokens(
    stop: str, codes: np.ndarray, offsets: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """([len(s), V] state after each token from each state, [len(s), V] token completes s).

    All start states at once; tokens sorted longest first, so that column c of the pieces
    only touches the tokens that are longer than c (work = total characters x states).
    """
    delta, alpha = _kmp_automaton(stop)
    n, vocab = len(stop), len(lengths)
    uniq, inverse = np.unique(codes, return_inverse=True)
    classes = np.array([alpha.get(chr(u), len(alpha)) for u in uniq], dtype=np.int64)[inverse]
    order = np.argsort(-lengths, kind="stable")
    start, by_length = offsets[order], np.sort(lengths)
    state = np.repeat(np.arange(n, dtype=np.int64)[:, None], vocab, axis=1)
    hit = np.zeros((n, vocab), dtype=bool)
    for c in range(int(lengths.max(initial=0))):
        k = vocab - int(np.searchsorted(by_length, c, side="right"))  # tokens longer than c
        moved = delta[state[:, :k], classes[start[:k] + c][None, :]]
        hit[:, :k] |= moved == n
        state[:, :k] = moved
    next_state, completes = np.empty_like(state), np.empty_like(hit)
    next_state[:, order] = np.minimum(state, n - 1)  # after a hit the row is done anyway
    completes[:, order] = hit
    return next_state, completes


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
    codes, offsets, lengths = _piece_chars(_token_pieces(tokenizer, vocab))
    next_states, hits = [], []
    for stop in stops:
        if not stop:  # "" is in every text: the first token ends the response
            next_states.append(torch.zeros((1, vocab), dtype=torch.long, device=device))
            hits.append(torch.ones((1, vocab), dtype=torch.bool, device=device))
            continue
        nxt, hit = _automaton_over_tokens(stop, codes, offsets, lengths)
        next_states.append(torch.from_numpy(nxt).to(device))
        hits.append(torch.from_numpy(hit).to(device))
    per_tok[key] = StopTables(next_states, hits)
    return per_tok[key]
