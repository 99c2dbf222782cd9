"""Preference pairs across verl's data-parallel ranks: verl's balancing alone vs with mcgpo's
pair layout (:mod:`mcgpo.integrations.verl.layout`), on batches of the MCGPO recipe's shape.

    .venv-verl/bin/python benchmarks/bench_verl_layout.py [--batches 5] [--pairs 300]

Each batch: 16 tasks x 8 trajectories of 3-50 turns (one row per turn, ~2,400 rows), prompts
growing with the turn up to 2,048 tokens, responses of 20-512 tokens, padded like verl to a
multiple of the global mini-batch (16 x 8 = 128 rows) with tiny rows; ``--pairs`` random pairs
inside task groups (the recipe's batches have a few hundred). verl's own
``get_seqlen_balanced_partitions`` (Karmarkar-Karp on ``calculate_workload``) assigns rows to
ranks; the layout then joins split pairs and spreads pairs over each rank's mini-batches.
Columns: the share of pairs on two ranks, and the heaviest rank's workload over the mean
(1.0000 = perfect balance), verl alone and with the layout; mean over batches.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_name


def recipe_batch(rng: np.random.Generator, pairs: int) -> tuple[np.ndarray, np.ndarray]:
    lens, group = [], []
    for g in range(16):
        for _ in range(8):
            for t in range(int(rng.integers(3, 51))):
                lens.append(
                    min(2048, 300 + 60 * t + int(rng.integers(0, 200))) + int(rng.integers(20, 513))
                )
                group.append(g)
    pad = -len(lens) % 128
    lens += [2] * pad
    group += [-1] * pad
    group_arr = np.array(group)
    partner = np.full(len(lens), -1, dtype=np.int64)
    for g in range(16):
        members = np.flatnonzero(group_arr == g)
        rows = rng.permutation(members)[: 2 * min(pairs // 16, len(members) // 2)]
        partner[rows[0::2]], partner[rows[1::2]] = rows[1::2], rows[0::2]
    return np.array(lens), partner


def main() -> None:
    import torch
    from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions

    from mcgpo.integrations.verl.layout import pair_layout

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--dp", type=int, nargs="+", default=[2, 4, 8, 16])
    args = parser.parse_args()
    print(
        f"machine: {cpu_name()}, {os.cpu_count()} cores, python {platform.python_version()}; "
        f"{args.batches} batches, {args.pairs} pairs each"
    )
    print(
        "| dp | rows | split, verl | split, layout | max/mean load, verl | with layout | rows moved | layout ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for dp in args.dp:
        acc = np.zeros(7)
        for b in range(args.batches):
            rng = np.random.default_rng(1000 * dp + b)
            lens, partner = recipe_batch(rng, args.pairs)
            work = calculate_workload(torch.as_tensor(lens)).numpy().astype(float)
            parts = get_seqlen_balanced_partitions(work.tolist(), k_partitions=dp, equal_size=True)
            order0 = np.array([j for p in parts for j in p])
            pos = np.empty(len(lens), dtype=np.int64)
            pos[order0] = np.arange(len(lens))
            partner_b = np.where(partner >= 0, pos[np.maximum(partner, 0)], -1)[order0]
            work_b = work[order0]
            start = time.perf_counter()
            order, stats = pair_layout(partner_b, work_b, dp, 128 // dp)
            ms = 1000 * (time.perf_counter() - start)
            loads0 = work_b.reshape(dp, -1).sum(1)
            loads1 = work_b[order].reshape(dp, -1).sum(1)
            acc += [
                len(lens), stats.split_before / stats.pairs, stats.split_after / stats.pairs,
                loads0.max() / loads0.mean(), loads1.max() / loads1.mean(), stats.moved, ms,
            ]  # fmt: skip
        m = acc / args.batches
        print(
            f"| {dp} | {m[0]:.0f} | {m[1]:.1%} | {m[2]:.1%} | {m[3]:.5f} | {m[4]:.5f} | "
            f"{m[5]:.0f} | {m[6]:.0f} |"
        )


if __name__ == "__main__":
    main()
