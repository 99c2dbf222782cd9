"""Time and memory of one training update (household-quick, 16 x 8 rollouts), as tables.

1. Split: the first ``--updates`` updates of an MCGPO run from a warm-started policy, each
   timed by phase: rollout (sampling + environments), credit (advantages + preferences),
   update (the PPO update with the pair loss). Target (issue 6): one household-quick update
   within 60 s on 2 cores.
2. MCGPO against GraphGPO, same seed and config: the first batch is collected once, then
   both updates run on it from the same starting weights and optimiser state, alternating
   G, M, G, M, ... ``--repeats`` times (background load hits both alike; the best run of
   each is kept, other processes on a shared machine only ever add time). MCGPO's advantages
   are GraphGPO's, so the difference is the preference building, the pair loss and its
   micro-batch layout. Time per update = the shared rollout + the algorithm's credit +
   its update. Targets: time ratio <= 1.03, peak memory ratio <= 1.02. A warm-started tiny
   policy that rarely succeeds yields few preferences, so a third column runs MCGPO's
   update with the cap of 4 pairs in every task group (64 pairs: first decisions of slots
   s and s + 4) to show the cost of the pair loss itself.

Memory: before each measured phase the kernel's peak-RSS counter is reset
(``echo 5 > /proc/self/clear_refs``, Linux >= 4.0), so ``VmHWM`` afterwards is the peak
resident memory during that phase: the whole process (libraries, model, optimiser state,
the batch) plus what the phase allocates. The table also gives the increment over the
resident memory just before the phase, the part an algorithm can change. tracemalloc would
not see torch's tensor memory (allocated outside Python's allocator); on a GPU the script
reports ``torch.cuda.max_memory_allocated`` instead. The pair loss adds per-row scalars (d)
and per-pair softplus terms, far below a micro-batch's activations, so both ratios should
be about 1. Resident-memory peaks also move with the allocator's history (freed memory is
kept or returned to the system depending on earlier allocations), so the table adds a
deterministic proxy of activation memory: the token slots (rows x padded length) of the
largest micro-batch.

3. Efficiency (issue 16): tokens/s (all real tokens of the rows) of ``update_policy`` on the
   first batch against the raw forward+backward of the same model on the same rows in the
   same length-sorted micro-batches (benchmarks/throughput.py; no optimiser step, no
   reference model). Goal: update >= 80 % of raw. Two update columns: ``kl_coef = 0`` (the
   same work plus the loss terms, entropy and one AdamW step) and the preset's ``kl_coef``
   (adds a forward pass of the frozen reference, about half a forward+backward's cost more).
   Also the padding share of the micro-batches and, on CUDA, MFU (6 x params x tokens / s /
   ``--peak-tflops``).

Run:  python benchmarks/bench_update.py [--model runs/main/sft/model] [--repeats 5]
      [--updates 3] [--efficiency-only] [--groups 16]
Without a warm-started model it first runs ``mcgpo sft --preset household-quick`` into
``runs/bench-sft`` (an untrained policy would play 15-turn episodes of noise).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import os
import platform
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mcgpo.rollout import collect
from mcgpo.training.algorithms import assign_credit, resolve_algo
from mcgpo.training.build import (
    build_optimizer,
    collect_options,
    env_factory,
    load_model,
    response_format_for,
    rollout_seed,
    typed_env_options,
)
from mcgpo.training.config import RunConfig
from mcgpo.training.config_layout import from_dict
from mcgpo.training.presets import load_preset
from mcgpo.training.runtime import apply_runtime
from mcgpo.training.update import PairBatch, update_policy
from throughput import mfu, update_efficiency


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class Meter:
    """Seconds, peak memory and memory increment (MiB) of one phase."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.seconds = self.peak_mib = self.extra_mib = 0.0

    @contextmanager
    def measure(self) -> Iterator[None]:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated() / 2**20
        else:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # reset VmHWM to the current resident size
            before = _status_kib("VmRSS") / 1024
        start = time.perf_counter()
        yield
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - start
        if self.cuda:
            self.peak_mib = torch.cuda.max_memory_allocated() / 2**20
        else:
            self.peak_mib = _status_kib("VmHWM") / 1024
        self.extra_mib = self.peak_mib - before


def config(model: str, seed: int, threads: int, algo: str, groups: int = 0) -> RunConfig:
    cfg = from_dict(load_preset("household-quick"), where="household-quick")
    cfg = dataclasses.replace(cfg, model=model, seed=seed, threads=threads)
    if groups:
        cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, groups=groups))
    return dataclasses.replace(
        cfg,
        algo=resolve_algo(dataclasses.replace(cfg.algo, name=algo), cfg.rollout.group_size),
        env=dataclasses.replace(cfg.env, options=typed_env_options(cfg)),
    )


def collect_batch(policy: Any, tokenizer: Any, cfg: RunConfig, update: int) -> Any:
    groups = cfg.rollout.groups
    options = collect_options(
        cfg, response_format_for(cfg, tokenizer), split=cfg.env.train_split,
        temperature=cfg.rollout.temperature, group_size=cfg.rollout.group_size,
        seed=rollout_seed(cfg.seed, update),
    )  # fmt: skip
    tasks = list(range((update - 1) * groups, update * groups))
    return collect(policy, tokenizer, env_factory(cfg), tasks, options)


def stress_pairs(table: Any) -> dict[str, np.ndarray]:
    """4 pairs per group: the first decisions of slots s and s + 4 (s = 0..3), weight 1."""
    first = np.flatnonzero(table.turn == 0)
    key = {(int(table.group[i]), int(table.slot[i])): int(i) for i in first}
    plus, minus = [], []
    for (g, slot), row in sorted(key.items()):
        if slot < 4 and (g, slot + 4) in key:
            plus.append(row)
            minus.append(key[(g, slot + 4)])
    n = len(plus)
    return {
        "plus": np.asarray(plus, dtype=np.int64),
        "minus": np.asarray(minus, dtype=np.int64),
        "weight": np.ones(n),
        "level": np.full(n, "exact", dtype=object),
    }


def run_update(policy, optimizer, ref, tokens, credit, cfg, groups) -> dict[str, float]:
    return update_policy(
        policy, optimizer, tokens, credit.advantages, cfg.train,
        pairs=PairBatch(credit.plus, credit.minus, credit.weight),
        lambda_pair=cfg.algo.lambda_pair, ref_model=ref, groups=groups,
    )  # fmt: skip


def ensure_model(path: str) -> str:
    if Path(path, "config.json").is_file():
        return path
    out = Path("runs/bench-sft")
    if not (out / "model" / "config.json").is_file():
        print(f"no model at {path}: warm-starting one into {out} (mcgpo sft, household-quick)")
        subprocess.run(
            ["mcgpo", "sft", "--preset", "household-quick", "--out", str(out),
             "--progress", "false"],
            check=True,
        )  # fmt: skip
    return str(out / "model")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="runs/main/sft/model")
    parser.add_argument("--repeats", type=int, default=5, help="G/M alternations (part 2)")
    parser.add_argument("--updates", type=int, default=3, help="MCGPO updates timed (part 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--groups", type=int, default=0, help="tasks per batch; 0 = preset")
    parser.add_argument("--efficiency-only", action="store_true", help="part 3 only")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="MFU on CUDA")
    args = parser.parse_args()
    model_path = ensure_model(args.model)
    cfgs = {
        a: config(model_path, args.seed, args.threads, a, args.groups)
        for a in ("graphgpo", "mcgpo")
    }
    cfg = cfgs["mcgpo"]
    apply_runtime(cfg)
    cuda = cfg.device.startswith("cuda")
    policy, tokenizer = load_model(cfg)
    ref = copy.deepcopy(policy).eval().requires_grad_(False)
    optimizer = build_optimizer(policy, cfg.train.lr, cfg.train.weight_decay)
    start_weights = copy.deepcopy(policy.state_dict())
    start_optim = copy.deepcopy(optimizer.state_dict())
    meter = Meter(cuda)

    # 2. MCGPO against GraphGPO on the first batch, from the same weights.
    with meter.measure():
        first = collect_batch(policy, tokenizer, cfg, 1)
    t_rollout = meter.seconds
    learnable = first.learnable()
    table, tokens = learnable.table, learnable.tokens
    if args.efficiency_only:
        advantages = assign_credit(table, cfg.algo).advantages
        efficiency(policy, ref, tokens, advantages, cfg, table.group, args, model_path)
        return
    credit, t_credit = {}, {}
    for algo, c in cfgs.items():
        with meter.measure():
            credit[algo] = assign_credit(table, c.algo)
        t_credit[algo] = meter.seconds
    # stress: MCGPO's cap of 4 pairs per task group, so the pair loss's own cost shows
    credit["stress"] = dataclasses.replace(credit["mcgpo"], **stress_pairs(table))
    t_credit["stress"] = t_credit["mcgpo"]
    cfgs_run = {**cfgs, "stress": cfgs["mcgpo"]}
    best: dict[str, dict[str, float]] = {a: {} for a in cfgs_run}
    for _ in range(args.repeats):
        for algo, c in cfgs_run.items():
            policy.load_state_dict(start_weights)
            optimizer.load_state_dict(start_optim)
            with meter.measure():
                stats = run_update(policy, optimizer, ref, tokens, credit[algo], c, table.group)
            b = best[algo]
            b["update"] = min(b.get("update", np.inf), meter.seconds)
            b["peak"] = min(b.get("peak", np.inf), meter.peak_mib)
            b["extra"] = min(b.get("extra", np.inf), meter.extra_mib)
            b["pairs"] = stats.get("pairs/used", 0.0)
            b["widest"] = stats["update/max_micro_tokens"]

    # 1. The split of an MCGPO run's first updates (update 1 reuses the batch above).
    policy.load_state_dict(start_weights)
    optimizer.load_state_dict(start_optim)
    split = []
    for update in range(1, args.updates + 1):
        if update == 1:
            rollout, rollout_s = first, t_rollout
        else:
            with meter.measure():
                rollout = collect_batch(policy, tokenizer, cfg, update)
            rollout_s = meter.seconds
        keep = np.flatnonzero(~rollout.table.errored)
        table_u, tokens_u = rollout.table.select(keep), rollout.tokens.select(keep)
        with meter.measure():
            credit_u = assign_credit(table_u, cfg.algo)
        credit_s = meter.seconds
        with meter.measure():
            stats = run_update(policy, optimizer, ref, tokens_u, credit_u, cfg, table_u.group)
        split.append(
            (update, len(table_u), int(tokens_u.response_mask.sum()),
             int(tokens_u.attention_mask.sum()), stats.get("pairs/used", 0.0),
             rollout.stats["success_rate"], rollout_s, credit_s, meter.seconds)
        )  # fmt: skip

    print(f"# bench_update: household-quick (16 x 8 rollouts), model {model_path}")
    print(
        f"# {datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {args.threads} threads, device {cfg.device}; "
        "other processes on a shared machine only add time"
    )
    print("\n## 1. One MCGPO update, split by phase\n")
    print(
        "| update | rows | response tokens | all tokens | pairs | train success | "
        "rollout s | credit s | update s | total s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for u, rows, resp, seq, pairs, succ, r_s, c_s, u_s in split:
        print(
            f"| {u} | {rows} | {resp} | {seq} | {pairs:.0f} | {succ:.3f} | {r_s:.1f} | "
            f"{c_s:.2f} | {u_s:.1f} | {r_s + c_s + u_s:.1f} |"
        )
    worst = max(r_s + c_s + u_s for *_, r_s, c_s, u_s in split)
    print(f"\nslowest update: {worst:.1f} s (target <= 60 s)")

    print(f"\n## 2. MCGPO / GraphGPO on the same first batch (best of {args.repeats})\n")
    print("| | GraphGPO | MCGPO | ratio | MCGPO, 4 pairs per group (stress) | ratio |")
    print("|---|---|---|---|---|---|")
    g, m, x = best["graphgpo"], best["mcgpo"], best["stress"]
    total = {a: t_rollout + t_credit[a] + best[a]["update"] for a in best}
    unit = "MiB (GPU)" if cuda else "MiB (RSS)"
    rows = [
        ("pairs in the pair loss", "pairs", "{:.0f}", False),
        ("update s", "update", "{:.2f}", True),
        ("peak memory of the update, " + unit, "peak", "{:.0f}", True),
        ("memory the update adds (allocator-dependent), " + unit, "extra", "{:.0f}", True),
        ("largest micro-batch, rows x padded length", "widest", "{:.0f}", True),
    ]
    for label, key, fmt, ratio in rows:
        cells = [fmt.format(g[key]), fmt.format(m[key])]
        cells.insert(2, f"{m[key] / g[key]:.3f}" if ratio and g[key] else "")
        cells.append(fmt.format(x[key]))
        cells.append(f"{x[key] / g[key]:.3f}" if ratio and g[key] else "")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print(
        f"| time per update s (rollout {t_rollout:.1f} s shared; credit "
        f"{t_credit['graphgpo']:.3f} / {t_credit['mcgpo']:.3f} s) | {total['graphgpo']:.2f} | "
        f"{total['mcgpo']:.2f} | {total['mcgpo'] / total['graphgpo']:.3f} | "
        f"{total['stress']:.2f} | {total['stress'] / total['graphgpo']:.3f} |"
    )
    print("\ntargets: time per update ratio <= 1.03, peak memory ratio <= 1.02")
    efficiency(policy, ref, tokens, credit["mcgpo"].advantages, cfg, table.group, args, None)


def efficiency(policy, ref, tokens, advantages, cfg, groups, args, header) -> None:
    """Part 3: update_policy vs the raw forward+backward on the first batch's rows."""
    cuda = cfg.device.startswith("cuda")
    no_kl = dataclasses.replace(cfg.train, kl_coef=0.0)
    plain = update_efficiency(policy, tokens, advantages, no_kl, repeats=args.repeats,
                              groups=groups)  # fmt: skip
    with_kl = update_efficiency(policy, tokens, advantages, cfg.train, repeats=args.repeats,
                                ref_model=ref, groups=groups)  # fmt: skip
    if header:
        print(f"# bench_update part 3: household-quick, model {header}")
        print(
            f"# {datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores, "
            f"torch {torch.__version__}, {args.threads} threads, device {cfg.device}"
        )
    params = sum(p.numel() for p in policy.parameters())
    print(f"\n## 3. Update efficiency on the first batch (best of {args.repeats})\n")
    print(
        f"{len(tokens)} rows, {plain['tokens']:.0f} real tokens, micro-batches of "
        f"{cfg.train.micro_batch_size} rows, padding share {plain['padding']:.3f}\n"
    )
    print("| | tokens/s | of raw fwd+bwd | MFU |")
    print("|---|---|---|---|")
    runs = [
        ("raw forward+backward", plain["raw_tok_s"], plain["raw_s"]),
        ("update_policy, kl_coef 0", plain["update_tok_s"], plain["update_s"]),
        (f"update_policy, kl_coef {cfg.train.kl_coef} (+ reference forward)",
         with_kl["update_tok_s"], with_kl["update_s"]),
    ]  # fmt: skip
    for label, rate, seconds in runs:
        util = mfu(params, plain["tokens"], seconds, args.peak_tflops * 1e12) if cuda else None
        cell = f"{100 * util:.1f} %" if util is not None else "(CUDA only)"
        print(f"| {label} | {rate:,.0f} | {rate / plain['raw_tok_s']:.2f} | {cell} |")
    print("\ngoal: update_policy >= 0.80 of the raw forward+backward (kl_coef 0: the same work)")


if __name__ == "__main__":
    main()
