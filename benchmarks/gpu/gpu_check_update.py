"""Parts b (the update against the raw forward+backward, and its memory) and e (the update
with and without compiled decoder layers, in bf16-mixed and pure bf16) of the device check
(benchmarks/gpu/gpu_check.py); each runs in a process of its own."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from gpu_check_context import PRECISION, Part, goal, has_field, num, throughput

# part e's two precisions and the dtype their weights are built in
COMPILED_VARIANTS = (("bf16-mixed", torch.float32), ("bf16", torch.bfloat16))


def train_flops(config: Any, lengths: list[int], responses: list[int]) -> float:
    """Model FLOPs of one forward+backward over rows of ``lengths`` real tokens whose last
    ``responses`` go through the LM head (what the update computes).

    6 x body parameters x all tokens (2 forward + 4 backward per parameter per token; the
    body is every parameter but the embedding table, whose lookup costs none, and an untied
    head) + 6 x head parameters (vocab x hidden) x response tokens + causal attention:
    QK^T and AV are each 2 x q_dim FLOPs per (query, key) pair per layer forward, 3 times
    that with the backward, over n (n + 1) / 2 pairs of a row of n tokens.
    """
    from mcgpo.policy.memory import parameter_count

    h, vocab = config.hidden_size, config.vocab_size
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q_dim = config.num_attention_heads * head_dim
    head = vocab * h
    body = parameter_count(config) - head - (0 if config.tie_word_embeddings else head)
    pairs = sum(n * (n + 1) // 2 for n in lengths)
    attention = 12 * config.num_hidden_layers * q_dim * pairs
    return 6.0 * body * sum(lengths) + 6.0 * head * sum(responses) + attention


def update_rows(part: Part) -> Any:
    """``update_rows`` rows of random tokens: prompts in ``prompt_range``, fixed response."""
    from mcgpo.rollout import TokenBatch

    s, rng = part.sizes, np.random.default_rng(0)
    vocab = len(part.tokenizer)
    prompts = [rng.integers(0, vocab, rng.integers(*s.prompt_range)).tolist()
               for _ in range(s.update_rows)]  # fmt: skip
    responses = [rng.integers(0, vocab, s.response).tolist() for _ in prompts]
    old = [[-float(rng.uniform(0.5, 3.0)) for _ in r] for r in responses]
    return TokenBatch.from_sequences(
        prompts, responses, old, pad_token_id=part.tokenizer.pad_token_id
    )


def update_config(part: Part, precision: str, compiled: str = "false") -> Any:
    """The update's TrainConfig: kl_coef 0, pi_old from the batch, ``train.compile``
    ``compiled`` where the field exists (part b: false, the eager baseline)."""
    from mcgpo.training.config import TrainConfig

    extra = {"compile": compiled} if has_field(TrainConfig, "compile") else {}
    return TrainConfig(micro_batch_size=part.sizes.micro, kl_coef=0.0, lr=1e-6,
                       precision=precision, old_logprobs="sampler", **extra)  # fmt: skip


def best_seconds(part: Part, fn: Callable[[], None]) -> tuple[float, float]:
    """(first call, best of the part's repeats after it) seconds; the peak memory is reset
    after the first call (allocator, kernels, AdamW state, compilation warm)."""
    part.sync()
    start = time.perf_counter()
    fn()
    part.sync()
    first = time.perf_counter() - start
    part.reset_peak()
    return first, throughput.best_times([fn], part.sizes.repeats, part.device)[0]


def part_update(part: Part) -> None:
    """update_policy against the raw forward+backward over the same tokens and head positions."""
    from mcgpo.policy import token_log_probs_and_entropy
    from mcgpo.policy.memory import plan
    from mcgpo.policy.precision import compute
    from mcgpo.training.build import build_optimizer
    from mcgpo.training.update import update_policy

    s = part.sizes
    model = part.model(torch.float32)  # fp32 master weights, bf16 autocast (PRECISION)
    batch = update_rows(part)
    cfg = update_config(part, PRECISION)
    advantages = np.random.default_rng(1).normal(size=len(batch)).astype(np.float32)
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay)
    chunk, entropy = cfg.logits_chunk or None, cfg.entropy_coef > 0

    def raw() -> None:  # the update's forward (head on response tokens), loss-free backward
        model.train()
        model.zero_grad(set_to_none=True)
        for rows in throughput.micro_batches(batch, s.micro):
            mb = batch.select(rows).to(part.device)
            with compute(cfg.precision, part.device):
                lp, ent = token_log_probs_and_entropy(
                    model, mb.input_ids, mb.attention_mask, with_entropy=entropy,
                    chunk_size=chunk, positions=mb.response_mask, unique_rows=False,
                )  # fmt: skip
            m = mb.response_mask
            loss = ((lp + cfg.entropy_coef * ent) * m).sum() / m.sum().clamp(min=1)
            loss.backward()
        model.zero_grad(set_to_none=True)

    def update() -> None:
        update_policy(model, optimizer, batch, advantages, cfg)

    t_raw = best_seconds(part, raw)[1]
    raw_peak = part.peak_gb()
    t_update = best_seconds(part, update)[1]
    update_peak = part.peak_gb()
    lengths = batch.attention_mask.sum(1).tolist()
    responses = batch.response_mask.sum(1).tolist()
    flops = train_flops(model.config, lengths, responses)
    shape = f"{s.update_rows} rows x {s.prompt_range[0]}-{s.prompt_range[1]} + {s.response} tokens"
    peak = part.peak_flops
    same = (f"same FLOPs for both: {flops / 1e12:.3g} TFLOP (6 x body params x {sum(lengths)} "
            f"tokens + 6 x head params x {sum(responses)} response tokens + causal attention) "
            f"/ {peak / 1e12:.0f} TFLOP/s")  # fmt: skip
    ratio = t_raw / t_update
    part.emit(
        ("fwd+bwd tok/s", num(sum(lengths) / t_raw),
         f"{shape}, micro {s.micro}, {PRECISION}; head on response tokens, no optimiser step"),
        ("fwd+bwd MFU %", num(100 * flops / t_raw / peak), same),
        ("update tok/s", num(sum(lengths) / t_update),
         "update_policy: kl_coef 0, pi_old from the batch, one AdamW step, eager layers"),
        ("update MFU %", num(100 * flops / t_update / peak),
         "eager layers (the 2026-12-04 baseline's path); compiled layers: part e"),
        ("update / fwd+bwd", f"{ratio:.2f}", goal(">= 0.80", ratio >= 0.8, part.judged)),
        ("padding share", f"{throughput.padding_share(batch, s.micro):.3f}",
         "length-sorted micro-batches"),
    )  # fmt: skip
    widest = max(lengths)
    predicted = plan(
        model.config, gpus=1, checkpointing=cfg.gradient_checkpointing, micro_rows=s.micro,
        row_tokens=widest, logits_chunk=cfg.logits_chunk, response_tokens=s.response, kl=False,
    ).update_gb  # fmt: skip
    within = abs(update_peak / predicted - 1) <= 0.10
    part.emit(
        ("update peak memory GB", num(update_peak), part.memory_kind),
        ("memory plan GB", num(predicted),
         f"mcgpo.policy.memory.plan: micro {s.micro} x {widest} tokens, no KL, no checkpointing"),
        ("measured / plan", f"{update_peak / predicted:.2f}",
         goal("within 10 %", within, part.judged) if part.device.type == "cuda"
         else "CPU RSS: not comparable"),
        ("fwd+bwd peak memory GB", num(raw_peak), f"{part.memory_kind}; no AdamW step"),
    )  # fmt: skip


def compiled_measures(precision: str) -> tuple[str, ...]:
    """Part e's rows for one precision: eager, then the same model with compiled layers."""
    return (f"update MFU %, {precision}, eager layers",
            f"update MFU %, {precision}, compiled layers",
            f"compiled / eager update speed, {precision}",
            f"first compiled update s, {precision}",
            f"graphs compiled, {precision}",
            f"update peak memory GB, {precision}, compiled layers")  # fmt: skip


def part_compiled(part: Part) -> None:
    """update_policy with eager decoder layers (``train.compile false``), then on the same
    model with its decoder layers compiled (regional compilation, dynamic shapes:
    ``mcgpo.policy.compile.compile_decoder_layers``, with ``train.compile true`` so that the
    update counts the graphs compiled), in bf16-mixed (fp32 master + bf16 autocast) and pure
    bf16; the same rows and FLOP count as part b."""
    batch = update_rows(part)
    advantages = np.random.default_rng(1).normal(size=len(batch)).astype(np.float32)
    lengths = batch.attention_mask.sum(1).tolist()
    flops = train_flops(part.config(), lengths, batch.response_mask.sum(1).tolist())
    for precision, dtype in COMPILED_VARIANTS:
        compiled_variant(part, precision, part.model(dtype), batch, advantages, flops)
        gc.collect()
        if part.device.type == "cuda":
            torch.cuda.empty_cache()


def compiled_variant(part: Part, precision: str, model: Any, batch: Any,
                     advantages: np.ndarray, flops: float) -> None:  # fmt: skip
    """One precision of part e: eager updates, then compiled ones on the same model."""
    from mcgpo.training.build import build_optimizer
    from mcgpo.training.config import TrainConfig
    from mcgpo.training.update import update_policy

    measures = compiled_measures(precision)
    eager_cfg = update_config(part, precision, "false")
    optimizer = build_optimizer(model, eager_cfg.lr, eager_cfg.weight_decay)
    graphs: list[float] = []

    def update(cfg: Any) -> None:
        metrics = update_policy(model, optimizer, batch, advantages, cfg)
        graphs.append(metrics.get("compile/graphs", float("nan")))

    eager = best_seconds(part, lambda: update(eager_cfg))[1]
    mfu = 100 * flops / eager / part.peak_flops
    part.emit((measures[0], num(mfu), f"{precision}, train.compile false, as part b"))
    if not has_field(TrainConfig, "compile"):
        part.missing("train.compile", *measures[1:])
        return
    from mcgpo.policy.compile import compile_decoder_layers

    graphs.clear()
    layers = compile_decoder_layers(model)  # for good; train.compile true counts the graphs
    compiled_cfg = update_config(part, precision, "true")
    first, best = best_seconds(part, lambda: update(compiled_cfg))
    mfu = 100 * flops / best / part.peak_flops
    target = ">= 40" if precision == PRECISION else "none (bf16-mixed: >= 40)"
    met = mfu >= 40 or precision != PRECISION
    part.emit(
        (measures[1], num(mfu), f"compile_decoder_layers: {layers} layers, one compiled "
         f"function; the same model and rows; {goal(target, met, part.judged)}"),
        (measures[2], f"{eager / best:.2f}", "eager seconds / compiled seconds"),
        (measures[3], f"{first:.1f}", f"compilation included; then {best:.3f} s"),
        (measures[4], num(graphs[0]), "compile/graphs of the first compiled update; "
         f"{num(sum(graphs[1:]))} in the {len(graphs) - 1} after it (goal 0)"),
        (measures[5], num(part.peak_gb()), part.memory_kind),
    )  # fmt: skip
