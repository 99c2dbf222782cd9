"""Part f of the device check (benchmarks/gpu/gpu_check.py): what training runs (issue 43).

Parts a, b and e measure the samplers and the update on one shape each, with bf16 weights
for sampling; a training run calls them otherwise. This part measures them as the trainer
calls them:

- the static sampler over fp32 master weights inside bf16 autocast (``train.precision
  bf16-mixed``; it samples from a bf16 copy, ``mcgpo.rollout.sampling_weights``), over
  three calls whose rows and prompt widths change and whose steps cross several 256-column
  buckets: each call's seconds (compilation included), its decode tok/s beside the dynamic
  sampler's on the same call, the graphs compiled so far (``rollout/compile_graphs``), and
  whether dynamo's recompile limit was reached (after which it runs eagerly);
- the update with gradient checkpointing and compiled decoder layers (the paper presets'
  combination): MFU eager and compiled, graphs, the gradients' gap to the eager layers';
- the update on FSDP2 with a world of one under bf16-mixed (its mixed-precision policy);
- the TF32 state after the trainer's runtime setup, and that
  ``torch.get_float32_matmul_precision()`` answers.

vLLM is not measured: the device image has no vLLM and its wheel is too large to carry;
the row says so.
"""

from __future__ import annotations

import os
import socket
import time

import numpy as np
import torch

from gpu_check_context import PRECISION, Part, goal, household_prompts, num, throughput
from gpu_check_update import best_seconds, train_flops, update_config, update_rows

CALLS = 3  # static sampler calls with other rows and widths


def static_measures(call: int) -> list[str]:
    return [f"static call {call} s, {PRECISION}", f"static call {call} tok/s",
            f"dynamic call {call} tok/s", f"static call {call} graphs so far"]  # fmt: skip


MEASURES = [
    *(m for call in range(1, CALLS + 1) for m in static_measures(call)),
    "static recompile limit reached", "static decode % of bound, slowest call",
    "update MFU %, checkpointing, eager layers", "update MFU %, checkpointing, compiled layers",
    "graphs compiled, checkpointing", "gradient gap / scale, compiled vs eager",
    "FSDP2 world 1 update MFU %, bf16-mixed", "TF32 on after setup", "vLLM on CUDA",
]  # fmt: skip


def part_training(part: Part) -> None:
    static_calls(part)
    checkpointed_update(part)
    fsdp_world_one(part)
    tf32_after_setup(part)
    part.emit(("vLLM on CUDA", "not run", "the device image has no vLLM and its wheel is too "
               "large to carry: vLLM on CUDA has never run (docs/rollout.md)"))  # fmt: skip


def _calls(part: Part, prompts: list[list[int]]) -> list[list[list[int]]]:
    """Three calls: all rows at the prompts' width, 5/8 of them at about twice the width,
    1/4 at about three times (rows 128 -> 80 -> 32 on the GPU: 128, 128, 32 cache rows)."""
    n = len(prompts)
    wider = [p + p[1:] for p in prompts]
    widest = [p + p[1:] + p[1:] for p in prompts]
    return [prompts, wider[: max(n * 5 // 8, 2)], widest[: max(n // 4, 1)]]


def static_calls(part: Part) -> None:
    """The static sampler as the trainer calls it, call by call, beside the dynamic one."""
    from mcgpo.policy.precision import compute
    from mcgpo.rollout import decode_step, sample, static_decode
    from mcgpo.rollout.sampling_weights import sampling_model

    if part.dry:  # dynamo's graphs without inductor's C++ compile on a CPU (minutes)
        decode_step.COMPILE_OPTIONS = {"backend": "eager", "dynamic": True}
    s, tok = part.sizes, part.tokenizer
    model = part.model(torch.float32)  # fp32 master weights, as bf16-mixed trains them
    common = {"temperature": 1.0, "max_new_tokens": s.new_tokens, "eos_token_id": [-1],
              "pad_token_id": tok.pad_token_id}  # fmt: skip
    slowest = float("inf")
    for call, prompts in enumerate(_calls(part, household_prompts(tok, s.rows)), start=1):
        measures = static_measures(call)
        tokens = len(prompts) * s.new_tokens
        width = max(map(len, prompts))
        buckets = -(-(width + s.new_tokens) // 256) - width // 256
        with compute(PRECISION, part.device):
            half, _ = sampling_model(model)
            part.sync()
            start = time.perf_counter()
            static_decode.sample_static(
                model, prompts, compile=True, generator=torch.Generator(part.device).manual_seed(0),
                **common,
            )  # fmt: skip
            part.sync()
            whole = time.perf_counter() - start
            times = {}
            for name, fn in (("static", static_decode.sample_static), ("dynamic", sample)):
                extra = {"compile": True} if name == "static" else {}
                gen = torch.Generator(part.device).manual_seed(0)
                part.sync()
                start = time.perf_counter()
                fn(model, prompts, generator=gen, **extra, **common)
                part.sync()
                times[name] = time.perf_counter() - start
        stats = decode_step.decode_compile_stats()
        mean = float(np.mean([len(p) for p in prompts]))
        bound = throughput.decode_bound(half, len(prompts), mean + s.new_tokens / 2, part.bandwidth)
        slowest = min(slowest, 100 * tokens / times["static"] / bound)
        where = (
            f"{len(prompts)} rows, widest prompt {width}, {s.new_tokens} new, {buckets} bucket(s)"
        )
        part.emit(
            (measures[0], f"{whole:.1f}", f"first call of this shape, compilation included; {where}"),
            (measures[1], num(tokens / times["static"]), "its second call, whole (prefill in)"),
            (measures[2], num(tokens / times["dynamic"]), "same prompts, whole call"),
            (measures[3], num(stats.get("rollout/compile_graphs", float("nan"))),
             "rollout/compile_graphs: dynamo's graphs of the decode step"),
        )  # fmt: skip
    hit = decode_step.decode_compile_stats().get("rollout/compile_limit_hit", float("nan"))
    part.emit(
        ("static recompile limit reached", num(hit),
         f"1: dynamo ran new shapes eagerly (limit {decode_step.RECOMPILE_LIMIT}); goal 0"),
        ("static decode % of bound, slowest call", num(slowest),
         "whole calls (prefill in: a lower bound); "
         + goal(">= 30 on every call", slowest >= 30, part.judged)),
    )  # fmt: skip


def checkpointed_update(part: Part) -> None:
    """update_policy with gradient checkpointing, eager then compiled layers, same model."""
    from mcgpo.policy import token_log_probs_and_entropy
    from mcgpo.policy.compile import compile_decoder_layers, compiled_graphs, eager_decoder_layers
    from mcgpo.policy.precision import compute
    from mcgpo.training.build import build_optimizer
    from mcgpo.training.update import update_policy

    model = part.model(torch.float32)
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    batch = update_rows(part)
    advantages = np.random.default_rng(1).normal(size=len(batch)).astype(np.float32)
    lengths = batch.attention_mask.sum(1).tolist()
    flops = train_flops(model.config, lengths, batch.response_mask.sum(1).tolist())
    mb = batch.select(np.arange(min(len(batch), part.sizes.micro))).to(part.device)

    def grads() -> dict[str, torch.Tensor]:
        model.train()
        model.zero_grad(set_to_none=True)
        with compute(PRECISION, part.device):
            lp, _ = token_log_probs_and_entropy(
                model, mb.input_ids, mb.attention_mask, positions=mb.response_mask
            )
        ((lp * mb.response_mask).sum() / mb.response_mask.sum()).backward()
        out = {n: p.grad.detach().float().clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        return out

    eager_grads = grads()
    eager_cfg = update_config(part, PRECISION, "false")
    optimizer = build_optimizer(model, eager_cfg.lr, eager_cfg.weight_decay)
    eager = best_seconds(
        part, lambda: update_policy(model, optimizer, batch, advantages, eager_cfg)
    )
    before = compiled_graphs()
    compile_decoder_layers(model)
    compiled_cfg = update_config(part, PRECISION, "true")
    first, best = best_seconds(
        part, lambda: update_policy(model, optimizer, batch, advantages, compiled_cfg)
    )
    graphs = compiled_graphs() - before
    eager_decoder_layers(model)
    # the gradients of the weights the steps above left, compiled and eager, same rows
    eager_grads = grads()
    compile_decoder_layers(model)
    compiled_grads = grads()
    eager_decoder_layers(model)
    scale = max(float(g.abs().max()) for g in eager_grads.values())
    gap = max(float((compiled_grads[n] - g).abs().max()) for n, g in eager_grads.items())
    mfu = 100 * flops / best / part.peak_flops
    part.emit(
        ("update MFU %, checkpointing, eager layers", num(100 * flops / eager[1] / part.peak_flops),
         "train.gradient_checkpointing true; model FLOPs (the recompute not counted)"),
        ("update MFU %, checkpointing, compiled layers", num(mfu),
         f"first compiled update {first:.1f} s; {goal('>= 40', mfu >= 40, part.judged)}"),
        ("graphs compiled, checkpointing", num(graphs), "compiled_graphs() over those updates"),
        ("gradient gap / scale, compiled vs eager", f"{gap / scale:.3g}",
         f"one micro-batch, bf16 autocast; scale {scale:.3g} (largest gradient entry)"),
    )  # fmt: skip


def fsdp_world_one(part: Part) -> None:
    """update_policy on an FSDP2 learner of one rank (bf16 gathered, fp32 reduced)."""
    import torch.distributed as dist

    from mcgpo.training.build import build_optimizer
    from mcgpo.training.learner import shard_policy
    from mcgpo.training.update import update_policy

    if not dist.is_initialized():
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        backend = "nccl" if part.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=0, world_size=1)
    model = part.model(torch.float32)
    learner = shard_policy(model, copy_model=False, precision=PRECISION)
    batch = update_rows(part)
    advantages = np.random.default_rng(1).normal(size=len(batch)).astype(np.float32)
    flops = train_flops(
        model.config, batch.attention_mask.sum(1).tolist(), batch.response_mask.sum(1).tolist()
    )
    cfg = update_config(part, PRECISION, "false")
    optimizer = build_optimizer(learner, cfg.lr, cfg.weight_decay)
    best = best_seconds(part, lambda: update_policy(learner, optimizer, batch, advantages, cfg))[1]
    part.emit(("FSDP2 world 1 update MFU %, bf16-mixed", num(100 * flops / best / part.peak_flops),
               "shard_policy with FSDP2's mixed-precision policy; eager layers; compare part b"))  # fmt: skip


def tf32_after_setup(part: Part) -> None:
    """The trainer's runtime setup (apply_runtime) on this device with train.tf32 true."""
    from mcgpo.training.config import RunConfig
    from mcgpo.training.runtime import apply_runtime

    apply_runtime(RunConfig(device=part.device.type))
    precision = torch.get_float32_matmul_precision()  # raised before issue 43's fix
    on = precision == "high" and torch.backends.cudnn.allow_tf32
    note = f"torch.get_float32_matmul_precision() = {precision!r}"
    part.emit(("TF32 on after setup", "1" if on else "0",
               note if part.device.type == "cuda" else f"{note}; CPU: TF32 is not set"))  # fmt: skip
