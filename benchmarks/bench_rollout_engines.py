"""Rollout engines on the same prompts: mcgpo's dynamic and static samplers vs vLLM.

    .venv-vllm/bin/python benchmarks/bench_rollout_engines.py [--sizes tiny,medium]
        [--rows 64] [--new-tokens 32] [--repeats 2] [--threads 0]

Runs in the vLLM venv (``MCGPO_VENV=.venv-vllm MCGPO_EXTRAS=vllm bash scripts/setup.sh``).
Each size is a Qwen2-shape policy folder built here (random weights, a tokenizer trained on
household text): ``tiny`` is mcgpo's tiny policy (hidden 128 x 2 layers, head size 32),
``medium`` a ~100 M one (hidden 768 x 12 layers, 12 heads of 64). The batch: ``--rows``
household prompts (tasks 0.. after 0-3 expert steps, all distinct), one response each at
temperature 1 with one generator per row (what ``collect`` passes), the action format's
stop string ``\\n`` and the folder's EOS ids, at most ``--new-tokens`` tokens. Tokens/s
counts the tokens each engine returned (responses may end early at EOS or a stop string;
with random weights few do, so the engines' counts differ a little: the table prints each
engine's). Best of ``--repeats`` timed calls after one warm-up call; vLLM's prefix cache is
reset before every call, so that no call reuses the KV of a prompt an earlier call
prefilled (the HF samplers have no such cache: every call prefills every prompt). After
each size, the fastest engine and its margin over the next, as measured.

Start-up: for the HF samplers, loading the folder; for vLLM, building the engine (its
processes, weights, KV cache; eager, as ``mcgpo train`` does on a CPU), after ``import
vllm`` (timed apart). fp32 throughout.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time
import warnings
from pathlib import Path

import torch

import mcgpo
from machine import cpu_name
from mcgpo.policy import build_tiny_policy, load_policy, save_policy
from mcgpo.policy.shapes import save_shaped_folder
from mcgpo.rollout import encode_prompt, environment_corpus, render_prompt, sample
from mcgpo.rollout.static_decode import sample_static

MEDIUM = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
              num_attention_heads=12, num_key_value_heads=2, vocab_size=1100)  # fmt: skip


def household_prompts(tokenizer, rows: int) -> list[list[int]]:
    env = mcgpo.make_env("household")
    prompts = []
    for i in range(rows):
        obs, past = env.reset(seed=i, split="train"), []
        for _ in range(i % 4):
            action = env.expert_action()
            past.append((obs.text, action))
            obs = env.step(action).observation
        prompts.append(encode_prompt(tokenizer, render_prompt(obs, past, response_format="action")))
    return prompts


def build_folder(size: str, root: Path, texts: list[str]) -> Path:
    if size == "tiny":
        model, tok = build_tiny_policy(texts, seed=0)
        return save_policy(model, tok, root / "tiny")
    return save_shaped_folder(root / "medium", "qwen2.5-1.5b", texts, seed=0, **MEDIUM)


def timed(fn, repeats: int, before=None) -> tuple[float, int]:
    """(best seconds, tokens returned) of ``repeats`` calls after a warm-up call;
    ``before`` runs untimed ahead of every call (vLLM: the prefix-cache reset)."""
    if before is not None:
        before()
    fn()
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
        tokens = sum(len(r) for r in out.response_ids)
    return best, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,medium")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 = all cores")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    start = time.perf_counter()
    import vllm

    t_import = time.perf_counter() - start
    print(
        f"machine: {cpu_name()} ({platform.machine()}), cpus={os.cpu_count()} "
        f"threads={threads} load={os.getloadavg()[0]:.1f} torch={torch.__version__} "
        f"vllm={vllm.__version__} date={datetime.date.today()}; import vllm {t_import:.1f} s"
    )
    print(f"batch: {args.rows} distinct household prompts, <= {args.new_tokens} new tokens, T = 1")
    print(
        f"{'model':<22} {'engine':<16} {'start-up s':>10} {'tokens':>7} {'tok/s':>8} "
        f"{'vs dynamic':>10}"
    )
    texts = environment_corpus(("household",), episodes=256)
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            label, results = bench_size(size, build_folder(size, Path(tmp), texts), args)
            base = results[0][2] / results[0][3]
            for name, t0, n, t in results:
                print(
                    f"{label:<22} {name:<16} {t0:>10.1f} {n:>7} {n / t:>8,.0f} {n / t / base:>9.2f}x"
                )
            print(winner(label, results))


def winner(label: str, results: list[tuple]) -> str:
    """The fastest engine (tokens/s) at this size and its margin over the runner-up."""
    ranked = sorted(results, key=lambda r: r[2] / r[3], reverse=True)
    (first, _, n1, t1), (second, _, n2, t2) = ranked[0], ranked[1]
    return f"  -> {label}: {first} wins, {n1 / t1 / (n2 / t2):.2f}x {second} (tokens/s)"


def bench_size(size: str, folder: Path, args: argparse.Namespace) -> tuple[str, list[tuple]]:
    """(label, [(engine, start-up s, tokens, best s)]) for one policy folder."""
    from mcgpo.rollout.vllm_engine import VLLMEngine

    clock = time.perf_counter()
    model, tok = load_policy(folder)
    t_load = time.perf_counter() - clock
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    prompts = household_prompts(tok, args.rows)
    from mcgpo.rollout.group_rollout import eos_ids

    eos = eos_ids(model, tok)  # what collect uses
    kw = dict(
        temperature=1.0, max_new_tokens=args.new_tokens, eos_token_id=eos,
        pad_token_id=tok.pad_token_id, stop_strings=("\n",), tokenizer=tok,
    )  # fmt: skip

    def gens():
        return [torch.Generator().manual_seed(i) for i in range(len(prompts))]

    results = []
    for name, fn in (("mcgpo dynamic", sample), ("mcgpo static", sample_static)):
        t, n = timed(lambda fn=fn: fn(model, prompts, generator=gens(), **kw), args.repeats)
        results.append((name, t_load, n, t))
    clock = time.perf_counter()
    engine = VLLMEngine(folder, max_model_len=max(map(len, prompts)) + args.new_tokens, seed=0)
    t_start = time.perf_counter() - clock
    try:
        sample_vllm = lambda: engine.sample(prompts, generator=gens(), **kw)  # noqa: E731
        t, n = timed(sample_vllm, args.repeats, before=engine.llm.reset_prefix_cache)
    finally:
        engine.close()
    results.append(("vllm (eager)", t_start, n, t))
    return f"{size} ({params / 1e6:.1f} M)", results


if __name__ == "__main__":
    main()
