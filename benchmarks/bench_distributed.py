"""Time per training update, and its split, at 1 and 2 processes (torch.distributed, gloo).

    python benchmarks/bench_distributed.py [--preset household-quick] [--procs 1 2]
                                            [--sharding ddp fsdp2] [--updates 3]
                                            [--set KEY=VALUE ...]

Runs ``mcgpo train --nproc P`` (P = 1: the single process) for each P with evaluation and
checkpoints off, reads ``metrics.jsonl`` of each run and prints, per P, the mean seconds of
an update and of its parts over the updates after the first (the first pays for warm-up):
rollout (sampling plus environment steps on the rank), credit (advantages and pairs),
update (forward, backward, DDP all-reduce, optimiser). Each P > 1 runs once per
``--sharding`` (``train.sharding``: ddp, and fsdp2 whose update also all-gathers the
parameters in every forward and backward, reduce-scatters the gradients and all-gathers
the new weights into the sampler's replica after each step); P = 1 once (no sharding in
one process). With P ranks each rank plays G/P groups; ``time/*`` of a multi-process
update is its slowest rank. The wall time of a whole run (start-up, rendezvous, tokenizer
corpus) is printed too.

On a 2-core machine two processes share the two cores with their torch threads
(torchrun sets ``OMP_NUM_THREADS=1`` per process), so the gain is what splitting the
sampler's batch and the environments across processes buys against one process using both
cores for its matrix products.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from machine import cpu_name

PARTS = ("time/rollout", "time/credit", "time/update")


def run_training(
    preset: str, procs: int, sharding: str, updates: int, extra: list[str], out: Path
) -> float:
    """One ``mcgpo train`` run in ``out``; returns its wall seconds."""
    args = [
        sys.executable, "-m", "mcgpo", "train", "--preset", preset, "--out", str(out),
        "--train.updates", str(updates), "--train.save_every", "0", "--eval.tasks", "0",
        "--progress", "false", "--tensorboard", "false", "--nproc", str(procs),
        "--train.sharding", sharding,
    ]  # fmt: skip
    for item in extra:
        key, _, value = item.partition("=")
        args += [f"--{key}", value]
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1]
        sys.exit(f"mcgpo train --nproc {procs} --train.sharding {sharding} failed: {last}")
    return time.perf_counter() - start


def update_times(out: Path) -> dict[str, float]:
    """Mean seconds per update of each part, over the updates after the first."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in records if "time/update" in r][1:]
    if not updates:
        sys.exit("need --updates >= 2 (the first update is warm-up)")
    times = {part: float(np.mean([r[part] for r in updates])) for part in PARTS}
    times["total"] = sum(times.values())
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="household-quick")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sharding", nargs="+", default=["ddp", "fsdp2"], choices=["ddp", "fsdp2"])
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--set", nargs="*", default=[], help="more options: KEY=VALUE")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for procs in args.procs:
            for sharding in args.sharding if procs > 1 else ["-"]:
                out = Path(tmp) / f"p{procs}-{sharding}"
                mode = "ddp" if sharding == "-" else sharding
                wall = run_training(args.preset, procs, mode, args.updates, args.set, out)
                rows.append((procs, sharding, update_times(out), wall))
    print(f"# {args.preset}, {args.updates} updates, {datetime.date.today()}")
    print(f"# {cpu_name()}, {os.cpu_count()} cores, {platform.python_version()}")
    print(
        "| processes | sharding | update s | rollout s | credit s | update (PPO) s | run wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    for procs, sharding, t, wall in rows:
        parts = " | ".join(f"{t[p]:.2f}" for p in PARTS)
        print(f"| {procs} | {sharding} | {t['total']:.2f} | {parts} | {wall:.1f} |")


if __name__ == "__main__":
    main()
