"""The quality of warm starts: held-out success and held-out expert-action NLL, per run.

For each ``mcgpo sft`` run folder given, prints the held-out success after the warm start
(``sft.json``: the run's own evaluation, 64 ``valid_seen`` tasks at T = 0.4 for
household-quick) and the token-mean NLL of the expert's actions on ``--episodes``
held-out episodes (``valid_seen`` tasks 0 .. N-1, played as the warm start plays its
demonstrations: the expert labels every turn, a noise-0.3 roll-in with the roll-in seed of
``--rollin-seed``, the run's own prompt rule). Every run is scored on the same turns (given
the same tokenizer), so the NLL is a paired, far less noisy measure of the same imitation
than success on 64 tasks. With ``--pair A,B`` (two labels: the folder names' prefixes up to
``-s<seed>``), it also prints B - A per seed and the mean difference with a 95 % bootstrap
interval over the seeds.

Run:  python benchmarks/warm_start_quality.py runs/q/one-s0 runs/q/two-s0 ... \\
          [--episodes 150] [--pair one,two]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import torch

from mcgpo.training.build import env_factory, load_model, response_format_for
from mcgpo.training.config_layout import from_dict
from mcgpo.training.presets import parse_toml
from mcgpo.training.sft import expert_demonstrations, sft_loss


def held_out_nll(folder: Path, episodes: int, rollin_seed: int) -> tuple[float, int]:
    """Token-mean NLL of the expert's actions on held-out episodes, and the turn count."""
    data = parse_toml((folder / "config.toml").read_text(encoding="utf-8"))
    data["model"] = str(folder / "model")
    cfg = from_dict(data)
    cfg = dataclasses.replace(
        cfg,
        seed=rollin_seed,
        env=dataclasses.replace(cfg.env, train_split="valid_seen"),
        sft=dataclasses.replace(cfg.sft, demos=episodes),
    )
    make_env = env_factory(cfg)
    model, tokenizer = load_model(cfg, make_env=make_env)
    model.eval()
    demos = expert_demonstrations(make_env, tokenizer, cfg, response_format_for(cfg, tokenizer))
    rows = np.arange(len(demos))
    total, tokens = 0.0, demos.response_tokens(rows)
    with torch.no_grad():
        for part in demos.micro_batches(rows, 32):
            total += float(sft_loss(model, demos.batch(part, tokenizer.pad_token_id), tokens))
    return total, len(demos)


def bootstrap(diffs: np.ndarray, draws: int = 10_000, seed: int = 0) -> tuple[float, float]:
    gen = np.random.default_rng(seed)
    means = diffs[gen.integers(0, len(diffs), (draws, len(diffs)))].mean(1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="mcgpo sft run folders")
    parser.add_argument("--episodes", type=int, default=150)
    parser.add_argument("--rollin-seed", type=int, default=0)
    parser.add_argument("--pair", default="", help="A,B: print B - A per seed")
    args = parser.parse_args()
    torch.set_num_threads(2)
    scores: dict[str, tuple[float, float]] = {}
    print("| run | processes | held-out success % | held-out NLL | turns |")
    print("|---|---|---|---|---|")
    for folder in args.runs:
        summary = json.loads((folder / "sft.json").read_text(encoding="utf-8"))
        success = 100 * summary["after"]["eval/success"]
        nll, turns = held_out_nll(folder, args.episodes, args.rollin_seed)
        scores[folder.name] = (success, nll)
        procs = summary.get("processes", 1)
        print(f"| {folder.name} | {procs} | {success:.1f} | {nll:.3f} | {turns} |", flush=True)
    if not args.pair:
        return
    a, b = args.pair.split(",")
    seeds = sorted(
        {m.group(1) for n in scores if (m := re.match(rf"(?:{a}|{b})-s(\d+)$", n))}, key=int
    )
    both = [s for s in seeds if f"{a}-s{s}" in scores and f"{b}-s{s}" in scores]
    print(f"\n| seed | success {a} | success {b} | NLL {a} | NLL {b} |")
    print("|---|---|---|---|---|")
    for s in both:
        (sa, na), (sb, nb) = scores[f"{a}-s{s}"], scores[f"{b}-s{s}"]
        print(f"| {s} | {sa:.1f} | {sb:.1f} | {na:.3f} | {nb:.3f} |")
    for k, name in ((0, "success"), (1, "NLL")):
        va = np.array([scores[f"{a}-s{s}"][k] for s in both])
        vb = np.array([scores[f"{b}-s{s}"][k] for s in both])
        lo, hi = bootstrap(vb - va)
        print(
            f"{name}: {a} {va.mean():.3f} ± {va.std(ddof=1):.3f}, {b} {vb.mean():.3f} ± "
            f"{vb.std(ddof=1):.3f}; {b} - {a} paired {np.mean(vb - va):+.3f} "
            f"[{lo:+.3f}, {hi:+.3f}] (95 % bootstrap over {len(both)} seeds)"
        )


if __name__ == "__main__":
    main()
