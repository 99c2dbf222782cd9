"""GQA-native attention for single-token decode steps, registered with transformers.

A model with grouped-query attention has ``H`` query heads over ``Hk`` key/value heads,
``G = H / Hk`` query heads per KV head; transformers numbers them so that query head
``h = k * G + j`` reads KV head ``k`` (``repeat_kv`` expands KV head ``k`` to heads
``k*G .. k*G + G-1``). Its sdpa path (``integrations/sdpa_attention.py``) expands K and V to
``H`` heads with ``repeat_kv`` whenever a mask is passed, except for an uncompiled
single-token step (its ``pack_gqa`` shortcut, skipped under ``torch.compile``). The static
sampler's step is compiled and always has a mask, so at every step it copied the *whole*
static cache ``G`` times (``G = 6`` for Qwen2.5-1.5B): 58 % of the decode kernel time on an
H200 (docs/rollout.md, "Static decode").

:func:`gqa_decode_attention` computes a single-token step without that copy: the ``G``
query heads of KV head ``k`` become ``G`` query *rows* over that KV head,

    q [B, H, 1, D] --reshape--> [B, Hk, G, D]       (a view: h = k*G + j, the repeat_kv order)
    SDPA(q, K [B, Hk, L, D], V, mask [B, 1, 1, L] broadcast to [B, Hk, G, L], not causal)
    out [B, Hk, G, D] --reshape--> [B, H, 1, D] --transpose--> [B, 1, H, D]

which is, row for row, the same dot products, softmax and weighted sum as ``repeat_kv`` +
SDPA (the property test checks it to float32 rounding). Why this layout and not SDPA's
``enable_gqa=True``: the rows layout is a plain SDPA call, so any backend (flash,
memory-efficient, cuDNN, math, inductor's own) runs it with an arbitrary padding mask,
while ``enable_gqa`` with a mask is served on CUDA by the math kernel, which expands K/V
itself (transformers uses ``enable_gqa`` on CUDA only without a mask for that reason).
It is also the layout of transformers' own eager ``pack_gqa`` shortcut, so ``gqa`` and
``sdpa`` do the same arithmetic wherever that shortcut runs.

Every call that is not a single-token step (the prefill, any multi-token call) goes to
transformers' ``sdpa_attention_forward`` unchanged, with the same arguments: the prefill is
transformers' own. Single-token calls with a position bias, a soft cap or dropout go there
too (none occurs in the samplers).

Conventions that a registered attention must get right, each a way to get wrong tokens
(a probe on an H200 matched the baseline's tokens at 65 % of positions and its first-token
log-probs by 2.85 only; its code was not kept, these are the causes that fit):

1. **The mask function.** transformers builds the mask with the function registered under
   the *same name* in ``AttentionMaskInterface``; for a name registered only in
   ``AttentionInterface`` ``create_causal_mask`` returns ``None`` (its "custom attention
   without mask creation" exit). The attention then sees no padding mask: the prefill of
   left-padded prompts attends to the padding (checked on a tiny model: logits off by 0.4),
   so even the *first* token's log-prob, which comes from the prefill, changes; and a
   decode step attends to padding and to the static cache's unfilled slots. The most
   likely cause of the probe's mismatch. Here the name is registered in both, with
   transformers' ``sdpa_mask`` (boolean, ``True`` = attend), so prefill and decode get the
   very masks the ``sdpa`` path gets.
2. **Causality of the rows.** The ``G`` rows are one query position, so the call is never
   causal: ``is_causal=True`` would mask row ``j`` to the first ``j + 1`` columns.
3. **Head order.** ``reshape(B, Hk, G, D)`` groups heads ``k*G + j``; grouping ``j*Hk + k``
   (a ``transpose`` before the reshape) would pair query heads with the wrong KV heads.
4. **Output layout.** An attention function returns ``[B, q_len, H, D]`` (transposed), not
   SDPA's ``[B, H, q_len, D]``; the caller reshapes it to ``[B, q_len, H*D]`` blindly.
5. **Scale.** ``scaling`` (``head_dim ** -0.5`` for Qwen2) is passed on as SDPA's ``scale``.
6. **Mask kinds.** A boolean mask (``True`` = attend) and an additive float mask both pass
   to SDPA as they are (never ``mask.bool()`` on an additive mask, which inverts it).

:func:`use_decode_attention` switches a model to this attention for the duration of a
``with`` block (``model.set_attn_implementation``, restored afterwards); ``"sdpa"`` leaves
the model as it is. ``decode_columns`` (a keyword argument of the model call, passed through
to the attention function) restricts a single-token step to the first ``decode_columns``
cache columns: the static sampler's length buckets (:mod:`mcgpo.rollout.static_decode`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "ATTENTION_NAME",
    "DECODE_ATTENTIONS",
    "gqa_decode_attention",
    "register_decode_attention",
    "use_decode_attention",
]

DECODE_ATTENTIONS = ("gqa", "sdpa")
"""``decode_attention`` values: ours (:func:`gqa_decode_attention`), or transformers' own."""

ATTENTION_NAME = "mcgpo_gqa_decode"
"""The name :func:`gqa_decode_attention` is registered under (attention and mask)."""


def gqa_decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query ``[B, H, q, D]``, key/value
    ``[B, Hk, L, D]``, mask ``[B, 1 or H, q, L]`` (bool or additive) or None; returns
    ``([B, q, H, Dv], None)``. Single-token steps run GQA-native (module docstring), any
    other call is transformers' ``sdpa_attention_forward``."""
    batch, heads, q_len, _ = query.shape
    kv_heads = key.shape[1]
    plain = kwargs.get("position_bias") is None and kwargs.get("softcap") is None and dropout == 0.0
    if q_len != 1 or not plain or heads % kv_heads:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        kwargs.pop("decode_columns", None)
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            is_causal=is_causal, **kwargs,
        )  # fmt: skip
    group = heads // kv_heads
    rows = query.reshape(batch, kv_heads, group, query.shape[-1])  # head k*G + j -> [k, j]
    mask = attention_mask
    if mask is not None and mask.shape[1] != 1:  # a per-head mask: group its heads the same way
        mask = mask.reshape(mask.shape[0], kv_heads, group, mask.shape[-1])
    columns = kwargs.get("decode_columns")
    if columns is not None:  # no comparison with the length: no guard, one graph for all
        key, value = key[:, :, :columns], value[:, :, :columns]
        mask = None if mask is None else mask[..., :columns]
    out = F.scaled_dot_product_attention(rows, key, value, attn_mask=mask, scale=scaling)
    out = out.reshape(batch, heads, 1, value.shape[-1])
    return out.transpose(1, 2).contiguous(), None


_registered = False


def register_decode_attention() -> None:
    """Register :func:`gqa_decode_attention` as ``ATTENTION_NAME`` with transformers'
    ``AttentionInterface``, and transformers' ``sdpa_mask`` under the same name with its
    ``AttentionMaskInterface`` (module docstring, item 1). Idempotent."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, gqa_decode_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    _registered = True


@contextmanager
def use_decode_attention(model: Any, decode_attention: str) -> Iterator[None]:
    """Within the block the model's attention is ``decode_attention``: ``"gqa"`` (ours; the
    model must use transformers' ``sdpa``, which ours extends) or ``"sdpa"`` (the model as
    it is). The model's own implementation is restored on exit."""
    if decode_attention not in DECODE_ATTENTIONS:
        raise ValueError(
            f"decode_attention must be one of {', '.join(DECODE_ATTENTIONS)}, "
            f"got {decode_attention!r}"
        )
    if decode_attention == "sdpa":
        yield
        return
    before = model.config._attn_implementation
    if before not in ("sdpa", ATTENTION_NAME):
        raise ValueError(
            f"decode_attention 'gqa' extends transformers' sdpa attention; this model uses "
            f"{before!r} (use decode_attention 'sdpa')"
        )
    register_decode_attention()
    model.set_attn_implementation(ATTENTION_NAME)
    try:
        yield
    finally:
        model.set_attn_implementation(before)
