"""One policy update over a rollout batch: PPO-clip + KL + entropy, plus the MCGPO pair loss.

Per micro-batch B of a mini-batch M (reference/algorithms.md 1.4 and 5.1):

    L_task(B) = PG_clip(B) + kl_coef * KL(B) - entropy_coef * H(B)        token means over B
    L_pair(B) = 1/floor(|B|/2) * sum_{(+,-) in P(B)} c * softplus(-(d+ - d-))     (5.1)
    loss(B)   = T_B / T_M * L_task(B) + lambda_pair * |B| / |M| * L_pair(B)

with T the number of response tokens, P(B) the preference pairs whose two rows are both in
B, and d the length-normalised log-ratio of a row against pi_old. Gradients of every
micro-batch of M accumulate; then one clipped AdamW step.

Aggregation, stated exactly:

1. The task loss is the token mean over the whole mini-batch ("token-mean", verl's
   ``loss_agg_mode``): each micro-batch's token mean is weighted by its share of the tokens,
   so the gradient does not depend on how M is cut into micro-batches (tested). verl-agent
   divides each micro-batch's mean by the number of micro-batches instead, which weighs a
   token of a short micro-batch more; we take the split-invariant form.
2. The pair loss keeps the seed's per-micro-batch normalisation ``1/floor(|B|/2)``; the
   micro-batch terms are averaged with weights ``|B|/|M|`` (so with |B| even the sum equals
   ``2/|M| * sum_pairs c softplus(..)``, again independent of the split).
3. Mini-batches (one optimiser step each) are whole task groups in row order, packed to at
   most ``train.mini_batch_size`` rows (:func:`plan_mini_batches`; a larger group is a step
   of its own). The layout ignores the preference pairs, so GraphGPO and MCGPO take the
   same optimiser steps on the same rows, and paired rows are spread over the steps like
   any others; a pair lies inside one group, hence inside one mini-batch
   (``pairs/split_mini`` counts the exceptions, 0 when the trainer passes the groups).
   Inside a mini-batch, :func:`mcgpo.objectives.plan_micro_batches` keeps pair partners in
   one micro-batch; by item 1 this moves float rounding only. A pair split anyway (micro-
   batch size 1) is dropped and counted in ``pairs/split_micro``. Both counts are per
   update: the layout is planned once and reused by every PPO epoch.
4. Mini-batches are taken in that order, without shuffling, and every PPO epoch reuses the
   same pi_old (the weights are unchanged between sampling and the first step; later steps
   are off-policy as usual): the sampler's log-probs, or, with ``train.old_logprobs``
   recompute (the default unless ``train.precision`` is fp32), a no-grad training forward
   over the same micro-batches before the first step (:mod:`mcgpo.training.old_logprobs`),
   which makes the first step's ratio exactly 1. The sampler's own log-probs stay in the
   batch: with ``train.rollout_correction`` tis / mis each token's policy-gradient loss is
   weighted by pi_old / sampler, truncated or masked
   (:func:`mcgpo.objectives.rollout_correction_weights`; the same weights in every epoch,
   the KL, entropy and pair terms unweighted). Inside a mini-batch the rows are laid out by
   sequence length before planning micro-batches, so a micro-batch pads to little more than
   its own rows' length; by item 1 this changes the speed, not the gradient.
5. A non-finite gradient norm skips the optimiser step (counted in ``update/skipped``).
6. Every forward runs in ``train.precision`` (:func:`mcgpo.policy.precision.compute`: bf16
   autocast for bf16-mixed); backward runs outside autocast, as torch prescribes; log-probs
   and losses are float32. The first optimiser step (theta = theta_old) also reports how far
   the ratio is from 1 and the spread of the pair score d there (``pi_old/*``, ``pairs/*``).
7. W > 1 processes: every rank gathers the whole batch, plans the layout of items 3-4 on
   it, and runs a share of each step's micro-batches (balanced by rows x padded length), so
   the W ranks compute the single process's micro-batches and their summed gradient is its
   gradient; only the order of the sums differs. (Ranks hold contiguous blocks of groups
   for rollouts and credit; splitting the update by those blocks would put a whole step on
   one rank whenever a step is smaller than a block, with no data parallelism at all.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from mcgpo.objectives import pair_loss, response_log_ratio, task_loss
from mcgpo.policy.compile import compile_enabled, compile_stats, compiled_graphs
from mcgpo.policy.logprobs import token_log_probs, token_log_probs_and_entropy
from mcgpo.policy.lora import reference_forward
from mcgpo.policy.precision import compute
from mcgpo.rollout.tokens import TokenBatch
from mcgpo.training.config import TrainConfig
from mcgpo.training.distributed import SINGLE, World, gradient_sync, sharded, zero_backward
from mcgpo.training.layout import Layout, PairBatch, plan_mini_batches, plan_rank_share
from mcgpo.training.metrics import PeakMemory
from mcgpo.training.old_logprobs import (
    at_old_stats,
    old_log_probs_for_update,
    pooled_correction_stats,
    rollout_weights,
)
from mcgpo.training.pair_probe import GradProbe, PairFit

__all__ = [
    "PairBatch",
    "clip_gradients",
    "plan_mini_batches",
    "update_policy",
]


def clip_gradients(params: Iterable[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip the gradient norm to ``max_norm`` (0 = off, as ``train.grad_clip`` and
    ``sft.grad_clip``); returns the norm before clipping. With FSDP2 the gradients are
    DTensor shards and the norm is a replicated DTensor of the global norm (torch reduces
    the shards' norms over the ranks); it is returned as a plain tensor."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm or float("inf"))
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


class _Averages:
    """Weighted running means of the update's statistics."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}

    def add(self, key: str, value: float, weight: float = 1.0) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + float(value) * weight
        self.weights[key] = self.weights.get(key, 0.0) + weight

    def add_all(self, stats: dict[str, tuple[float, float]]) -> None:
        for key, (value, weight) in stats.items():
            self.add(key, value, weight)

    def means(self) -> dict[str, float]:
        return {
            k: s / self.weights[k] if self.weights[k] else float("nan")
            for k, s in self.sums.items()
        }


def update_policy(
    model: Any,
    optimizer: torch.optim.Optimizer,
    batch: TokenBatch,
    advantages: np.ndarray,
    cfg: TrainConfig,
    *,
    pairs: PairBatch | None = None,
    lambda_pair: float = 0.0,
    ref_model: Any = None,
    groups: np.ndarray | None = None,
    world: World = SINGLE,
) -> dict[str, float]:
    """Run ``cfg.ppo_epochs`` passes of clipped policy-gradient steps over ``batch``.

    ``advantages`` holds one value per row of ``batch`` (broadcast to its response tokens).
    ``groups`` (``[rows]``, the StepTable's ``group`` column) makes the mini-batches whole
    task groups (:func:`plan_mini_batches`); None treats every row as its own group.
    ``ref_model`` is the frozen reference for the KL term (needed when ``cfg.kl_coef > 0``).
    ``world`` (W > 1): ``model`` is DDP-wrapped (or FSDP2-sharded) and ``batch`` is this
    rank's block of whole groups (``pairs`` and ``groups`` in its own numbering). The ranks
    gather the whole batch's outline (:func:`mcgpo.training.layout.batch_outline`), each
    plans the single process's layout of it and runs its share of every step's micro-batches
    (:func:`mcgpo.training.layout.deal`; :func:`~mcgpo.training.layout.fetch_rows` brings
    their token rows from the ranks that hold them); the normalisers
    are the whole steps' row and token counts, and each rank's loss is scaled by W because
    DDP and FSDP2 average the gradients: the summed gradient is the single-process one, from
    the same micro-batches (FSDP2: :func:`mcgpo.training.layout.same_pass_count` too).
    Returns averaged statistics (losses, clip fractions, KL, entropy, gradient norm).
    """
    _check_inputs(batch, advantages, cfg, ref_model)
    fit = None  # train.pair_probe: the pairs' rows before the update (also at lambda_pair 0)
    if cfg.pair_probe and pairs is not None:
        fit = PairFit.before_update(model, batch, pairs, cfg.precision, cfg.micro_batch_size)
    pairs = pairs if pairs is not None and lambda_pair > 0 else PairBatch.empty()
    planned = plan_rank_share(model, batch, advantages, pairs, groups, cfg, world)
    if planned is None:  # every trajectory of the batch errored: nothing to learn from
        return {"update/optimizer_steps": 0.0, "update/rows": 0.0, "update/tokens": 0.0}
    batch, advantages, pairs, layout, given = planned
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    memory = PeakMemory.start(device, "update")
    graphs = compiled_graphs() if compile_enabled(cfg.compile, device) else None
    micros = [rows for step in layout.steps for rows in step]
    batch, old_stats = old_log_probs_for_update(
        model, batch, micros, cfg, pad_passes=world.size > 1 and sharded(model), world=world
    )
    old_stats |= pooled_correction_stats(batch, cfg, world)  # rollout_correction/*: all rows
    probe: list[tuple[np.ndarray, float]] = []  # (d of each row, max |ratio - 1|) at theta_old
    grads = GradProbe(params) if cfg.pair_probe else None  # first step's two gradients
    totals = _Averages()
    steps = skipped = used = 0
    for epoch in range(cfg.ppo_epochs):
        for k, step_micros in enumerate(layout.steps):
            first = epoch == k == 0  # theta = theta_old: the probes read this step
            stepped, step_used = _optimizer_step(
                model, ref_model, optimizer, params, batch, advantages, pairs, cfg, lambda_pair,
                step_micros, layout.rows[k], layout.tokens[k], world, totals,
                probe=probe if first else None, grads=grads if first else None,
            )  # fmt: skip
            used += step_used
            steps += stepped
            skipped += not stepped
    optimizer.zero_grad(set_to_none=True)
    out = totals.means()
    counts = _counts(batch, layout, given, steps, skipped, used / cfg.ppo_epochs)
    probed = grads.stats() if grads is not None else {}
    probed |= fit.stats(model) if fit is not None else {}
    compiled = compile_stats(graphs) if graphs is not None else {}  # train.compile: compile/*
    return {
        **out, **counts, **old_stats, **at_old_stats(probe), **probed, **compiled,
        **memory.stop(),
    }  # fmt: skip


def _optimizer_step(
    model: Any,
    ref_model: Any,
    optimizer: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    batch: TokenBatch,
    advantages: np.ndarray,
    pairs: PairBatch,
    cfg: TrainConfig,
    lambda_pair: float,
    micros: list[np.ndarray],
    mini_rows: int,
    mini_tokens: int,
    world: World,
    totals: _Averages,
    *,
    probe: list[tuple[np.ndarray, float]] | None,
    grads: GradProbe | None,
) -> tuple[bool, int]:
    """One optimiser step: the gradients of this rank's ``micros`` of the step accumulate,
    then clipping and AdamW. Returns (stepped: False when the gradient norm is not finite,
    pairs used); statistics go to ``totals``."""
    device = next(model.parameters()).device
    scale = world.size  # DDP and FSDP2 average gradients over the ranks; the loss is a global sum
    used = 0
    optimizer.zero_grad(set_to_none=True)
    for i, rows in enumerate(micros):
        with gradient_sync(model, last=i == len(micros) - 1):
            if len(rows) == 0:  # FSDP2 padding: a pass to match the other ranks'
                zero_backward(model, device, ref_model if cfg.kl_coef > 0 else None)
                continue
            stats = _micro_step(
                model, ref_model, batch.select(rows).to(device), advantages[rows], rows, pairs,
                cfg, lambda_pair,
                token_share=scale * _share(batch, rows, mini_tokens),
                row_share=scale * len(rows) / mini_rows,
                probe=probe, grads=grads,
            )  # fmt: skip
        used += int(stats.pop("pairs/used")[0])
        totals.add_all(stats)
    if not micros:  # no rows of this step here: join its gradient all-reduce
        zero_backward(model, device, ref_model if cfg.kl_coef > 0 else None)
    norm = clip_gradients(params, cfg.grad_clip)
    totals.add("update/grad_norm", float(norm))
    if not torch.isfinite(norm):
        return False, used
    optimizer.step()
    return True, used


def _check_inputs(
    batch: TokenBatch, advantages: np.ndarray, cfg: TrainConfig, ref_model: Any
) -> int:
    n = len(batch)
    if advantages.shape != (n,):
        raise ValueError(f"advantages has shape {advantages.shape}, expected ({n},)")
    if cfg.kl_coef > 0 and ref_model is None:
        raise ValueError("kl_coef > 0 needs a reference model")
    return n


def _counts(
    batch: TokenBatch, layout: Layout, given: int, steps: int, skipped: int, used: float
) -> dict[str, float]:
    """The counts of one update on this rank (steps; rows, tokens and pairs it ran)."""
    return {
        "update/optimizer_steps": float(steps),
        "update/skipped": float(skipped),
        "update/rows": float(len(batch)),
        "update/tokens": float(batch.response_mask.sum()),
        "update/max_micro_tokens": float(layout.widest),
        "pairs/given": float(given),
        "pairs/split_mini": float(layout.split_mini),
        "pairs/split_micro": float(layout.split_micro),
        "pairs/used": float(used),
    }


def _probe(
    log_probs: torch.Tensor, old: torch.Tensor, mask: torch.Tensor
) -> tuple[np.ndarray, float]:
    """d of each row with a response, and max |exp(log p - log p_old) - 1| on responses."""
    d = response_log_ratio(log_probs, old, mask)[mask.any(1)]
    dev = (torch.exp(log_probs - old) - 1).abs()[mask]
    return d.cpu().numpy(), float(dev.max()) if dev.numel() else 0.0


def _share(batch: TokenBatch, rows: np.ndarray, mini_tokens: int) -> float:
    tokens = int(batch.response_mask[torch.as_tensor(rows)].sum())
    return tokens / mini_tokens if mini_tokens else 0.0


def _micro_step(
    model: Any,
    ref_model: Any,
    mb: TokenBatch,
    advantages: np.ndarray,
    rows: np.ndarray,
    pairs: PairBatch,
    cfg: TrainConfig,
    lambda_pair: float,
    *,
    token_share: float,
    row_share: float,
    probe: list[tuple[np.ndarray, float]] | None = None,
    grads: GradProbe | None = None,
) -> dict[str, tuple[float, float]]:
    """Forward, loss and backward of one micro-batch (``rows`` of the batch).

    Returns {metric: (value, weight)}; the trainer averages values with these weights.
    ``probe`` (first optimiser step only) collects d per row and the max |ratio - 1|;
    ``grads`` (first step, ``train.pair_probe``) the task and pair terms' gradients.
    """
    chunk = cfg.logits_chunk or None
    mask = mb.response_mask
    ref = None
    layers = compile_enabled(cfg.compile, mb.device)  # train.compile
    with compute(cfg.precision, mb.device):
        log_probs, entropy = token_log_probs_and_entropy(
            model, mb.input_ids, mb.attention_mask, with_entropy=cfg.entropy_coef > 0,
            chunk_size=chunk, positions=mask, compile_layers=layers,
        )  # fmt: skip
        if cfg.kl_coef > 0:
            with torch.no_grad(), reference_forward(ref_model) as reference:  # LoRA: adapters off
                ref = token_log_probs(
                    reference, mb.input_ids, mb.attention_mask, chunk_size=chunk,
                    positions=mask, compile_layers=layers,
                )  # fmt: skip
    if probe is not None:
        probe.append(_probe(log_probs.detach(), mb.old_log_probs, mask))
    weights, _ = rollout_weights(mb, cfg)  # train.rollout_correction (None: off)
    task, task_stats = task_loss(
        log_probs,
        mb.old_log_probs,
        mb.per_token(advantages),
        mask,
        ref_log_probs=ref,
        entropy=entropy if cfg.entropy_coef > 0 else None,
        clip=cfg.clip,
        dual_clip=cfg.dual_clip,
        kl_coef=cfg.kl_coef,
        kl_kind=cfg.kl_kind,
        entropy_coef=cfg.entropy_coef,
        rollout_weights=weights,
    )
    names = {"pg_loss": "loss/policy", "kl": "loss/kl", "entropy": "policy/entropy"}
    stats = {names.get(k, f"policy/{k}"): (v, token_share) for k, v in task_stats.items()}
    stats["loss/task"] = (task.item(), token_share)
    task_term = token_share * task
    loss = task_term
    pair_term = None
    stats["pairs/used"] = (0.0, 0.0)
    if lambda_pair > 0 and len(pairs.plus):
        d = response_log_ratio(log_probs, mb.old_log_probs, mask)
        pair, pair_stats = pair_loss(d, pairs.plus, pairs.minus, pairs.weight, rows)
        pair_term = lambda_pair * row_share * pair
        loss = loss + pair_term
        stats["loss/pair"] = (pair.item(), row_share)
        used = pair_stats["pairs"]
        stats["pairs/used"] = (used, 0.0)
        if used:
            stats["pairs/margin"] = (pair_stats["pair_margin"], used)
            stats["pairs/accuracy"] = (pair_stats["pair_accuracy"], used)
    if grads is not None:
        grads.add(task_term, pair_term)
    loss.backward()
    return stats
