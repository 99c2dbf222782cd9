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

**Soak** (``--soak``; Linux, it reads /proc): ``--soak-sessions`` (64) client threads play
random episodes against one server for ``--duration`` seconds (600), while every
``--kill-every`` seconds (60; the first at half that) one of the server's worker processes,
chosen at random, is killed with SIGKILL. A session whose worker was killed is lost (its
client sees ``env_crash`` naming ``exit code -9``, then resets into a new session); the soak
counts every lost session and every other error, which must be none: only killed sessions
may be lost. It also prints the server's memory (resident set of the server process, and of
it with its worker processes) once every session has started and at the end, and after the
clients close their sessions and the server's idle timeout (``--idle-timeout``, 30 s) passes,
when its idle worker processes have been stopped.

Soak:  python benchmarks/bench_env_serving.py --soak [--duration 600] [--soak-sessions 64]
       [--kill-every 60] [--pause 0.01]
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from machine import cpu_name
from mcgpo.envs import make_env
from mcgpo.envs.serving.client import EnvServerError


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


def serve(
    name: str, max_sessions: int, per_worker: int, *extra: str
) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcgpo", "env", "serve", "--env", name, "--port", "0",
         "--max-sessions", str(max_sessions), "--sessions-per-worker", str(per_worker), *extra],
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


# ---------------------------------------------------------------------------------- soak
def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def workers_of(pid: int) -> list[int]:
    """The server's environment worker processes (multiprocessing spawn children)."""
    out = []
    for child in children(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            out.append(child)
    return out


def rss_mb(pids: list[int]) -> float:
    """Resident memory of these processes, MB (VmRSS)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def memory(server: int) -> tuple[float, float, int]:
    """(server MB, server and its children MB, worker processes)."""
    return rss_mb([server]), rss_mb([server, *children(server)]), len(workers_of(server))


class Tally:
    """What the soak's client threads saw."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.steps = 0
        self.killed = 0  # sessions lost to a killed worker (env_crash, exit code -9)
        self.other: list[str] = []  # any other error: there must be none

    def lost(self, err: Exception) -> None:
        with self.lock:
            if "env_crash" in str(err) and "exit code -9" in str(err):
                self.killed += 1
            else:
                self.other.append(f"{type(err).__name__}: {err}")


def soak_client(env, i: int, stop: threading.Event, pause: float, tally: Tally) -> None:
    """Random episodes on ``env`` (its session already open) until ``stop``."""
    rng, episode, steps = random.Random(i), 0, 0
    while not stop.is_set():
        try:
            obs = env.reset(seed=i * 100_000 + episode)
            episode += 1
            done = False
            while not done and not stop.is_set():
                res = env.step(rng.choice(obs.admissible_actions))
                steps += 1
                obs, done = res.observation, res.done
                time.sleep(pause)
        except EnvServerError as err:  # lost: the next reset opens a new session
            tally.lost(err)
        except Exception as err:  # a 4xx or anything else: counted, never expected
            tally.lost(err)
            time.sleep(1.0)
    env.close()
    with tally.lock:
        tally.steps += steps


def soak(args: argparse.Namespace) -> None:
    n, duration = args.soak_sessions, args.duration
    print(
        f"# bench_env_serving --soak  {datetime.date.today()}  {cpu_name()}  {os.cpu_count()} cores"
    )
    print(
        f"# household, {n} sessions (one worker process each) for {duration:g} s, a worker "
        f"killed (SIGKILL) every {args.kill_every:g} s, {args.pause * 1000:g} ms between a "
        "session's steps"
    )
    print("# (shared machine: other processes may have used the CPUs)\n", flush=True)
    extra = ("--idle-timeout", str(args.idle_timeout), "--step-timeout", "60")
    proc, url = serve("household", n, 1, *extra)
    stop, tally = threading.Event(), Tally()
    try:
        envs = []
        for i in range(n):  # one by one, before the clock: each opens a session and a worker
            envs.append(make_env("remote", url=url, remote_name="household"))
            envs[-1].reset(seed=i * 100_000)
        threads = [
            threading.Thread(target=soak_client, args=(envs[i], i, stop, args.pause, tally))
            for i in range(n)
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(workers_of(proc.pid)) < n and time.monotonic() < deadline:
            time.sleep(0.5)  # /proc may lag behind a worker just started
        start_mem = memory(proc.pid)
        start, kills, rng = time.monotonic(), 0, random.Random(0)
        next_kill = start + args.kill_every / 2
        while (now := time.monotonic()) < start + duration:
            if now >= next_kill:
                workers = workers_of(proc.pid)
                if workers:
                    os.kill(rng.choice(workers), signal.SIGKILL)
                    kills += 1
                next_kill += args.kill_every
            time.sleep(0.2)
        end_mem = memory(proc.pid)
        stop.set()
        for t in threads:
            t.join(300)
        seconds = time.monotonic() - start
        deadline = time.monotonic() + args.idle_timeout * 2 + 60
        while len(workers_of(proc.pid)) > 1 and time.monotonic() < deadline:
            time.sleep(1.0)  # the idle timeout passes, the reaper stops the idle workers
        idle_mem = memory(proc.pid)
    finally:
        stop.set()
        proc.terminate()
        proc.wait(120)
    lost = tally.killed + len(tally.other)
    verdict = "only killed sessions lost" if not tally.other and lost <= kills else "FAILED"
    print("| seconds | sessions | steps | steps/s | workers killed | sessions lost | lost to a kill | other errors | server MB start / end / idle | with workers MB start / end / idle | workers start / end / idle |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|")
    print(
        f"| {seconds:.0f} | {n} | {tally.steps:,} | {tally.steps / seconds:,.0f} | {kills} | "
        f"{lost} | {tally.killed} | {len(tally.other)} | "
        f"{start_mem[0]:.0f} / {end_mem[0]:.0f} / {idle_mem[0]:.0f} | "
        f"{start_mem[1]:,.0f} / {end_mem[1]:,.0f} / {idle_mem[1]:,.0f} | "
        f"{start_mem[2]} / {end_mem[2]} / {idle_mem[2]} |"
    )
    print(f"\n{verdict}")
    for line in tally.other[:10]:
        print(f"  other error: {line[:300]}")
    if verdict == "FAILED":
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["household", "webshop"])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--sessions-per-worker", type=int, default=1)
    parser.add_argument("--soak", action="store_true", help="run the soak (module docstring)")
    parser.add_argument("--duration", type=float, default=600.0, help="soak seconds")
    parser.add_argument("--soak-sessions", type=int, default=64)
    parser.add_argument("--kill-every", type=float, default=60.0, help="seconds between kills")
    parser.add_argument("--pause", type=float, default=0.01, help="seconds between steps")
    parser.add_argument("--idle-timeout", type=float, default=30.0, help="the server's")
    args = parser.parse_args()
    if args.soak:
        soak(args)
        return
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
