"""Warm start: supervised fine-tuning on the environments' expert demonstrations.

``mcgpo sft`` plays ``sft.demos`` training tasks with ``env.expert_action()``, renders every
turn with exactly the prompt the RL rollouts use (same template, history length, response
format and prompt budget), and fine-tunes the policy with the token-mean cross-entropy of the
expert's response given the prompt (prompt tokens carry no loss). The papers start RL from an
instruct model that already succeeds sometimes; the tiny CPU model starts from nothing, so
this step plays that role. A small recipe (few demos, few steps) leaves the policy clearly
imperfect, which is what RL needs to show differences between methods; ``mcgpo sft`` reports
held-out success before and after so that this can be checked.

Noise (``sft.noise``, DAgger-style roll-in; Ross et al. 2011): the environments' experts
know where every object is and never err, so pure demonstrations never show a wrong turn or
how to recover from one, and a cloned policy that misses once tends to repeat itself. With
noise p, each demo turn takes a random admissible action with probability p instead of the
expert's; every visited state is still labelled with the expert's action, which is what
the model learns. p = 0 gives plain expert demonstrations.

Several processes (``mcgpo sft --nproc W`` or torchrun): every rank plays the same
demonstrations and takes the same shuffled steps; each step's length-sorted micro-batches
are dealt over the ranks (largest first to the least-loaded rank, as the RL update deals
its micro-batches), each rank back-propagates its share with the whole step's token count,
and the gradients are summed over the ranks before the one AdamW step every rank takes:
the single process's step up to the order of the float sums. The held-out evaluations
split their tasks over the ranks; rank 0 writes every file.

The "think" format gets an empty thought (``<think></think><action>..</action>``): the
experts give actions, not reasoning.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

import numpy as np
import torch

from mcgpo.rollout.tokens import TokenBatch
from mcgpo.training.atomic_files import atomic_write_text
from mcgpo.training.build import build_optimizer
from mcgpo.training.config import RunConfig
from mcgpo.training.distributed import SINGLE, World, all_sum, joined_world
from mcgpo.training.evaluate import evaluate
from mcgpo.training.layout import owners
from mcgpo.training.metrics import MetricSinks, ProgressBar, SilentSinks, Table
from mcgpo.training.setup import prepare
from mcgpo.training.start_lines import sft_start_line
from mcgpo.training.update import clip_gradients

__all__ = [
    "Demonstrations",
    "expert_demonstrations",
    "fine_tune",
    "run_sft",
    "sft_loss",
    "sum_gradients",
]


class Demonstrations:
    """Prompt and response token ids of every expert turn (one entry per turn)."""

    def __init__(self, prompts: list[list[int]], responses: list[list[int]], episodes: int):
        self.prompts, self.responses, self.episodes = prompts, responses, episodes

    def __len__(self) -> int:
        return len(self.prompts)

    def micro_batches(self, rows: np.ndarray, size: int) -> list[np.ndarray]:
        """``rows`` sorted by length (prompt + response) and cut into runs of ``size``
        (0: one run as given). Rows of similar length share a micro-batch, so little of it
        is padding; the order of the steps is not changed."""
        if size <= 0 or size >= len(rows):
            return [np.asarray(rows)]
        ranked = np.asarray(rows)[np.argsort(self.lengths(rows), kind="stable")]
        return [ranked[k : k + size] for k in range(0, len(ranked), size)]

    def lengths(self, rows: np.ndarray) -> list[int]:
        """Prompt + response tokens of each of ``rows``."""
        return [len(self.prompts[i]) + len(self.responses[i]) for i in rows]

    def response_tokens(self, rows: np.ndarray) -> int:
        return sum(len(self.responses[i]) for i in rows)

    def batch(self, rows: np.ndarray, pad_token_id: int) -> TokenBatch:
        zeros = [[0.0] * len(self.responses[i]) for i in rows]
        return TokenBatch.from_sequences(
            [self.prompts[i] for i in rows],
            [self.responses[i] for i in rows],
            zeros,
            pad_token_id=pad_token_id,
        )


def expert_demonstrations(
    make_env: Any, tokenizer: Any, cfg: RunConfig, response_format: str
) -> Demonstrations:
    """Play training tasks ``0 .. sft.demos-1`` with the expert; encode every turn."""
    # the rollout's own prompt rule (template, history, budget), so SFT sees RL's prompts
    from mcgpo.rollout.prompts import encode_response, format_response, prompt_ids

    prompts: list[list[int]] = []
    responses: list[list[int]] = []
    env = make_env()
    max_turns = cfg.env.max_turns or env.max_turns
    for task in range(cfg.sft.demos):
        obs = env.reset(seed=task, split=cfg.env.train_split)
        past: list[tuple[str, str]] = []
        roll_in = random.Random(f"{cfg.seed}/{task}")  # the noise of this demo, reproducible
        for _ in range(max_turns):
            expert = env.expert_action()
            ids, _ = prompt_ids(
                tokenizer,
                obs,
                past,
                history=cfg.rollout.history,
                response_format=response_format,
                max_prompt_tokens=cfg.rollout.max_prompt_tokens,
            )
            prompts.append(ids)
            responses.append(encode_response(tokenizer, format_response(expert, response_format)))
            action = expert
            if cfg.sft.noise and obs.admissible_actions and roll_in.random() < cfg.sft.noise:
                action = roll_in.choice(obs.admissible_actions)
            result = env.step(action)
            past.append((obs.text, action))
            obs = result.observation
            if result.done:
                break
    return Demonstrations(prompts, responses, cfg.sft.demos)


def sft_loss(model: Any, batch: TokenBatch, tokens: float | None = None) -> torch.Tensor:
    """Negative log-likelihood of the response tokens, summed and divided by ``tokens``
    (default: the batch's own response tokens, i.e. the token mean). A step cut into
    micro-batches passes the whole step's count, so the parts' gradients add up to the
    step's token-mean gradient."""
    from mcgpo.policy.logprobs import token_log_probs

    log_probs = token_log_probs(
        model, batch.input_ids, batch.attention_mask, positions=batch.response_mask
    )
    mask = batch.response_mask.to(log_probs.dtype)
    count = mask.sum().clamp(min=1.0) if tokens is None else max(float(tokens), 1.0)
    return -(log_probs * mask).sum() / count


def run_sft(cfg: RunConfig, command: str = "") -> Table:
    """``mcgpo sft``: warm-start ``cfg.model`` on expert demonstrations into ``<out>/model``.

    Under torchrun (W > 1 processes) the steps are data-parallel (module docstring)."""
    with joined_world(cfg, kind="sft") as (cfg, world):
        return _run_sft(cfg, command, world)


def _run_sft(cfg: RunConfig, command: str, world: World) -> Table:
    from mcgpo.policy import save_policy

    setup = prepare(cfg, command, kind="sft", world=world)
    cfg, folder = setup.cfg, setup.folder
    sinks = MetricSinks(folder, report_to=()) if world.main else SilentSinks()

    def evaluate_now(step: int) -> dict[str, float]:
        stats = evaluate(setup, world, show=cfg.progress and world.main)
        sinks.write(step, stats)
        return stats

    if world.main:  # checked and loaded: say what comes
        print(sft_start_line(cfg), file=sys.stderr, flush=True)
    before = evaluate_now(0)
    clock = time.perf_counter()
    demos = expert_demonstrations(setup.make_env, setup.tokenizer, cfg, setup.response_format)
    t_demos = time.perf_counter() - clock
    step = fine_tune(setup.model, setup.tokenizer, demos, cfg, sinks, world)
    t_train = time.perf_counter() - clock - t_demos
    after = evaluate_now(step)
    title = (
        f"warm start of {cfg.model} on {cfg.env.name}: {demos.episodes} expert episodes "
        f"({len(demos)} turns), {step} steps; eval on {cfg.eval.tasks} held-out tasks at "
        f"T={cfg.eval.temperature}; policy saved to {folder / 'model'}"
    )
    table = Table.from_metrics(title, {"before SFT": before, "after SFT": after})
    if not world.main:
        return table
    save_policy(setup.model, setup.tokenizer, folder / "model")
    summary = {
        "command": command,
        "demos": {"episodes": demos.episodes, "turns": len(demos), "seconds": round(t_demos, 2)},
        "steps": step,
        "train_seconds": round(t_train, 2),
        "processes": world.size,
        "before": before,
        "after": after,
    }
    atomic_write_text(folder / "sft.json", json.dumps(summary, indent=2) + "\n")
    sinks.close()
    return table


def fine_tune(
    model: Any,
    tokenizer: Any,
    demos: Demonstrations,
    cfg: RunConfig,
    sinks: MetricSinks | SilentSinks,
    world: World = SINGLE,
) -> int:
    """``sft.epochs`` shuffled passes over ``demos`` in batches of ``sft.batch_size``: AdamW
    (the trainer's builder) with a linear warm-up and gradient clipping; returns the steps.
    Each step's turns go through the model in length-sorted micro-batches of
    ``sft.micro_batch_size`` whose gradients add up to the step's token-mean gradient; with
    W > 1 ranks each rank runs its dealt share of them and the gradients are summed over the
    ranks (:func:`sum_gradients`) before the step."""
    device = next(model.parameters()).device
    optimizer = build_optimizer(model, cfg.sft.lr, cfg.sft.weight_decay)
    warmup = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / (cfg.sft.warmup + 1))
    )
    generator = torch.Generator().manual_seed(cfg.seed)
    per_epoch = -(-len(demos) // cfg.sft.batch_size)
    bar = ProgressBar(
        cfg.sft.epochs * per_epoch, enabled=cfg.progress and world.main, desc="sft", unit="step"
    )
    model.train()
    step = 0
    for _ in range(cfg.sft.epochs):
        order = torch.randperm(len(demos), generator=generator).numpy()
        for start in range(0, len(demos), cfg.sft.batch_size):
            rows = order[start : start + cfg.sft.batch_size]
            tokens = demos.response_tokens(rows)
            optimizer.zero_grad(set_to_none=True)
            loss = 0.0
            for part in _share(demos, demos.micro_batches(rows, cfg.sft.micro_batch_size), world):
                part_loss = sft_loss(
                    model, demos.batch(part, tokenizer.pad_token_id).to(device), tokens
                )
                part_loss.backward()
                loss += part_loss.item()
            if world.size > 1:
                loss = sum_gradients(model, loss, world)
            norm = clip_gradients(model.parameters(), cfg.sft.grad_clip)
            optimizer.step()
            warmup.step()
            step += 1
            sinks.write(step, {"sft/loss": loss, "sft/grad_norm": norm.item()})
            bar.show(loss=loss)
            bar.advance()
    bar.close()
    return step


def _share(demos: Demonstrations, parts: list[np.ndarray], world: World) -> list[np.ndarray]:
    """This rank's micro-batches of a step: dealt by rows x longest turn (:func:`owners`)."""
    if world.size == 1:
        return parts
    owner = owners([len(p) * max(demos.lengths(p)) for p in parts], world.size)
    return [p for p, r in zip(parts, owner) if r == world.rank]


def sum_gradients(model: Any, loss: float, world: World) -> float:
    """Sum every parameter's gradient over the ranks, in place (one all-reduce of a flat
    buffer; a parameter this rank did not reach counts as 0), and return the summed loss."""
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params
    ])  # fmt: skip
    torch.distributed.all_reduce(flat)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return float(all_sum([loss], world)[0])
