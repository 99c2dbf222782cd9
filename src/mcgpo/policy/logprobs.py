"""Per-token log-probabilities and entropies from one forward pass, position-aligned.

For a row ``x`` with mask ``m`` the value at position t is

    log_probs[t] = log pi(x_t | x_<t)        (logits at t-1, temperature 1)
    entropy[t]   = H(pi(. | x_<t))           (the distribution that produced x_t)

and 0 at t = 0 and wherever ``m[t] = 0`` or ``m[t-1] = 0`` (padding, and the first real token
of a left-padded row, which has no real prefix). Position ids are ``cumsum(mask) - 1``, so
left- and right-padded rows give the same numbers as the unpadded sequence; the sampler
uses the same rule, which is what makes its log-probs equal these (tested to 1e-4).

Log-softmax is taken in float32 whatever the model's dtype.

Identical rows (the same real tokens, mask and ``positions``) go through the model once and
their results are copied to every copy (``unique_rows``, on by default): the gradient is the
same, the copies' upstream gradients summed by the indexing's backward. In a household-quick
update about a fifth of the step rows repeat another row of the batch (siblings that reach
the same prompt and answer it alike; 1,503 distinct of 1,886 rows, 79 % of the tokens), and
the training forward, the reference forward and the pi_old recompute all skip them. The
values equal the all-rows ones up to float rounding of a smaller batch (tested).

``positions`` (``[R, L]`` bool, e.g. the response mask): only these positions' values are
wanted; the others come back 0. The head and the log-softmax then run on those positions'
final hidden states only (gathered to ``[K, H]``), not on all R x L: a step row is a whole
prompt of hundreds of tokens with a response of a few, and the losses (PPO, KL, entropy,
the pair score, SFT) read response positions only. The values equal the whole-row ones up to
float rounding of the smaller matrix product (tested). Like ``chunk_size`` it assumes
``logits = lm_head(hidden)``.

``chunk_size``: the [R, L, V] logits are the memory peak for large vocabularies. With a
chunk size the head and the log-softmax run ``chunk_size`` positions at a time on the final
hidden states, under activation checkpointing when gradients are on, so only the [R, L]
results are kept for backward (the logits are recomputed chunk by chunk). This path assumes
``logits = lm_head(hidden)``; models that rescale or soft-cap logits are refused.

Under DDP or FSDP2 the chunked path must run inside one forward of the wrapped module (DDP's
reducer and FSDP2's all-gathers hook that forward; calling the body and the head apart would
skip them: no gradient all-reduce, or sharded parameters). :class:`PolicyForward` is the
module they wrap: its forward is the policy's own, or (``chunk_size`` given) the chunked
computation; the functions here route through it when given such a wrapper. A plain model
is called directly, as before.

``compile_layers``: the model's decoder layers run compiled for this call
(:func:`mcgpo.policy.compile.compiled_layers`, ``train.compile``); the update, the pi_old
recompute and the reference forward pass it, the sampler never does. The values equal the
eager ones up to float rounding (tests/policy/test_compiled_layers.py states the bound).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from mcgpo.policy.compile import compiled_layers

__all__ = [
    "PolicyForward",
    "position_ids",
    "token_entropy",
    "token_log_probs",
    "token_log_probs_and_entropy",
]


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """[R, L] position of each token among the real tokens of its row (0 on left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _head_stats(
    logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    logp = F.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return chosen, torch.zeros_like(chosen)
    entropy = -(logp.exp() * logp).sum(-1)
    return chosen, entropy


def token_log_probs_and_entropy(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    with_entropy: bool = True,
    chunk_size: int | None = None,
    positions: torch.Tensor | None = None,
    unique_rows: bool = True,
    compile_layers: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(log_probs, entropy)``, both float32 ``[R, L]``, position-aligned (see module).

    Gradients flow when called outside ``torch.no_grad``. ``with_entropy=False`` returns
    zeros for the entropy and skips its cost. ``positions`` (``[R, L]`` bool): compute only
    these positions (the head runs on their hidden states alone); the rest are 0.
    ``unique_rows``: rows equal in their real tokens, mask and ``positions`` go through the
    model once and their results are copied (see module); ``False`` runs every row.
    ``compile_layers``: run the decoder layers compiled (see module).
    """
    if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"input_ids and attention_mask must both be [R, L]; got {tuple(input_ids.shape)} "
            f"and {tuple(attention_mask.shape)}"
        )
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size}")
    if positions is not None and positions.shape != input_ids.shape:
        raise ValueError(
            f"positions must be [R, L] like input_ids; got {tuple(positions.shape)} and "
            f"{tuple(input_ids.shape)}"
        )
    if compile_layers:
        with compiled_layers(model):
            return token_log_probs_and_entropy(
                model, input_ids, attention_mask, with_entropy=with_entropy,
                chunk_size=chunk_size, positions=positions, unique_rows=unique_rows,
            )  # fmt: skip
    if unique_rows and input_ids.shape[0] > 1:
        first, inverse = _distinct_rows(input_ids, attention_mask, positions)
        if len(first) < input_ids.shape[0]:  # identical rows: computed once, copied back
            pick = None if positions is None else positions[first]
            log_probs, entropy = token_log_probs_and_entropy(
                model, input_ids[first], attention_mask[first], with_entropy=with_entropy,
                chunk_size=chunk_size, positions=pick, unique_rows=False,
            )  # fmt: skip
            return log_probs[inverse], entropy[inverse]
    mask = attention_mask.long()
    pos = position_ids(mask)
    targets = input_ids[:, 1:]
    # where, not a product: logits at padding may be anything, even NaN, and must not leak
    valid = (mask[:, 1:] * mask[:, :-1]).bool()
    wanted = None if positions is None else valid & positions[:, 1:].bool()
    if chunk_size is None and wanted is None:
        logits = model(
            input_ids=input_ids, attention_mask=mask, position_ids=pos, use_cache=False
        ).logits[:, :-1]
        chosen, entropy = _head_stats(logits, targets, with_entropy)
    elif _routes_chunks(model):  # DDP / FSDP2: one forward of the wrapped module
        chosen, entropy = model(
            input_ids=input_ids, attention_mask=mask, chunk_size=chunk_size,
            with_entropy=with_entropy, wanted=wanted,
        )  # fmt: skip
    else:
        chosen, entropy = _by_head(
            model, input_ids, mask, pos, targets, with_entropy, chunk_size, wanted
        )
    if wanted is not None:
        valid = wanted
    zero = torch.zeros_like(chosen[:, :1])
    log_probs = torch.cat([zero, torch.where(valid, chosen, 0.0)], dim=1)
    entropy = torch.cat([zero, torch.where(valid, entropy, 0.0)], dim=1)
    return log_probs, entropy


def _distinct_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, inverse)``: the first row of each distinct row (real tokens, mask and
    ``positions``; padding ids ignored), in row order, and each row's index into them."""
    real = attention_mask.bool()
    parts = [torch.where(real, input_ids, -1), real.long()]
    if positions is not None:
        parts.append(positions.long())
    _, inverse = torch.unique(torch.cat(parts, dim=1), dim=0, return_inverse=True)
    rows = torch.arange(len(inverse), device=inverse.device)
    first = torch.full((int(inverse.max()) + 1,), len(inverse), device=inverse.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    order = torch.argsort(first)  # distinct rows in the order of their first occurrence
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=order.device)
    return first[order], rank[inverse]


class PolicyForward(torch.nn.Module):
    """``policy`` behind one forward, for DDP and FSDP2 to wrap.

    ``forward(**kwargs)`` is ``policy(**kwargs)``; ``forward(input_ids=, attention_mask=,
    chunk_size=n, with_entropy=, wanted=)`` (a chunk size or ``wanted``, the ``[R, L-1]``
    positions to compute) is the head path's ``(chosen, entropy)``, each ``[R, L-1]``
    float32, unmasked (:func:`token_log_probs_and_entropy` masks them). Its parameters are
    the policy's, under the prefix ``policy.``.
    """

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(
        self,
        *args: Any,
        chunk_size: int | None = None,
        with_entropy: bool = True,
        wanted: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        if chunk_size is None and wanted is None:
            return self.policy(*args, **kwargs)
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"].long()
        return _by_head(
            self.policy, ids, mask, position_ids(mask), ids[:, 1:], with_entropy, chunk_size,
            wanted,
        )  # fmt: skip


def _routes_chunks(model: Any) -> bool:
    """Whether ``model`` is a :class:`PolicyForward` (FSDP2 makes it a subclass) or DDP
    around one."""
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    return isinstance(inner, PolicyForward)


def _by_head(
    model: Any,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    pos: torch.Tensor,
    targets: torch.Tensor,
    with_entropy: bool,
    chunk_size: int | None,
    wanted: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Body once, then the head on the final hidden states: on the ``wanted`` positions only
    (``[R, L-1]`` bool) or chunk by chunk over all of them; ``[R, L-1]`` results."""
    config = getattr(model, "config", None)
    for name in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale"):
        if getattr(config, name, None) not in (None, 1, 1.0):
            raise ValueError(
                f"chunk_size and positions are not supported for a model with config.{name} "
                "set; use neither"
            )
    hidden = model.base_model(
        input_ids=input_ids, attention_mask=mask, position_ids=pos, use_cache=False
    ).last_hidden_state[:, :-1]
    head = model.get_output_embeddings()

    def piece(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _head_stats(head(h), t, with_entropy)

    if wanted is not None:
        return _on_positions(piece, hidden, targets, wanted, chunk_size)
    chosen, entropy = [], []
    for s in range(0, hidden.shape[1], chunk_size):
        h, t = hidden[:, s : s + chunk_size], targets[:, s : s + chunk_size]
        if torch.is_grad_enabled() and h.requires_grad:
            c, e = checkpoint(piece, h, t, use_reentrant=False)
        else:
            c, e = piece(h, t)
        chosen.append(c)
        entropy.append(e)
    if not chosen:  # L == 1: nothing is predicted
        empty = hidden.new_zeros((hidden.shape[0], 0), dtype=torch.float32)
        return empty, empty
    return torch.cat(chosen, dim=1), torch.cat(entropy, dim=1)


def _on_positions(
    piece: Any,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    wanted: torch.Tensor,
    chunk_size: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's stats on the ``wanted`` positions' hidden states, scattered back into
    zeros of ``[R, L-1]``; with ``chunk_size``, ``R * chunk_size`` positions at a time (the
    memory of the chunked path over whole rows), under activation checkpointing."""
    where = wanted.nonzero(as_tuple=True)
    h, t = hidden[where], targets[where]  # [K, H], [K]
    step = max(1, h.shape[0] if chunk_size is None else chunk_size * hidden.shape[0])
    chosen, entropy = [], []
    for s in range(0, h.shape[0], step):
        hs, ts = h[s : s + step], t[s : s + step]
        if chunk_size is not None and torch.is_grad_enabled() and hs.requires_grad:
            c, e = checkpoint(piece, hs, ts, use_reentrant=False)
        else:
            c, e = piece(hs, ts)
        chosen.append(c)
        entropy.append(e)
    zeros = hidden.new_zeros(targets.shape, dtype=torch.float32)
    if not chosen:  # nothing wanted
        return zeros, zeros
    return (
        zeros.index_put(where, torch.cat(chosen)),
        zeros.index_put(where, torch.cat(entropy)),
    )


def token_log_probs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    chunk_size: int | None = None,
    positions: torch.Tensor | None = None,
    compile_layers: bool = False,
) -> torch.Tensor:
    """``[R, L]`` float32: value at t = log p(input_ids[t] | input_ids[<t]); 0 at t=0 and pads
    (and outside ``positions`` when given)."""
    return token_log_probs_and_entropy(
        model, input_ids, attention_mask, with_entropy=False, chunk_size=chunk_size,
        positions=positions, compile_layers=compile_layers,
    )[0]  # fmt: skip


def token_entropy(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """``[R, L]`` float32: entropy of the distribution that predicted token t (0 at t=0, pads)."""
    return token_log_probs_and_entropy(model, input_ids, attention_mask, chunk_size=chunk_size)[1]
