"""Warm-start (``mcgpo sft``) steps per second at several ``sft.micro_batch_size`` values.

The household-quick warm start makes 1,216 AdamW steps of 32 demonstration turns; each
step's turns are padded to the longest one in its forward. With ``sft.micro_batch_size``
> 0 the step's turns are sorted by length and cut into micro-batches whose gradients add
up to the step's (tests/training/test_sft.py checks the equality), so only the padding
changes. This script builds the preset's demonstrations once, then times ``--steps``
optimiser steps (the first steps of epoch 1, in the run's own order) for each value, from
the same starting weights, alternating the values ``--repeats`` times and keeping the
best (other processes on a shared machine only ever add time). It prints steps/s, the
token slots (rows x padded length, summed over the forwards) against the real tokens, and
the loss after the timed steps (equal up to rounding across values).

Run:  python benchmarks/bench_sft.py [--model runs/main/sft/model] [--sizes 0,4,8,16]
      [--steps 40] [--repeats 2] [--threads 2]
Without ``--model`` it times the preset's untrained tiny policy (same shapes).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import tempfile
import time

import torch

from machine import cpu_name
from mcgpo.training.build import build_optimizer
from mcgpo.training.config_layout import from_dict
from mcgpo.training.presets import load_preset
from mcgpo.training.setup import prepare
from mcgpo.training.sft import expert_demonstrations, sft_loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="household-quick")
    parser.add_argument("--model", default=None, help="policy folder (default: the preset's)")
    parser.add_argument("--sizes", default="0,4,8,16", help="micro-batch sizes; 0 = whole step")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    data = load_preset(args.preset)
    data["out"] = os.path.join(tempfile.mkdtemp(prefix="bench-sft-"), "run")
    data["threads"] = args.threads
    if args.model:
        data["model"] = args.model
    cfg = from_dict(data)
    setup = prepare(cfg, "bench_sft", kind="eval")
    cfg, tokenizer = setup.cfg, setup.tokenizer
    demos = expert_demonstrations(setup.make_env, tokenizer, cfg, setup.response_format)
    generator = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(len(demos), generator=generator).numpy()
    size = cfg.sft.batch_size
    steps = [order[k : k + size] for k in range(0, min(len(order), args.steps * size), size)]
    start_state = copy.deepcopy(setup.model.state_dict())
    pad = tokenizer.pad_token_id

    def run(micro: int) -> tuple[float, int, float]:
        model = setup.model
        model.load_state_dict(start_state)
        model.train()
        optimizer = build_optimizer(model, cfg.sft.lr, cfg.sft.weight_decay)
        slots, loss = 0, 0.0
        clock = time.perf_counter()
        for rows in steps:
            tokens = demos.response_tokens(rows)
            optimizer.zero_grad(set_to_none=True)
            loss = 0.0
            for part in demos.micro_batches(rows, micro):
                batch = demos.batch(part, pad)
                slots += batch.input_ids.numel()
                part_loss = sft_loss(model, batch, tokens)
                part_loss.backward()
                loss += part_loss.item()
            optimizer.step()
        return time.perf_counter() - clock, slots, loss

    real = sum(len(demos.prompts[i]) + len(demos.responses[i]) for rows in steps for i in rows)
    best: dict[int, tuple[float, int, float]] = {}
    for _ in range(args.repeats):
        for micro in sizes:
            result = run(micro)
            if micro not in best or result[0] < best[micro][0]:
                best[micro] = result

    print(
        f"{datetime.datetime.now().isoformat(timespec='seconds')} | {cpu_name()} | "
        f"{os.cpu_count()} CPUs | Python {platform.python_version()} | torch "
        f"{torch.__version__} | {torch.get_num_threads()} threads"
    )
    print(
        f"{args.preset}: {len(demos)} demonstration turns, {len(steps)} steps of {size} turns, "
        f"{real:,} real tokens; best of {args.repeats}"
    )
    print()
    base = best[sizes[0]][0]
    print(f"{'micro_batch_size':>16} {'steps/s':>8} {'speed-up':>9} {'slots/real':>11} {'loss':>9}")
    for micro in sizes:
        seconds, slots, loss = best[micro]
        print(
            f"{micro:16d} {len(steps) / seconds:8.2f} {base / seconds:8.2f}x "
            f"{slots / real:11.2f} {loss:9.4f}"
        )


if __name__ == "__main__":
    main()
