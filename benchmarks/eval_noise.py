"""Evaluation noise: how much one held-out evaluation of a fixed policy varies with its
sampling stream, at several evaluation sizes, and what an evaluation costs (issue 35 step 2).

An evaluation (``mcgpo eval``, :func:`mcgpo.training.evaluate.evaluate`) plays the first n
held-out tasks once each at ``eval.temperature``; its random stream is ``eval_seed(seed)``
and each episode's stream follows its task index, so the episodes of an n-task evaluation
are exactly the first n episodes of a larger one with the same seed (tested in
tests/bench/test_eval_noise.py). One evaluation of ``--tasks`` tasks per (model, stream)
therefore gives every smaller size as a prefix: the spread over streams of the prefix's
success rate is the per-evaluation SD at that size, the noise that a run's seed adds to its
evaluations beyond the policy itself. Cost: the episodes' seconds, measured per stream.

Results go to ``<out>/episodes.jsonl`` (one line per finished (model, stream), written
atomically; a second invocation resumes: finished lines are kept, the rest are run) and
the table to ``<out>/table.md`` (printed too).

Run:  python benchmarks/eval_noise.py --preset household-mid \\
          --model warm=docs/results/household-mid-issue25/warmstart/model \\
          --model trained=runs/dose/runs/graphgpo-s100/model \\
          --streams 16 --tasks 512 --sizes 64,128,256,512 --out runs/eval-noise
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from mcgpo.grouping import trajectory_view
from mcgpo.rollout.group_rollout import collect
from mcgpo.steps import StepTable
from mcgpo.training.atomic_files import atomic_write_text
from mcgpo.training.build import collect_options
from mcgpo.training.config_layout import from_dict
from mcgpo.training.evaluate import eval_seed
from mcgpo.training.presets import load_preset
from mcgpo.training.setup import prepare


def evaluation_table(
    preset: str, model: str, stream: int, tasks: int, threads: int, out: Path, max_turns: int = 0
) -> tuple[StepTable, float]:
    """The StepTable of ``mcgpo eval --preset P --model M --seed stream`` on the first
    ``tasks`` held-out tasks (as :func:`mcgpo.training.evaluate.evaluate` plays them), and the
    seconds its episodes took. ``max_turns`` > 0 overrides the preset's turn limit."""
    data = load_preset(preset)
    data.update(model=model, seed=stream, threads=threads, progress=False, out=str(out))
    if max_turns:
        data.setdefault("env", {})["max_turns"] = max_turns
    cfg = from_dict(data)
    cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, tasks=tasks))
    setup = prepare(cfg, kind="eval")
    options = collect_options(
        setup.cfg,
        setup.response_format,
        split=cfg.eval.split,
        temperature=cfg.eval.temperature,
        group_size=1,
        seed=eval_seed(stream),
    )
    start = time.perf_counter()
    table = collect(setup.model, setup.tokenizer, setup.make_env, list(range(tasks)), options).table
    return table, time.perf_counter() - start


def successes_by_task(table: StepTable, tasks: int) -> list[int]:
    """One 0/1 per task index 0 .. tasks-1 (group = task with one episode per task); an
    errored episode is -1 (left out of the rates, as the evaluation leaves it out)."""
    view = trajectory_view(table)
    out = [-2] * tasks
    for head in view.head:
        task = int(table.group[head])
        out[task] = -1 if table.errored[head] else int(table.success[head])
    if -2 in out:
        raise RuntimeError(f"task {out.index(-2)} has no episode")
    return out


def load_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def summarise(lines: list[dict], sizes: list[int]) -> list[dict]:
    """Per model and size: mean success over streams, the SD over streams (the
    per-evaluation SD), the binomial SE at that mean, and seconds per evaluation."""
    rows = []
    for label in dict.fromkeys(line["label"] for line in lines):
        mine = [line for line in lines if line["label"] == label]
        per_episode = sum(line["seconds"] for line in mine) / sum(
            len(line["success"]) for line in mine
        )
        for n in sizes:
            rates = []
            for line in mine:
                ok = np.asarray(line["success"][:n])
                ok = ok[ok >= 0]
                rates.append(100 * ok.mean())
            rates_arr = np.asarray(rates)
            p = rates_arr.mean() / 100
            rows.append(
                {
                    "label": label,
                    "tasks": n,
                    "streams": len(rates),
                    "mean": float(rates_arr.mean()),
                    "sd": float(rates_arr.std(ddof=1)) if len(rates) > 1 else math.nan,
                    "binomial_se": 100 * math.sqrt(p * (1 - p) / n),
                    "seconds": per_episode * n,
                }
            )
    return rows


def per_episode_seconds(lines: list[dict]) -> float:
    """The median over (model, stream) evaluations of seconds per episode: robust to the
    evaluations that ran while the machine was busier."""
    return float(np.median([line["seconds"] / len(line["success"]) for line in lines]))


def size_rule(
    rows: list[dict], paired_sd: float, train_seconds: float, episode_seconds: float
) -> tuple[list[dict], int]:
    """docs/results/mcgpo-powered.md step 2's rule: per size n, V(n) = V_rest + (3/8)
    sigma_eval(n)^2 (sigma^2 the mean over the models of their SD over streams, squared),
    V_rest = max(0, paired_sd^2 - (3/8) sigma_eval(n0)^2) at the smallest size n0 (the one
    ``paired_sd`` was observed at), C(n) = 2 (R + 4 n t_ep); the chosen n minimises V C,
    a smaller n within 5 % of the minimum winning. Returns the rows and the chosen n."""
    sizes = sorted({r["tasks"] for r in rows})
    var = {n: float(np.mean([r["sd"] ** 2 for r in rows if r["tasks"] == n])) for n in sizes}
    rest = max(0.0, paired_sd**2 - 3 / 8 * var[sizes[0]])
    out = []
    for n in sizes:
        v = rest + 3 / 8 * var[n]
        c = 2 * (train_seconds + 4 * n * episode_seconds)
        out.append({"tasks": n, "sigma_eval": var[n] ** 0.5, "V": v, "C": c, "VC": v * c})
    best = min(r["VC"] for r in out)
    chosen = min(r["tasks"] for r in out if r["VC"] <= 1.05 * best)
    return out, chosen


def render_rule(
    rule: list[dict], chosen: int, paired_sd: float, train_s: float, ep_s: float
) -> str:
    lines = [
        "",
        "## Step 2's rule (docs/results/mcgpo-powered.md)",
        "",
        f"Inputs: SD of the paired integrated difference at the smallest size {paired_sd} "
        f"points; training seconds per run R = {train_s:.1f}; seconds per evaluation episode "
        f"t_ep = {ep_s:.4f} (median over the evaluations above).",
        "",
        "| tasks | sigma_eval (pp) | V(n) (pp^2) | C(n) (s per seed, both arms) | V C | relative |",
        "|---|---|---|---|---|---|",
    ]
    best = min(r["VC"] for r in rule)
    for r in rule:
        lines.append(
            f"| {r['tasks']} | {r['sigma_eval']:.2f} | {r['V']:.2f} | {r['C']:.0f} | "
            f"{r['VC']:.0f} | {r['VC'] / best:.3f} |"
        )
    lines += ["", f"**Chosen evaluation size: {chosen} tasks.**", ""]
    return "\n".join(lines)


def render(rows: list[dict], header: list[str]) -> str:
    lines = [*header, ""]
    lines.append(
        "| model | tasks | streams | success % (mean) | SD over streams (pp) | "
        "binomial SE (pp) | s per evaluation |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['tasks']} | {r['streams']} | {r['mean']:.1f} | {r['sd']:.2f} | "
            f"{r['binomial_se']:.2f} | {r['seconds']:.0f} |"
        )
    lines.append("")
    lines.append(
        "SD over streams: the sample SD, over sampling streams (`--seed` 0 .. S-1), of one "
        "evaluation's success on the same first n held-out tasks. Binomial SE: sqrt(p (1-p) / n) "
        "at the mean p, the SD if every episode were an independent coin. Seconds: this "
        "machine's measured seconds per episode (one process, the threads given) times n."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", required=True)
    p.add_argument("--model", action="append", required=True, metavar="LABEL=FOLDER")
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--tasks", type=int, default=512)
    p.add_argument("--sizes", default="64,128,256,512")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-turns", type=int, default=0, help="0 = the preset's turn limit")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--paired-sd",
        type=float,
        default=0.0,
        help="with --train-seconds: apply step 2's rule (SD of the paired integrated "
        "difference observed at the smallest size, points)",
    )
    p.add_argument("--train-seconds", type=float, default=0.0, help="R of step 2's rule")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if max(sizes) > args.tasks:
        p.error(f"--sizes goes up to {max(sizes)} but --tasks is {args.tasks}")
    models = []
    for item in args.model:
        label, sep, folder = item.partition("=")
        if not sep or not Path(folder).is_dir():
            p.error(f"--model {item!r}: expected LABEL=FOLDER with an existing folder")
        models.append((label, folder))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "episodes.jsonl"
    lines = load_lines(path)
    done = {(line["label"], line["stream"]) for line in lines}
    for stream in range(args.streams):  # streams outer: every model gets stream s early
        for label, folder in models:
            if (label, stream) in done:
                continue
            table, seconds = evaluation_table(
                args.preset,
                folder,
                stream,
                args.tasks,
                args.threads,
                args.out / "eval",
                args.max_turns,
            )
            ok = successes_by_task(table, args.tasks)
            lines.append(
                {
                    "label": label,
                    "model": folder,
                    "stream": stream,
                    "success": ok,
                    "seconds": seconds,
                }
            )
            text = "".join(json.dumps(line) + "\n" for line in lines)
            atomic_write_text(path, text)
            print(
                f"[eval_noise] {label} stream {stream}: {np.mean(ok) * 100:.1f} % in {seconds:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    header = [
        "# Evaluation noise",
        "",
        f"Command: `python benchmarks/eval_noise.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
        f"Machine: {platform.machine()} {os.cpu_count()} cores; date: {time.strftime('%Y-%m-%d')}.",
    ]
    rows = summarise(lines, sizes)
    text = render(rows, header)
    if args.paired_sd > 0 and args.train_seconds > 0:
        ep = per_episode_seconds(lines)
        rule, chosen = size_rule(rows, args.paired_sd, args.train_seconds, ep)
        text += render_rule(rule, chosen, args.paired_sd, args.train_seconds, ep)
    atomic_write_text(args.out / "table.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
