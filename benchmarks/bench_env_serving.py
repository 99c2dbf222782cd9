"""Environment steps per second and per-step latency (p50 / p99), local vs served over HTTP
(`mcgpo env serve` on loopback), at 1, 8 and 64 concurrent sessions, printed as a table.

* local: the sessions' environments in this process, stepped one after the other (as
  ``EnvPool`` steps the built-in environments); latency is one ``env.step``.
* remote: a server started as ``mcgpo env serve --env NAME --port 0`` in its own process;
  each session is a ``RemoteEnv`` driven by its own thread, all at once (as ``EnvPool``
  steps remote environments); latency is one HTTP step, client to client.

Actions are random admissible ones; a finished episode is reset (resets are not timed).
Each cell takes ``--steps`` steps in all (at least 20 per session). The server's worker
processes are started before the clock starts (every session opened and reset first).

Run:  python benchmarks/bench_env_serving.py [--envs household webshop] [--sessions 1 8 64]
      [--steps 3000] [--sessions-per-worker 1]
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import subprocess
import sys
import threading
import time

import numpy as np

from machine import cpu_name
from mcgpo.envs import make_env


def play(env, steps: int, rng: random.Random, seed: int, lat: list[float]) -> None:
    """``steps`` random admissible steps on a reset env, latencies (s) appended to ``lat``."""
    obs = env.reset(seed=seed)
    for i in range(steps):
        action = rng.choice(obs.admissible_actions)
        t = time.perf_counter()
        res = env.step(action)
        lat.append(time.perf_counter() - t)
        obs = res.observation
        if res.done:
            obs = env.reset(seed=seed + 1000 * (i + 1))


def local(name: str, sessions: int, steps: int) -> tuple[float, list[float]]:
    envs = [make_env(name) for _ in range(sessions)]
    each = max(20, steps // sessions)
    lat: list[float] = []
    rngs = [random.Random(i) for i in range(sessions)]
    obs = [env.reset(seed=i) for i, env in enumerate(envs)]
    start = time.perf_counter()
    for _ in range(each):
        for i, env in enumerate(envs):
            t = time.perf_counter()
            res = env.step(rngs[i].choice(obs[i].admissible_actions))
            lat.append(time.perf_counter() - t)
            obs[i] = res.observation if not res.done else env.reset(seed=i + 7919)
    return len(lat) / (time.perf_counter() - start), lat


def remote(url: str, name: str, sessions: int, steps: int) -> tuple[float, list[float]]:
    envs = [make_env("remote", url=url, remote_name=name) for _ in range(sessions)]
    for i, env in enumerate(envs):
        env.reset(seed=i)  # opens the session (and starts its worker process)
    each = max(20, steps // sessions)
    lats: list[list[float]] = [[] for _ in envs]
    gate = threading.Barrier(sessions + 1)

    def run(i: int) -> None:
        gate.wait()
        play(envs[i], each, random.Random(i), i, lats[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    gate.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    for env in envs:
        env.close()
    lat = [x for xs in lats for x in xs]
    return len(lat) / seconds, lat


def serve(name: str, max_sessions: int, per_worker: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcgpo", "env", "serve", "--env", name, "--port", "0",
         "--max-sessions", str(max_sessions), "--sessions-per-worker", str(per_worker)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = proc.stdout.readline().split()
    if not line:
        raise SystemExit(f"the {name} server did not start")
    return proc, line[-1]


def row(name: str, where: str, sessions: int, rate: float, lat: list[float]) -> str:
    ms = np.percentile(np.asarray(lat) * 1000, [50, 99])
    return (
        f"| {name} | {where} | {sessions} | {len(lat)} | {rate:,.0f} | {ms[0]:.3f} | {ms[1]:.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["household", "webshop"])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--sessions-per-worker", type=int, default=1)
    args = parser.parse_args()
    print(f"# bench_env_serving  {datetime.date.today()}  {cpu_name()}  {os.cpu_count()} cores")
    print(
        f"# remote: mcgpo env serve on 127.0.0.1, {args.sessions_per_worker} session(s) per "
        "worker process, one client thread per session"
    )
    print("# (shared machine: other processes may have used the CPUs)\n")
    print("| env | stepping | sessions | steps | steps/s | p50 ms | p99 ms |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in args.envs:
        for n in args.sessions:
            print(row(name, "local", n, *local(name, n, args.steps)), flush=True)
        proc, url = serve(name, max(args.sessions), args.sessions_per_worker)
        try:
            for n in args.sessions:
                print(row(name, "remote", n, *remote(url, name, n, args.steps)), flush=True)
        finally:
            proc.terminate()
            proc.wait(60)


if __name__ == "__main__":
    main()
