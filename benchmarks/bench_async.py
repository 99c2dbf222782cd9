"""Seconds per update with rollouts overlapping the update (``train.async_lag``) and
environment steps overlapping decoding (``rollout.overlap_env``, ``rollout.overlap_pieces``),
printed as tables.

Rows: k = 0 / 1 x sequential / overlapped environment steps in P pieces (``--pieces``), on

(a) ``smoke``: the household-smoke preset as it is (2 tasks x 4 siblings, 3 turns, 4-token
    actions, one CPU thread), evaluation and intermediate checkpoints off;
(b1) ``latency:L``: every environment step waits L ms more (``time.sleep``, no CPU) and
    says ``concurrent_steps`` as a served environment's client does: all steps of a turn
    wait one latency together, however many rows (latency-bound: E does not grow with rows);
(b2) ``slots:L``: every step waits L ms in one of ``--slots`` W slots (a semaphore): a
    server or engine that steps W environments at a time, so E grows with the rows
    (throughput-bound), as the real engine in W worker processes;
(c) ``alfworld``: the real ALFWorld engine in 2 worker processes (``--cells alfworld``;
    needs the alfworld extra and its data: skipped with the reason otherwise). The run keeps
    its worker pool across rollouts (training/env_pools.py), so the pool's start is paid
    once per run, not in every rollout.

Every cell is one ``mcgpo train`` run in this process (``--updates`` updates, same seed and
policy); the rows of a cell run ``--repeats`` times, interleaved (A B C A B C ...), and the
table prints the median of the repeats (and min-max where it matters): a busy machine's
noise shows. The period is the mean gap between the update records' time stamps after the
first update (start-up and the first batch left out). The phases are the run's own metrics
(means per update): ``rollout/seconds`` (the rollout's wall time), ``time/decode`` and
``time/env`` (sums inside the rollout; overlapped, they run at once),
``rollout/chain_seconds`` (the longest chain of calls one environment waited on: reset,
the decodes and steps it was in, which no schedule of those calls beats), ``time/update``
(+ credit), and for k = 1 ``time/wait_rollout``. ``D_seq`` and ``E_seq`` are the decode and
environment seconds of the *sequential* rows of the same cell and k: the issue's goal is a
rollout within 15 % of max(D_seq, E_seq).

Then a short model of a GPU where rollout >> update (no measurement: the formulas with
stated costs).

Run:  nice python benchmarks/bench_async.py [--updates 3] [--repeats 3] [--pieces 2 4]
      [--cells smoke latency:20 slots:20 alfworld] [--slots 2] [--groups 2] [--turns 3] [--lags 0 1]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from machine import cpu_name
from mcgpo.cli import resolve
from mcgpo.envs import ENVIRONMENTS, make_env


class DelayedEnv:
    """An environment whose steps take ``seconds`` longer (waiting, not computing); with
    ``slots``, at most that many steps wait at once (shared by every instance)."""

    concurrent_steps = True  # as RemoteEnv: the pool steps its slots from threads
    _slots: ClassVar[dict[int, threading.Semaphore]] = {}

    def __init__(self, inner: Any, seconds: float, slots: int = 0) -> None:
        self.inner, self.seconds = inner, seconds
        self.max_turns = inner.max_turns
        self.gate = self._slots.setdefault(slots, threading.Semaphore(slots)) if slots else None

    def reset(self, seed: int = 0, split: str = "train") -> Any:
        return self.inner.reset(seed=seed, split=split)

    def step(self, action: str) -> Any:
        if self.gate is None:
            time.sleep(self.seconds)
        else:
            with self.gate:
                time.sleep(self.seconds)
        return self.inner.step(action)

    def expert_action(self) -> str:
        return self.inner.expert_action()


def _delayed(step_ms: float = 20.0, slots: int = 0, **options: Any) -> DelayedEnv:
    return DelayedEnv(make_env("household", **options), step_ms / 1000, slots)


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
        "chain": mean("rollout/chain_seconds"),
        "update": mean("time/update") + mean("time/credit"),
        "wait": mean("time/wait_rollout"),
    }


def median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def spread(runs: list[dict[str, float]], key: str) -> str:
    values = [r[key] for r in runs]
    text = f"{statistics.median(values):.3f}"
    return text if len(values) == 1 else f"{text} ({min(values):.2f}-{max(values):.2f})"


def table(name: str, rows: dict[tuple[int, int], list[dict[str, float]]]) -> None:
    """One cell: (k, P) -> the repeats' measurements; P = 0 is the sequential rollout."""
    base = median(rows[(min(k for k, _ in rows), 0)], "period")  # the smallest k's
    print(f"\n### ({name}\n")
    print(
        "| k | env steps | s / update | vs k=0 seq. | rollout s | decode s | env s | chain s "
        "| update s | learner waits s | period / max(rollout, update) "
        "| rollout / max(D_seq, E_seq) | rollout / chain |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (k, pieces), runs in rows.items():
        m = {key: median(runs, key) for key in runs[0]}
        seq = rows[(k, 0)]
        target = max(median(seq, "decode"), median(seq, "env"))
        steps = f"overlapped, P = {pieces}" if pieces else "sequential"
        wait = f"{m['wait']:.3f}" if k else "–"
        print(
            f"| {k} | {steps} | {spread(runs, 'period')} | {base / m['period']:.2f}x "
            f"| {spread(runs, 'rollout')} | {m['decode']:.3f} | {m['env']:.3f} "
            f"| {m['chain']:.3f} | {m['update']:.3f} | {wait} "
            f"| {m['period'] / max(m['rollout'], m['update']):.2f} | {m['rollout'] / target:.2f} "
            f"| {m['rollout'] / m['chain']:.2f} |"
        )


def gpu_model() -> None:
    """Periods of one update from stated costs (seconds), no measurement."""
    print("\n### A model of a GPU where rollout >> update\n")
    print(
        "D: decoding, E: environment waits, U: update (+ credit), per update; one decode "
        "engine. k = 0: D + E + U. k = 1 with rollout and update on separate devices: "
        "max(D + E, U). k = 1 on one shared GPU (decode and update take turns on it, the "
        "environment waits overlap the update): max(D + E, D + U). Overlapped steps in P "
        "pieces, per turn: about max(P d, P e, d + e) with d, e a piece's decode and steps; "
        "a memory-bound decode (a piece costs about a whole decode step, d = D) with "
        "latency-bound steps (a piece waits E too) gives max(P D, D + E): it pays only "
        "where E > D.\n"
    )
    print("| D | E | U | k=0 | k=1, two devices | k=1, one GPU | best speed-up |")
    print("|---|---|---|---|---|---|---|")
    for d, e, u in ((60, 10, 15), (60, 60, 15), (30, 90, 15), (60, 10, 60)):
        k0, two, one = d + e + u, max(d + e, u), max(d + e, d + u)
        print(f"| {d} | {e} | {u} | {k0} | {two} | {one} | {k0 / min(two, one):.2f}x |")


CELL_NAMES = {
    "smoke": "a) household-smoke",
    "latency": "b1) household + {ms} ms per step, all steps at once (latency-bound)",
    "slots": "b2) household + {ms} ms per step, {slots} at a time (throughput-bound)",
    "alfworld": "c) ALFWorld engine, 2 worker processes",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pieces", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--slots", type=int, default=2, help="(b2): steps at a time")
    parser.add_argument("--cells", nargs="+", default=["smoke", "latency:20", "slots:20"])
    parser.add_argument(
        "--groups", type=int, default=2, help="tasks per update (x 4 siblings = the rows)"
    )
    parser.add_argument("--turns", type=int, default=3, help="turns per episode (env.max_turns)")
    parser.add_argument("--lags", type=int, nargs="+", default=[0, 1], help="the k to run")
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" bars
    ENVIRONMENTS["household-delayed"] = _delayed
    configs = [(k, pieces) for k in args.lags for pieces in (0, *args.pieces)]
    with tempfile.TemporaryDirectory() as tmp:
        model = policy(Path(tmp) / "policy")
        print(
            f"# bench_async: {cpu_name()}, {os.cpu_count()} cores, "
            f"{datetime.date.today().isoformat()}, {args.updates} updates per run, "
            f"{args.repeats} repeats per row (interleaved)"
        )
        for cell in args.cells:
            kind, _, ms = cell.partition(":")
            env = {
                "smoke": [],
                "latency": ["--env.name", "household-delayed", "--env.step_ms", ms],
                "slots": ["--env.name", "household-delayed", "--env.step_ms", ms,
                          "--env.slots", str(args.slots)],
                "alfworld": ["--env.name", "alfworld", "--env.workers", "2"],
            }[kind]  # fmt: skip
            if kind == "alfworld":
                try:
                    make_env("alfworld")
                except (ImportError, ValueError, OSError) as err:
                    print(f"\n(c) ALFWorld engine: skipped ({str(err).splitlines()[0]})")
                    continue
            rows: dict[tuple[int, int], list[dict[str, float]]] = {c: [] for c in configs}
            for repeat in range(args.repeats):
                for k, pieces in configs:
                    out = str(Path(tmp) / f"{cell}-{k}-{pieces}-{repeat}")
                    flags = {
                        "--preset": "household-smoke", "--model": str(model), "--out": out,
                        "--train.updates": str(args.updates), "--eval.tasks": "0",
                        "--train.save_every": "0", "--progress": "false",
                        "--train.async_lag": str(k),
                        "--rollout.overlap_env": str(bool(pieces)).lower(),
                        "--rollout.overlap_pieces": str(max(pieces, 2)),
                        "--rollout.groups": str(args.groups),
                        "--env.max_turns": str(args.turns),
                    }  # fmt: skip
                    rows[(k, pieces)].append(one_run([*sum(flags.items(), ()), *env]))
            name = CELL_NAMES[kind].format(ms=ms, slots=args.slots)
            rows_note = f", {args.groups} tasks x 4 siblings" if args.groups != 2 else ""
            rows_note += f", {args.turns} turns" if args.turns != 3 else ""
            table(name + rows_note, rows)
    gpu_model()


if __name__ == "__main__":
    main()
