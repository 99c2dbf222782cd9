"""One policy update, full fine-tuning against LoRA (train.lora_rank), as a table.

For each model and setup, in a fresh process (so that one setup's allocations do not shape
another's peak): build the model, then time ``update_policy`` on a fixed batch of random
tokens (``--rows`` rows of ``--prompt`` prompt and ``--response`` response tokens, micro-
batches of ``--micro``, KL to the reference on, AdamW, fp32 on the CPU): one warm-up update,
then the best of ``--repeats`` (other processes on a shared machine only ever add time).

Columns: trainable parameters; seconds of one update (the best); peak memory during setup
and updates above the resident memory with the model built (the reference copy of full
fine-tuning, the AdamW moments, gradients and activations: what the setups differ in; Linux
``VmHWM`` after ``/proc/self/clear_refs``, or on CUDA ``torch.cuda.max_memory_allocated``
above the allocation before); the AdamW state's exact bytes; the reference's bytes (a frozen
copy for full fine-tuning; 0 with LoRA: the base with the adapters off).

One thread by default (``--threads``): on a shared 2-core machine two OpenMP threads are
hurt by preemption far more than one (measured beside other load: the tiny model's full
update took 3.1 s with 2 threads, 0.28-0.34 s with 1).

Models: ``tiny`` (mcgpo's default CPU policy, about 0.6 M parameters) and ``qwen-100m``, a
Qwen2.5-shaped model built from a config with random weights (hidden 768, 12 layers, 12
heads, 2 KV heads, MLP 2048, vocabulary 32,000, tied embeddings: 98 M parameters).

    python benchmarks/bench_lora.py                       # the table in docs/lora.md
    python benchmarks/bench_lora.py --models tiny --ranks 8 --repeats 1
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np
import torch

QWEN_100M = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=32_000)  # fmt: skip


def build(name: str) -> Any:
    """The model ``name`` (random weights, seed 0), float32 on the CPU."""
    from transformers import AutoModelForCausalLM

    from mcgpo.policy.shapes import shaped_config
    from mcgpo.policy.tiny import tiny_model, train_tokenizer

    torch.manual_seed(0)
    if name == "tiny":
        texts = ["go to fridge 1", "open drawer 2", "take mug 1 from table 1"] * 50
        return tiny_model(train_tokenizer(texts, vocab_size=1024), seed=0)
    if name == "qwen-100m":
        return AutoModelForCausalLM.from_config(shaped_config("qwen2.5-1.5b", **QWEN_100M))
    raise SystemExit(f"unknown model {name!r}; expected tiny or qwen-100m")


def batch(model: Any, rows: int, prompt: int, response: int) -> Any:
    from mcgpo.policy import token_log_probs
    from mcgpo.rollout.tokens import TokenBatch

    gen = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    prompts = [torch.randint(3, vocab, (prompt,), generator=gen).tolist() for _ in range(rows)]
    answers = [torch.randint(3, vocab, (response,), generator=gen).tolist() for _ in range(rows)]
    out = TokenBatch.from_sequences(prompts, answers, [[0.0] * response] * rows, pad_token_id=0)
    with torch.no_grad():
        old = token_log_probs(model, out.input_ids, out.attention_mask)
    return dataclasses.replace(out, old_log_probs=torch.where(out.response_mask, old, 0.0))


def _kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def one(name: str, rank: int, args: argparse.Namespace) -> dict[str, float]:
    """Measure one setup in this process (``rank`` 0 = full fine-tuning)."""
    import peft  # noqa: F401  (its import is library memory, not the setup's: before the baseline)

    from mcgpo.policy.lora import AdaptersOff, add_lora, trainable_count
    from mcgpo.training.build import build_optimizer
    from mcgpo.training.config import TrainConfig
    from mcgpo.training.update import update_policy

    torch.set_num_threads(args.threads)
    model = build(name)
    data = batch(model, args.rows, args.prompt, args.response)
    cuda = torch.cuda.is_available()
    if cuda:
        model, data = model.cuda(), data.to("cuda")
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # VmHWM := the current resident size
        before = _kib("VmRSS") * 1024
    if rank:
        targets = TrainConfig().lora_targets
        add_lora(model, rank=rank, alpha=2.0 * rank, dropout=0.0, targets=targets, seed=0)
        reference: Any = AdaptersOff(model)
        ref_bytes = 0
    else:
        reference = copy.deepcopy(model).eval().requires_grad_(False)
        ref_bytes = sum(p.numel() * p.element_size() for p in reference.parameters())
    cfg = TrainConfig(micro_batch_size=args.micro, kl_coef=0.01, lr=1e-5)
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay)
    adv = np.linspace(-1.0, 1.0, args.rows, dtype=np.float32)
    times = []
    for _ in range(1 + args.repeats):  # the first is the warm-up
        start = time.perf_counter()
        update_policy(model, optimizer, data, adv, cfg, ref_model=reference)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if cuda else _kib("VmHWM") * 1024
    state = sum(
        t.numel() * t.element_size()
        for s in optimizer.state.values()
        for t in s.values()
        if torch.is_tensor(t)
    )
    return {
        "trainable": float(trainable_count(model)),
        "params": float(sum(p.numel() for p in model.parameters())),
        "seconds": min(times[1:]),
        "peak_mib": (peak - before) / 2**20,
        "adam_mib": state / 2**20,
        "ref_mib": ref_bytes / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,qwen-100m")
    parser.add_argument("--ranks", default="16", help="LoRA ranks to compare with full")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=96)
    parser.add_argument("--response", type=int, default=32)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "RANK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args)))
        return
    from machine import cpu_name

    print(
        f"One update (fp32, {args.rows} rows x {args.prompt}+{args.response} tokens, micro-"
        f"batches of {args.micro}, KL on, AdamW), best of {args.repeats} after a warm-up; "
        f"{cpu_name()}, {args.threads} thread{'' if args.threads == 1 else 's'}, torch {torch.__version__}, "
        f"{datetime.date.today()}"
    )
    print()
    head = ["model", "setup", "params", "trainable", "s / update", "peak MiB above model",
            "AdamW state MiB", "reference MiB"]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    here = os.path.dirname(os.path.abspath(__file__))
    flags = [f"--{k}={getattr(args, k)}" for k in
             ("rows", "prompt", "response", "micro", "repeats", "threads")]  # fmt: skip
    for name in args.models.split(","):
        for rank in [0, *map(int, args.ranks.split(","))]:
            cmd = [sys.executable, os.path.join(here, "bench_lora.py"), *flags,
                   "--one", name, str(rank)]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                raise SystemExit(out.stderr.strip().splitlines()[-1])
            r = json.loads(out.stdout.strip().splitlines()[-1])
            setup = "full" if rank == 0 else f"LoRA r={rank}"
            print(
                f"| {name} | {setup} | {r['params'] / 1e6:.2f} M | {r['trainable'] / 1e6:.3f} M"
                f" | {r['seconds']:.2f} | {r['peak_mib']:.0f} | {r['adam_mib']:.1f} | "
                f"{r['ref_mib']:.1f} |"
            )


if __name__ == "__main__":
    main()
