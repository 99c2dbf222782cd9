"""pi_old for the PPO ratio and the pair score: the sampler's log-probs, or a training forward.

The sampler returns log pi_old of every sampled token (:mod:`mcgpo.rollout.sampler`). In
float32 on the CPU they equal the training forward's to about 1e-6, and reusing them saves
a pass. In bf16 they do not: the sampler runs one token at a time against a KV cache, the
update runs whole sequences in micro-batches, and bf16 kernels round differently for each
shape. Then the ratio ``exp(log pi_theta - log pi_old)`` is not 1 at theta = theta_old, and
MCGPO's pair score ``d = mean(log pi_theta - log pi_old)`` over a row's response carries that
rounding noise as if it were a preference. verl therefore recomputes pi_old with the actor
before each update (its ``recompute_log_prob``, the default); ``train.old_logprobs`` chooses
(``auto``: recompute unless ``train.precision`` is fp32).

:func:`recompute_log_probs` runs the training forward without gradients over the update's
own micro-batches, in the update's precision, so that the first optimiser step sees a ratio
of exactly 1 (tested on CPU in bf16). :func:`mismatch_stats` measures sampler against
training forward (metrics ``pi_old/*``, docs/reference/update.md). The sampler's own log-probs stay
in the batch (``TokenBatch.behaviour_log_probs``): :func:`rollout_weights` compares the two
for the rollout correction (``train.rollout_correction``, metrics ``rollout_correction/*``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from mcgpo.objectives import (
    correction_stats_from_sums,
    response_log_ratio,
    rollout_correction_sums,
    rollout_correction_weights,
)
from mcgpo.policy.compile import compile_enabled
from mcgpo.policy.logprobs import token_log_probs
from mcgpo.policy.lora import adapter_dropout_off
from mcgpo.policy.precision import compute
from mcgpo.rollout.tokens import TokenBatch
from mcgpo.training.collectives import all_sum
from mcgpo.training.config import TrainConfig
from mcgpo.training.world import SINGLE, World

__all__ = [
    "at_old_stats",
    "mismatch_stats",
    "old_log_probs_for_update",
    "recompute_log_probs",
    "rollout_weights",
]


@torch.no_grad()
def recompute_log_probs(
    model: Any,
    batch: TokenBatch,
    micro_batches: Sequence[np.ndarray],
    *,
    precision: str,
    chunk_size: int | None = None,
    pad_passes: bool = False,
    compile_layers: bool = False,
) -> torch.Tensor:
    """``[R, L]`` float32 log-probs of ``batch``'s response tokens by the training forward.

    ``micro_batches``: row ids of each forward (the update's layout, so that every row is
    computed in the same company, hence the same shapes, as in its training forward);
    together they must cover every row once. The model's train/eval mode is left as it is
    (the update calls this in train mode, as its own forward), except that LoRA's adapter
    dropout is off (:func:`mcgpo.policy.lora.adapter_dropout_off`: pi_old is the policy
    the sampler played, in eval mode). 0 off the responses.
    ``pad_passes``: an empty row set still runs a one-token forward (FSDP2, where every
    forward all-gathers parameters, a collective: each rank makes the same number of passes).
    ``compile_layers``: the decoder layers run compiled, as in the update's forwards
    (``train.compile``; :mod:`mcgpo.policy.compile`).
    """
    with adapter_dropout_off(model):
        return _recompute(model, batch, micro_batches, precision, chunk_size, pad_passes,
                          compile_layers)  # fmt: skip


def _recompute(
    model: Any,
    batch: TokenBatch,
    micro_batches: Sequence[np.ndarray],
    precision: str,
    chunk_size: int | None,
    pad_passes: bool,
    compile_layers: bool,
) -> torch.Tensor:
    device = next(model.parameters()).device
    out = torch.zeros_like(batch.old_log_probs)
    seen = np.zeros(len(batch), dtype=bool)
    for rows in micro_batches:
        if len(rows) == 0:
            if pad_passes:
                ids = torch.zeros((1, 1), dtype=torch.long, device=device)
                model(input_ids=ids, attention_mask=torch.ones_like(ids))
            continue
        mb = batch.select(rows).to(device)
        with compute(precision, device):
            lp = token_log_probs(
                model, mb.input_ids, mb.attention_mask, chunk_size=chunk_size,
                positions=mb.response_mask, compile_layers=compile_layers,
            )  # fmt: skip
        lp = torch.where(mb.response_mask, lp, torch.zeros_like(lp))
        out[torch.as_tensor(rows), : lp.shape[1]] = lp.to(out.device)
        seen[rows] = True
    if not seen.all():
        raise ValueError(f"micro_batches miss row {int(np.flatnonzero(~seen)[0])} of the batch")
    return out


def mismatch_stats(
    sampler: torch.Tensor, training: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """How far the sampler's pi_old is from the training forward's, on response tokens.

    ``pi_old/max_abs_diff`` and ``pi_old/mean_abs_diff``: max and mean of
    ``|log p_sampler - log p_training|`` over response tokens. ``pi_old/d_spread_sampler``:
    the standard deviation over rows (with a response) of
    ``d = mean(log p_training - log p_sampler)``, i.e. the spread of MCGPO's pair score at
    theta = theta_old if pi_old were the sampler's (with the recomputed pi_old it is 0).
    """
    mask = response_mask.bool()
    diff = (sampler.float() - training.float()).abs()[mask]
    has = mask.any(1)
    d = response_log_ratio(training.float(), sampler.float(), mask)[has]
    if diff.numel() == 0:
        return {}
    return {
        "pi_old/max_abs_diff": float(diff.max()),
        "pi_old/mean_abs_diff": float(diff.mean()),
        "pi_old/d_spread_sampler": float(d.std(unbiased=False)) if len(d) else 0.0,
    }


def pooled_mismatch_stats(
    sampler: torch.Tensor, training: torch.Tensor, response_mask: torch.Tensor, world: World
) -> dict[str, float]:
    """:func:`mismatch_stats` of the union of every rank's rows, as one process computes
    them (a collective: every rank calls it): ``mean_abs_diff`` and ``d_spread_sampler``
    from summed counts and sums; ``max_abs_diff`` stays this rank's (the ranks' records are
    merged by their largest). One process: :func:`mismatch_stats` itself."""
    local = mismatch_stats(sampler, training, response_mask)
    if world.size == 1:
        return local
    mask = response_mask.bool()
    has = mask.any(1)
    # the same float32 terms as mismatch_stats, summed in float64
    d = response_log_ratio(training.float(), sampler.float(), mask)[has].double()
    diff = (sampler.float() - training.float()).abs()[mask].double()
    tokens, diff_sum, rows, d_sum, d_sq = all_sum(
        [diff.numel(), float(diff.sum()), len(d), float(d.sum()), float((d * d).sum())], world
    ).tolist()
    if tokens <= 0:
        return {}
    mean_d = d_sum / rows
    pooled = {
        "pi_old/mean_abs_diff": diff_sum / tokens,
        "pi_old/d_spread_sampler": float(np.sqrt(max(d_sq / rows - mean_d * mean_d, 0.0))),
    }
    return {"pi_old/max_abs_diff": local.get("pi_old/max_abs_diff", 0.0)} | pooled


def pooled_correction_stats(batch: TokenBatch, cfg: TrainConfig, world: World) -> dict[str, float]:
    """:func:`rollout_weights`' statistics of the union of every rank's rows, as one process
    computes them (a collective: every rank calls it, also one with no rows):
    ``rollout_correction/*`` from summed counts and sums, ``ratio_max`` this rank's (merged
    by the largest). One process: :func:`rollout_weights`' own statistics."""
    stats = rollout_weights(batch, cfg)[1]
    mode = cfg.correction()
    if world.size == 1 or mode == "none":
        return stats
    sums = rollout_correction_sums(
        batch.old_log_probs, batch.behaviour_log_probs, batch.response_mask, mode=mode,
        level=cfg.rollout_correction_level, cap=cfg.rollout_correction_cap,
    )  # fmt: skip
    pooled = correction_stats_from_sums(all_sum(sums, world))
    if not pooled:
        return {}
    return pooled | {"rollout_correction/ratio_max": stats.get("rollout_correction/ratio_max", 0.0)}


def old_log_probs_for_update(
    model: Any,
    batch: TokenBatch,
    micro_batches: Sequence[np.ndarray],
    cfg: TrainConfig,
    *,
    pad_passes: bool = False,
    world: World = SINGLE,
) -> tuple[TokenBatch, dict[str, float]]:
    """The batch with the pi_old the update uses, and the sampler-vs-training mismatch
    (measured when pi_old is recomputed, or when ``train.old_logprobs_check`` asks; over
    every rank's rows, :func:`pooled_mismatch_stats`)."""
    recompute = cfg.recompute_old()
    if not (recompute or cfg.old_logprobs_check):
        return batch, {}
    fresh = recompute_log_probs(
        model,
        batch,
        micro_batches,
        precision=cfg.precision,
        chunk_size=cfg.logits_chunk or None,
        pad_passes=pad_passes,
        compile_layers=compile_enabled(cfg.compile, next(model.parameters()).device),
    )
    stats = pooled_mismatch_stats(batch.behaviour_log_probs, fresh, batch.response_mask, world)
    stats["pi_old/recomputed"] = float(recompute)
    if recompute:
        batch = dataclasses.replace(batch, old_log_probs=fresh)
    return batch, stats


def rollout_weights(
    batch: TokenBatch, cfg: TrainConfig
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The rollout-correction weights of ``batch``'s tokens, pi_old against the sampler's
    log-probs (:func:`mcgpo.objectives.rollout_correction_weights` with
    ``train.rollout_correction*``), and their ``rollout_correction/*`` stats; (None, {})
    when the correction is none (``auto`` is resolved by the run's setup; here it is
    resolved as for the hf engine)."""
    mode = cfg.correction()
    if mode == "none":
        return None, {}
    return rollout_correction_weights(
        batch.old_log_probs,
        batch.behaviour_log_probs,
        batch.response_mask,
        mode=mode,
        level=cfg.rollout_correction_level,
        cap=cfg.rollout_correction_cap,
    )


def at_old_stats(probe: list[tuple[np.ndarray, float]]) -> dict[str, float]:
    """The first optimiser step's view of pi_old: theta = theta_old there, so the ratio
    should be 1 and d should be 0; their deviations are rounding (or a stale pi_old)."""
    if not probe:
        return {}
    d = np.concatenate([rows for rows, _ in probe])
    return {
        "pi_old/ratio_max_dev_at_old": max(dev for _, dev in probe),
        "pairs/d_spread_at_old": float(d.std()) if len(d) else 0.0,
    }
