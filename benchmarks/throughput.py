"""Throughput measures shared by bench_sampler.py, bench_update.py and gpu/gpu_check.py.

- Sampling: new tokens per second of ``model.generate``, the dynamic KV-cache sampler and the
  static-cache sampler on one batch (every row makes exactly ``new_tokens`` tokens: EOS is
  disabled), and the memory-bandwidth bound of decoding: each decode step reads every weight
  once and every row's key/value cache once, so at most
  ``rows / ((weight bytes + KV bytes of the step) / bandwidth)`` tokens per second.
- Training: tokens per second of the raw forward+backward of the training forward pass
  (log-probs over whole rows, every row even where rows repeat, the loss a masked mean of
  the response log-probs, no optimiser step) and of ``update_policy`` on the same rows
  (which computes repeated rows once), laid out in the same
  length-sorted micro-batches, and model FLOPs utilisation ``6 * params * tokens / seconds /
  peak`` (the common approximation: a forward is 2 FLOPs per parameter per token, the
  backward 4; attention's own FLOPs are left out, so MFU is a slight underestimate).

Hardware constants (NVIDIA H200 SXM datasheet): 4.8 TB/s HBM3e, 989 TFLOP/s dense bf16.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from mcgpo.policy import token_log_probs_and_entropy
from mcgpo.rollout import TokenBatch, sample
from mcgpo.rollout.static_decode import sample_static

H200_BYTES_PER_S = 4.8e12
H200_BF16_FLOPS = 989e12


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_times(fns: Sequence[Callable[[], Any]], repeats: int, device: torch.device) -> list[float]:
    """Best wall time of each function; they take turns, so background load hits all alike."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def weight_bytes(model: Any) -> int:
    """Bytes of the weights (tied embeddings counted once, as ``parameters()`` yields them)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def kv_bytes_per_token(model: Any) -> int:
    """Bytes of keys + values that one token adds to the cache, over all layers."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    itemsize = next(model.parameters()).element_size()
    return 2 * c.num_hidden_layers * kv_heads * head_dim * itemsize


def decode_bound(model: Any, rows: int, mean_context: float, bandwidth: float) -> float:
    """Tokens/s if a decode step only read the weights and the rows' caches at ``bandwidth``."""
    step_bytes = weight_bytes(model) + rows * mean_context * kv_bytes_per_token(model)
    return rows / (step_bytes / bandwidth)


def _left_padded(prompts: Sequence[Sequence[int]], pad: int, device: torch.device):
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(list(p)), 1
    return ids.to(device), mask.to(device)


def sampler_speeds(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    new_tokens: int,
    pad_token_id: int,
    bandwidth: float,
    repeats: int = 2,
    compile: bool | None = None,
    kinds: Sequence[str] = ("generate", "dynamic", "static"),
) -> dict[str, float]:
    """Tokens/s of each sampler in ``kinds`` (after one warm-up call each) and the bound."""
    device = next(model.parameters()).device
    ids, mask = _left_padded(prompts, pad_token_id, device)
    common = {"temperature": 1.0, "max_new_tokens": new_tokens, "eos_token_id": [-1]}
    common["pad_token_id"] = pad_token_id

    def gen() -> None:
        with torch.inference_mode():
            model.generate(
                ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                min_new_tokens=new_tokens, max_new_tokens=new_tokens, pad_token_id=pad_token_id,
            )  # fmt: skip

    def dynamic() -> None:
        sample(model, prompts, generator=torch.Generator(device).manual_seed(0), **common)

    def static() -> None:
        g = torch.Generator(device).manual_seed(0)
        sample_static(model, prompts, generator=g, compile=compile, **common)

    fns = {"generate": gen, "dynamic": dynamic, "static": static}
    chosen = [fns[k] for k in kinds]
    for fn in chosen:  # warm-up: compilation, allocator, kernels
        fn()
    times = best_times(chosen, repeats, device)
    tokens = len(prompts) * new_tokens
    out = {f"{k}_tok_s": tokens / t for k, t in zip(kinds, times)}
    mean_prompt = float(np.mean([len(p) for p in prompts]))
    out["bound_tok_s"] = decode_bound(model, len(prompts), mean_prompt + new_tokens / 2, bandwidth)
    out["mean_prompt"] = mean_prompt
    return out


def micro_batches(batch: TokenBatch, micro: int) -> list[np.ndarray]:
    """Rows sorted by length, cut every ``micro`` rows: the update's layout without pairs."""
    lengths = batch.attention_mask.sum(1).cpu().numpy()
    order = np.argsort(lengths, kind="stable")
    return [order[k : k + micro] for k in range(0, len(order), micro)]


def padding_share(batch: TokenBatch, micro: int) -> float:
    """Share of the token slots of the micro-batches that are padding."""
    lengths = batch.attention_mask.sum(1).cpu().numpy()
    slots = sum(len(rows) * int(lengths[rows].max()) for rows in micro_batches(batch, micro))
    return 1.0 - float(lengths.sum()) / slots if slots else 0.0


def forward_backward(model: Any, batch: TokenBatch, micro: int, autocast: Any = None) -> None:
    """One raw forward+backward over every row (no optimiser step); gradients are zeroed."""
    device = next(model.parameters()).device
    model.train()
    model.zero_grad(set_to_none=True)
    for rows in micro_batches(batch, micro):
        mb = batch.select(rows).to(device)
        with autocast() if autocast else contextlib.nullcontext():
            lp = token_log_probs_and_entropy(
                model, mb.input_ids, mb.attention_mask, with_entropy=False, unique_rows=False
            )[0]  # every row through the model, identical ones too
        loss = (lp * mb.response_mask).sum() / mb.response_mask.sum().clamp(min=1)
        loss.backward()
    model.zero_grad(set_to_none=True)


def mfu(params: int, tokens: int, seconds: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: ``6 * params * tokens / seconds / peak``."""
    return 6.0 * params * tokens / seconds / peak_flops


def update_efficiency(
    model: Any,
    batch: TokenBatch,
    advantages: np.ndarray,
    cfg: Any,
    *,
    repeats: int = 2,
    ref_model: Any = None,
    groups: np.ndarray | None = None,
    autocast: Any = None,
) -> dict[str, float]:
    """Tokens/s (all real tokens) of ``update_policy`` and of the raw forward+backward on the
    same rows and micro-batch size; ``ratio`` = update / raw (1 = no overhead at all).

    The weights move with each timed update (a throw-away AdamW at ``cfg.lr``): timing only.
    """
    from mcgpo.training.build import build_optimizer
    from mcgpo.training.update import update_policy

    device = next(model.parameters()).device
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay)

    def raw() -> None:
        forward_backward(model, batch, cfg.micro_batch_size, autocast)

    def update() -> None:
        with autocast() if autocast else contextlib.nullcontext():
            update_policy(model, optimizer, batch, advantages, cfg, ref_model=ref_model,
                          groups=groups)  # fmt: skip

    raw()
    update()  # warm-up (allocator, optimiser state)
    t_raw, t_update = best_times([raw, update], repeats, device)
    tokens = int(batch.attention_mask.sum())
    return {
        "tokens": float(tokens),
        "raw_tok_s": tokens / t_raw,
        "update_tok_s": tokens / t_update,
        "ratio": t_raw / t_update,
        "raw_s": t_raw,
        "update_s": t_update,
        "padding": padding_share(batch, cfg.micro_batch_size),
    }
