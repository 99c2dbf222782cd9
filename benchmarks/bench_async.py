"""Seconds per update with rollouts overlapping the update (``train.async_lag``) and
environment steps overlapping decoding (``rollout.overlap_env``), printed as tables.

Cells: k = 0 / 1 x sequential / overlapped environment steps, on

(a) ``smoke``: the household-smoke preset as it is (2 tasks x 4 siblings, 3 turns, 4-token
    actions, one CPU thread), evaluation and intermediate checkpoints off;
(b) ``served``: the same with every environment step taking ``--step-ms`` (20, 200 ms) more, a
    stand-in for a served or slow engine: the wrapper waits (``time.sleep``, no CPU) and
    says ``concurrent_steps`` as the served environment's client does, so a turn's steps
    wait about one latency together, not one per slot (envs/pool.py);
(c) ``alfworld``: the real ALFWorld engine in 2 worker processes (``--alfworld`` or
    ``--cells alfworld``; needs the alfworld extra: skipped with the reason otherwise).

Every cell is one ``mcgpo train`` run in this process (``--updates`` updates, same seed and
policy); the period is the mean gap between the update records' time stamps after the
first update (so start-up and the first batch are left out). The phases are the run's own
metrics: ``time/decode`` and ``time/env`` (summed inside a rollout; with overlapped steps
they run at once), ``rollout/seconds`` (the rollout's wall time), ``time/update``, and for
k = 1 ``time/wait_rollout`` (the learner waiting for the producer).

Then a short model of a GPU where rollout >> update (no measurement: the formulas with
stated costs).

Run:  nice python benchmarks/bench_async.py [--updates 8] [--step-ms 20 200]
      [--cells smoke served] [--alfworld]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import cpu_name
from mcgpo.cli import resolve
from mcgpo.envs import ENVIRONMENTS, make_env


class DelayedEnv:
    """An environment whose steps take ``seconds`` longer (waiting, not computing)."""

    concurrent_steps = True  # as RemoteEnv: the pool steps its slots from threads

    def __init__(self, inner: Any, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds
        self.max_turns = inner.max_turns

    def reset(self, seed: int = 0, split: str = "train") -> Any:
        return self.inner.reset(seed=seed, split=split)

    def step(self, action: str) -> Any:
        time.sleep(self.seconds)
        return self.inner.step(action)

    def expert_action(self) -> str:
        return self.inner.expert_action()


def _served(step_ms: float = 20.0, **options: Any) -> DelayedEnv:
    return DelayedEnv(make_env("household", **options), step_ms / 1000)


def policy(folder: Path) -> Path:
    """The household-smoke preset's tiny policy, built once into ``folder``."""
    from mcgpo.policy import save_policy
    from mcgpo.training.build import load_model

    if not (folder / "config.json").exists():
        cfg = resolve("train", ["--preset", "household-smoke", "--out", str(folder / "run")])
        model, tokenizer = load_model(cfg)
        save_policy(model, tokenizer, folder)
    return folder


def one_run(args: list[str]) -> dict[str, float]:
    from mcgpo.training.trainer import train

    cfg = resolve("train", args)
    train(cfg)
    lines = (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    stamps = [r["time"] for r in records if "time/update" in r]
    period = (stamps[-1] - stamps[0]) / (len(stamps) - 1)  # after the first update
    updates = [r for r in records if "time/update" in r][1:]

    def mean(key: str) -> float:
        values = [r[key] for r in updates if key in r]
        return sum(values) / len(values) if values else float("nan")

    return {
        "period": period,
        "rollout": mean("rollout/seconds"),
        "decode": mean("time/decode"),
        "env": mean("time/env"),
        "update": mean("time/update") + mean("time/credit"),
        "wait": mean("time/wait_rollout"),
    }


def table(name: str, rows: dict[tuple[int, bool], dict[str, float]]) -> None:
    base = rows[(0, False)]["period"]
    print(f"\n### ({name}\n")
    print(
        "| k | env steps | s / update | vs k=0 seq. | rollout s | decode s | env s "
        "| update s | learner waits s | period / max(rollout, update) "
        "| rollout / max(decode, env) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (k, overlap), r in rows.items():
        bound = max(r["rollout"], r["update"])
        inner = max(r["decode"], r["env"])
        wait = f"{r['wait']:.3f}" if k else "–"
        print(
            f"| {k} | {'overlapped' if overlap else 'sequential'} | {r['period']:.3f} "
            f"| {base / r['period']:.2f}x | {r['rollout']:.3f} | {r['decode']:.3f} "
            f"| {r['env']:.3f} | {r['update']:.3f} | {wait} | {r['period'] / bound:.2f} "
            f"| {r['rollout'] / inner:.2f} |"
        )


def gpu_model() -> None:
    """Periods of one update from stated costs (seconds), no measurement."""
    print("\n### A model of a GPU where rollout >> update\n")
    print(
        "D: decoding, E: environment waits, U: update (+ credit), per update; one decode "
        "engine. k = 0: D + E + U. k = 1 with rollout and update on separate devices: "
        "max(D + E, U). k = 1 on one shared GPU (decode and update take turns on it, the "
        "environment waits overlap the update): max(D + E, D + U). Overlapped steps, a "
        "memory-bound decode (a half of the rows costs about a whole decode step, d = D) "
        "and latency-bound steps (a half waits E too): a turn costs max(2D, D + E) in "
        "place of D + E, so they pay only where E > D.\n"
    )
    print("| D | E | U | k=0 | k=1, two devices | k=1, one GPU | best speed-up |")
    print("|---|---|---|---|---|---|---|")
    for d, e, u in ((60, 10, 15), (60, 60, 15), (30, 90, 15), (60, 10, 60)):
        k0, two, one = d + e + u, max(d + e, u), max(d + e, d + u)
        print(f"| {d} | {e} | {u} | {k0} | {two} | {one} | {k0 / min(two, one):.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=8)
    parser.add_argument("--step-ms", type=float, nargs="+", default=[20.0, 200.0])
    parser.add_argument("--cells", nargs="+", default=["smoke", "served"])
    parser.add_argument("--alfworld", action="store_true", help="also (c) the ALFWorld engine")
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" bars
    ENVIRONMENTS["household-served"] = _served
    cells = [c for c in args.cells if c != "served"]
    if "served" in args.cells:
        cells[1:1] = [f"served:{ms:g}" for ms in args.step_ms]
    cells += ["alfworld"] if args.alfworld else []
    with tempfile.TemporaryDirectory() as tmp:
        model = policy(Path(tmp) / "policy")
        print(
            f"# bench_async: {cpu_name()}, {os.cpu_count()} cores, "
            f"{datetime.date.today().isoformat()}, {args.updates} updates per cell"
        )
        for cell in cells:
            kind, _, ms = cell.partition(":")
            env = {
                "smoke": [],
                "served": ["--env.name", "household-served", "--env.step_ms", ms],
                "alfworld": ["--env.name", "alfworld", "--env.workers", "2"],
            }[kind]
            if kind == "alfworld":
                try:
                    make_env("alfworld")
                except (ImportError, ValueError, OSError) as err:
                    print(f"\n(c) ALFWorld engine: skipped ({str(err).splitlines()[0]})")
                    continue
            rows = {}
            for k in (0, 1):
                for overlap in (False, True):
                    out = str(Path(tmp) / f"{cell}-{k}-{overlap}")
                    flags = {
                        "--preset": "household-smoke", "--model": str(model), "--out": out,
                        "--train.updates": str(args.updates), "--eval.tasks": "0",
                        "--train.save_every": "0", "--progress": "false",
                        "--train.async_lag": str(k), "--rollout.overlap_env": str(overlap).lower(),
                    }  # fmt: skip
                    rows[(k, overlap)] = one_run([*sum(flags.items(), ()), *env])
            name = {"smoke": "a) household-smoke", "alfworld": "c) ALFWorld engine"}.get(
                kind, f"b) household + {ms} ms per step (served stand-in)"
            )
            table(name, rows)
    gpu_model()


if __name__ == "__main__":
    main()
