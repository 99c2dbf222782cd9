"""Environment steps per second in process and in 1, 2 and 4 worker processes
(``EnvPool.in_workers``), printed as a table: the real ALFWorld engine (when the alfworld
extra is installed) and the built-in household environment.

Each round resets every slot of the pool to one task and steps all live slots with random
admissible commands until every slot is done (``bench_real_envs.run_pool``). Reported: steps
per second over env steps only, with the resets included, and the seconds to start the pool
(spawning the workers and building their environments). Best of ``--repeats`` runs.

Run:  python benchmarks/bench_env_workers.py [--slots 8] [--alfworld-steps 300]
      [--household-steps 20000] [--workers 1 2 4] [--repeats 2] [--only alfworld|household]
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import time

from bench_real_envs import run_pool
from machine import cpu_name
from mcgpo.envs import make_env
from mcgpo.envs.pool import EnvPool
from mcgpo.envs.workers import EnvSpec


def bench(spec: EnvSpec, workers: int, slots: int, min_steps: int, seeds: list[int], repeats: int):
    """The best run of ``repeats`` with a pool in process (workers == 0) or in workers."""
    t = time.perf_counter()
    if workers == 0:
        pool = EnvPool([spec() for _ in range(slots)])
    else:
        pool = EnvPool.in_workers(spec, slots, workers=workers)
    start_s = time.perf_counter() - t
    best = None
    with pool:
        for r in range(repeats):
            out = run_pool(pool, min_steps, seeds, random.Random(r))
            if best is None or out["steps"] / out["step_s"] > best["steps"] / best["step_s"]:
                best = out
    best["start_s"] = start_s
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--alfworld-steps", type=int, default=300)
    parser.add_argument("--household-steps", type=int, default=20000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", choices=["alfworld", "household"])
    parser.add_argument("--cache-dir", default=None, help="ALFWorld generated-games cache")
    args = parser.parse_args()

    print(f"# bench_env_workers  {datetime.date.today()}  {cpu_name()}  {os.cpu_count()} cores")
    print(f"# pool of {args.slots} slots, one task per round; best of {args.repeats} runs")
    print("# (shared machine: other processes may have used the CPUs; best run reported)\n")
    rows = []
    settings = [0, *args.workers]
    if args.only in (None, "alfworld"):
        try:
            options = {"source": "generated"}
            if args.cache_dir:
                options["cache_dir"] = args.cache_dir
            seeds = list(range(6))  # one game of each task type
            probe = make_env("alfworld", **options)
            t = time.perf_counter()
            for seed in seeds:  # generate (or load) the games before any timing
                probe.reset(seed=seed, split="train")
            print(
                f"alfworld: {len(seeds)} games generated or loaded in {time.perf_counter() - t:.1f} s"
            )
            spec = EnvSpec("alfworld", options)
            for w in settings:
                rows.append(
                    (
                        "alfworld",
                        w,
                        bench(spec, w, args.slots, args.alfworld_steps, seeds, args.repeats),
                    )
                )
        except ImportError as err:
            print(f"alfworld skipped: {err}")
    if args.only in (None, "household"):
        spec = EnvSpec("household")
        for w in settings:
            out = bench(spec, w, args.slots, args.household_steps, list(range(50)), args.repeats)
            rows.append(("household", w, out))

    print("\n| env | stepping | steps | steps/s (steps only) | steps/s (with resets) | start s |")
    print("|---|---|---:|---:|---:|---:|")
    for env, w, o in rows:
        where = "in process" if w == 0 else f"{w} worker{'s' * (w > 1)}"
        total = o["step_s"] + o["reset_s"]
        print(
            f"| {env} | {where} | {o['steps']} | {o['steps'] / o['step_s']:,.1f} "
            f"| {o['steps'] / total:,.1f} | {o['start_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
