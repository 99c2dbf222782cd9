"""KV-cache samplers vs ``model.generate``: new tokens per second on one batch of 64 rows.

    python benchmarks/bench_sampler.py [--threads 1] [--new-tokens 32] [--repeats 3]
        [--bandwidth-gbs 20]

Both sample at temperature 1 (no top-k / top-p) from the tiny default policy (its tokenizer
trained on ``environment_corpus(("household",), episodes=256)``) on the same left-padded
batch of 64 household prompts, and both produce exactly ``--new-tokens`` tokens per row
(EOS disabled: ``min_new_tokens`` for generate, no EOS id for the sampler), so the work is
the same. Two batches:

- ``group turn 0``: 8 tasks x 8 siblings, the first batch of every group rollout (the 8
  siblings of a task share their prompt; the sampler runs each distinct prompt once);
- ``64 distinct``: 64 different states (tasks 0-63 after 0-3 expert steps), as in later turns.

Best of ``--repeats`` runs each, taking turns (the CPUs may be shared). The samplers also
return the per-token log-probs; generate returns only tokens. Timed: generate; the dynamic
sampler (``rollout.sampler = "dynamic"``) with one generator for the batch (one
``torch.multinomial`` per step) and with one generator per row (what ``collect`` does: each
row's uniforms drawn once per call, inverse CDF per step; ``rows/one`` is the ratio of their
speeds); and the static-cache sampler (``"static"``, per-row generators, uncompiled on the
CPU: its compiled decode step is for CUDA graphs). The last column is the static sampler's
share of the memory-bandwidth bound (weights + KV cache read once per decode step, at
``--bandwidth-gbs``; benchmarks/throughput.py), a GPU measure that on a CPU mostly shows how
far from memory-bound a tiny model is.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
import warnings

import torch

import mcgpo
from mcgpo.policy import build_tiny_policy
from mcgpo.rollout import encode_prompt, environment_corpus, render_prompt, sample
from mcgpo.rollout.static_decode import sample_static
from throughput import decode_bound


def household_prompts(tokenizer, *, distinct: bool) -> list[list[int]]:
    env = mcgpo.make_env("household")
    prompts = []
    for i in range(64):
        task = i if distinct else i // 8
        obs, past = env.reset(seed=task, split="train"), []
        for _ in range(i % 4 if distinct else 0):
            action = env.expert_action()
            past.append((obs.text, action))
            obs = env.step(action).observation
        prompts.append(encode_prompt(tokenizer, render_prompt(obs, past)))
    return prompts


def best_times(fns, repeats: int) -> list[float]:
    """Best wall time of each function; the functions take turns, so that a burst of load
    from other jobs on shared CPUs hits both alike."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bandwidth-gbs", type=float, default=20.0, help="for the bound")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    model, tok = build_tiny_policy(environment_corpus(("household",), episodes=256), seed=0)
    model.eval()
    new = args.new_tokens
    print(
        f"machine: {platform.machine()} {platform.processor() or ''} cpus={os.cpu_count()} "
        f"threads={args.threads} load={os.getloadavg()[0]:.1f} torch={torch.__version__} "
        f"date={datetime.date.today()}"
    )
    params = sum(p.numel() for p in model.parameters())
    print(f"model: tiny Qwen2 {params:,} parameters, vocab {len(tok)}; {new} new tokens per row")
    print(
        f"{'batch':<15} {'prompt mean/max':>16} {'generate tok/s':>15} {'sampler tok/s':>14} "
        f"{'ratio':>6} {'per-row gen tok/s':>18} {'rows/one':>8} {'static tok/s':>13} "
        f"{'% of bound':>10}"
    )
    for name, distinct in (("group turn 0", False), ("64 distinct", True)):
        prompts = household_prompts(tok, distinct=distinct)
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1

        def ours(prompts=prompts):
            sample(
                model, prompts, temperature=1.0, max_new_tokens=new, eos_token_id=[-1],
                pad_token_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0),
            )  # fmt: skip

        def ours_rows(prompts=prompts):
            sample(
                model, prompts, temperature=1.0, max_new_tokens=new, eos_token_id=[-1],
                pad_token_id=tok.pad_token_id,
                generator=[torch.Generator().manual_seed(i) for i in range(len(prompts))],
            )  # fmt: skip

        def static(prompts=prompts):
            sample_static(
                model, prompts, temperature=1.0, max_new_tokens=new, eos_token_id=[-1],
                pad_token_id=tok.pad_token_id,
                generator=[torch.Generator().manual_seed(i) for i in range(len(prompts))],
            )  # fmt: skip

        def hf(ids=ids, mask=mask):
            with torch.inference_mode():
                model.generate(
                    ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                    top_p=1.0, min_new_tokens=new, max_new_tokens=new,
                    pad_token_id=tok.pad_token_id,
                )  # fmt: skip

        tokens = len(prompts) * new
        t_hf, t_ours, t_rows, t_static = best_times([hf, ours, ours_rows, static], args.repeats)
        lengths = [len(p) for p in prompts]
        mean = sum(lengths) / len(lengths)
        bound = decode_bound(model, len(prompts), mean + new / 2, args.bandwidth_gbs * 1e9)
        print(
            f"{name:<15} {mean:>9.0f} / {max(lengths):<4} "
            f"{tokens / t_hf:>15,.0f} {tokens / t_ours:>14,.0f} {t_hf / t_ours:>5.2f}x "
            f"{tokens / t_rows:>18,.0f} {t_ours / t_rows:>7.2f}x "
            f"{tokens / t_static:>13,.0f} {100 * tokens / t_static / bound:>9.2f}%"
        )


if __name__ == "__main__":
    main()
