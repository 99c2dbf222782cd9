"""Run a benchmark: one warm start, then every (method, seed) run as its own process.

Layout of a benchmark folder::

    warmstart/                the shared warm-started policy (``mcgpo sft``)
    runs/<method>-s<seed>/    one training run each (``mcgpo train``)
    results.md, evals.jsonl, curves.png, task_types.png

Resumable: a run whose folder holds ``bench-done.json`` is skipped; a run with a checkpoint
but no marker is continued with ``--resume``; a run stopped before its first checkpoint
(metrics but no checkpoint) starts again, its old files moved to ``<folder>/stale-<n>/``
(nothing is deleted); the warm start is skipped when its model exists. At most ``parallel``
runs go at once (default: the number of cores), each with ``cores // parallel`` torch
threads, so runs don't fight over cores. Runs start seed by seed (every method of the first
seed, then of the next), so a benchmark stopped part-way leaves whole seeds, with every
method on the same seeds, and a paired comparison can use all of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mcgpo.bench.results import EvalPoint, RunResult, write_atomic

__all__ = [
    "DONE_MARKER",
    "RunPlan",
    "Variant",
    "load_run_result",
    "plan_runs",
    "run_plans",
    "run_status",
    "set_aside",
]

DONE_MARKER = "bench-done.json"
Launcher = Callable[[Sequence[str], Path], "subprocess.Popen[bytes]"]


@dataclass(frozen=True)
class Variant:
    """A method as the benchmark names it, and the training flags that select it."""

    label: str  # e.g. "mcgpo" or "mcgpo/same_fold"
    flags: tuple[str, ...]  # e.g. ("--algo.name", "mcgpo", "--algo.pairs.evidence", "same_fold")


@dataclass(frozen=True)
class RunPlan:
    variant: Variant
    seed: int
    folder: Path
    argv: tuple[str, ...] = field(default=())  # the full command, set by plan_runs


def cli_command(*args: str) -> list[str]:
    """The command line that runs ``mcgpo <args>`` with this interpreter."""
    return [sys.executable, "-m", "mcgpo.cli", *args]


def run_status(folder: Path) -> str:
    """``"done"`` (marker present), ``"partial"`` (a checkpoint, no marker), ``"stale"``
    (metrics but no checkpoint: stopped before its first checkpoint) or ``"new"``."""
    folder = Path(folder)
    if (folder / DONE_MARKER).exists():
        return "done"
    if (folder / "checkpoints" / "latest").exists():
        return "partial"
    if (folder / "metrics.jsonl").exists():
        return "stale"
    return "new"


def set_aside(folder: Path) -> Path:
    """Move a stale run's files into ``folder/stale-<n>/`` (the first free n); returns it."""
    folder = Path(folder)
    n = 1
    while (folder / f"stale-{n}").exists():
        n += 1
    aside = folder / f"stale-{n}"
    aside.mkdir()
    for entry in sorted(folder.iterdir()):
        if entry != aside and not entry.name.startswith("stale-"):
            entry.rename(aside / entry.name)
    return aside


def plan_runs(
    variants: Sequence[Variant],
    seeds: Sequence[int],
    out: Path,
    *,
    common: Sequence[str],
    threads: int,
) -> list[RunPlan]:
    """One plan per (variant, seed), with ``--resume`` where a run was half finished."""
    plans = []
    for variant in variants:
        for seed in seeds:
            folder = Path(out) / "runs" / f"{variant.label.replace('/', '-')}-s{seed}"
            argv = cli_command(
                "train",
                *common,
                *variant.flags,
                "--seed",
                str(seed),
                "--out",
                str(folder),
                "--threads",
                str(threads),
                "--progress",
                "false",
            )
            if run_status(folder) == "partial":
                argv.append("--resume")
            plans.append(RunPlan(variant, seed, folder, tuple(argv)))
    return plans


def _popen(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        return subprocess.Popen(list(argv), stdout=f, stderr=subprocess.STDOUT)


def run_plans(
    plans: Sequence[RunPlan],
    *,
    parallel: int,
    launcher: Launcher = _popen,
    poll_seconds: float = 0.5,
    on_done: Callable[[RunPlan], None] | None = None,
) -> dict[Path, int]:
    """Run the plans not yet done, at most ``parallel`` at once, seed-major (the plans of a
    seed, in their order, before those of the next seed in order of first appearance);
    returns exit codes.

    A run that exits 0 gets its done-marker, then ``on_done(plan)`` is called (e.g. to carry
    it away, :func:`mcgpo.bench.carry.carry_run`); a failing run keeps its folder (and
    checkpoints) so that the next invocation continues it. Skipped runs report 0.
    """
    seed_rank = {seed: i for i, seed in enumerate(dict.fromkeys(p.seed for p in plans))}
    pending = sorted(
        (p for p in plans if run_status(p.folder) != "done"), key=lambda p: seed_rank[p.seed]
    )  # a stable sort: within a seed, the plans' own order
    codes = {p.folder: 0 for p in plans if p not in pending}
    running: list[tuple[RunPlan, subprocess.Popen[bytes], float]] = []
    while pending or running:
        while pending and len(running) < max(1, parallel):
            plan = pending.pop(0)
            plan.folder.mkdir(parents=True, exist_ok=True)
            if run_status(plan.folder) == "stale":
                set_aside(plan.folder)
            running.append((plan, launcher(plan.argv, plan.folder / "bench.log"), time.time()))
        still = []
        for plan, proc, started in running:
            code = proc.poll()
            if code is None:
                still.append((plan, proc, started))
                continue
            codes[plan.folder] = code
            if code == 0:
                marker = {"seconds": round(time.time() - started, 1), "argv": list(plan.argv)}
                write_atomic(plan.folder / DONE_MARKER, json.dumps(marker, indent=1) + "\n")
                if on_done is not None:
                    on_done(plan)
        running = still
        if running:
            time.sleep(poll_seconds)
    return codes


def default_parallel() -> int:
    return max(1, os.cpu_count() or 1)


def load_run_result(label: str, seed: int, folder: Path) -> RunResult:
    """Read a run's ``metrics.jsonl`` into a :class:`RunResult`.

    Evaluation records carry ``eval/success`` and, per task type, ``eval/success/<type>``,
    and ``eval/score`` where the environment grades; update records carry the seconds of
    each phase (``time/rollout``, ``time/credit``, ``time/update``; their sum is the time per
    update, evaluation excluded) and, for MCGPO, ``pairs/<stat>`` values.
    """
    path = Path(folder) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no metrics (did the run start?)")
    points, secs, prefs = [], [], {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if "eval/success" in rec:
            per_type = {
                k.split("/", 2)[2]: float(v)
                for k, v in rec.items()
                if k.startswith("eval/success/")
            }
            score = rec.get("eval/score")
            points.append(
                EvalPoint(
                    label,
                    seed,
                    int(rec["update"]),
                    float(rec["eval/success"]),
                    per_type,
                    None if score is None else float(score),
                )
            )
        phases = [rec[k] for k in ("time/rollout", "time/credit", "time/update") if k in rec]
        if phases and "eval/success" not in rec:
            secs.append(float(sum(phases)))
        for k, v in rec.items():
            if k.startswith("pairs/") and isinstance(v, (int, float)):
                prefs.setdefault(k.removeprefix("pairs/"), []).append(float(v))
    points.sort(key=lambda p: p.update)
    return RunResult(
        label,
        seed,
        tuple(points),
        seconds_per_update=sum(secs) / len(secs) if secs else None,
        preference_stats={k: sum(v) / len(v) for k, v in prefs.items()},
    )
