"""Rollout correction (torch; docs/reference/update.md "Rollout correction"): importance weights for
tokens the trainer did not sample itself.

The tokens were sampled by the behaviour policy mu (the sampler, vLLM), whose log-probs
differ from the trainer's pi_old by kernels and precision. With rho = pi_old / mu per token
(``level`` token) or the product over a row's response (``level`` sequence), a detached
weight w multiplies l_t of the policy-gradient term (:func:`mcgpo.objectives.policy_loss`'s
``weights``):

    tis:  w = min(rho, cap)                             truncated IS (Yao et al. 2025)
    mis:  w = rho if 1/cap <= rho <= cap else 0         masked IS (verl's IcePop bounds)

The KL, entropy and pair terms are not weighted (verl's ``rollout_is_weights`` multiply
``pg_losses`` only); w = 1 exactly at zero mismatch, so the loss is then the uncorrected one.

:func:`rollout_correction_weights` gives the weights and their statistics on one process;
:func:`rollout_correction_sums` and :func:`correction_stats_from_sums` give the same
statistics pooled over ranks (sums all-reduced, then divided once).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from mcgpo.objectives.losses import LOG_RATIO_CLAMP
from mcgpo.update_choices import ROLLOUT_CORRECTION_LEVELS, ROLLOUT_CORRECTIONS

__all__ = [
    "CORRECTION_SUMS",
    "ROLLOUT_CORRECTIONS",
    "ROLLOUT_CORRECTION_LEVELS",
    "correction_stats_from_sums",
    "rollout_correction_sums",
    "rollout_correction_weights",
]


@torch.no_grad()
def rollout_correction_weights(
    old_log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    level: str,
    cap: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights pi_old / mu for tokens sampled by a behaviour policy mu.

    ``old_log_probs``: ``[B, L]`` log pi_old (the trainer's forward); ``behaviour_log_probs``:
    ``[B, L]`` log mu of the same tokens (the sampler's own); ``mask``: ``[B, L]`` response
    tokens. ``level`` "token": one ratio per token, rho_t = exp(log pi_old - log mu);
    "sequence": one per row, rho = exp(sum_t over its response (log pi_old - log mu)), given
    to each of its tokens. Log-ratios are clamped to [-20, 20] before ``exp`` (as verl).
    ``mode`` "none": w = 1; "tis": w = min(rho, cap); "mis": w = rho inside
    [1/cap, cap] (bounds kept), 0 outside (the token or the whole row is masked out).
    ``cap`` > 1. Returns (detached weights in the log-probs' dtype, at least float32, 0 off
    the mask; stats): ratio mean and max over the units of ``level`` (tokens, or rows with a
    response), the fraction of units truncated (tis) or masked (mis), the mean weight over
    response tokens, and the SD over rows of the sequence log-ratio
    sum_t (log pi_old - log mu). Empty ``mask``: no stats.
    """
    t = _correction_terms(old_log_probs, behaviour_log_probs, mask, mode=mode, level=level, cap=cap)
    if not bool(t.mask.any()):
        return t.weights, {}
    per_unit = t.ratio[t.units]
    seq = t.seq_log_ratio[t.has]
    stats = {
        "rollout_correction/ratio_mean": float(per_unit.mean()),
        "rollout_correction/ratio_max": float(per_unit.max()),
        "rollout_correction/clipped_frac": float(t.truncated[t.units].float().mean()),
        "rollout_correction/masked_frac": float(t.masked[t.units].float().mean()),
        "rollout_correction/weight_mean": float(t.weights[t.mask].mean()),
        "rollout_correction/seq_log_ratio_sd": float(seq.std(correction=0)),
    }
    return t.weights, stats


class _CorrectionTerms(NamedTuple):
    weights: torch.Tensor  # [B, L], 0 off the mask
    ratio: torch.Tensor  # [B, L] (token level) or [B, 1] (sequence level)
    units: torch.Tensor  # bool, the ratio's units: response tokens, or rows with a response
    truncated: torch.Tensor  # bool, units truncated (tis)
    masked: torch.Tensor  # bool, units masked out (mis)
    seq_log_ratio: torch.Tensor  # [B], sum over the response of log pi_old - log mu
    has: torch.Tensor  # [B] bool, rows with a response
    mask: torch.Tensor  # [B, L] bool


def _correction_terms(
    old_log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    level: str,
    cap: float,
) -> _CorrectionTerms:
    """The weights of :func:`rollout_correction_weights` and the terms its statistics use."""
    if mode not in ROLLOUT_CORRECTIONS:
        raise ValueError(
            f"rollout_correction_weights: mode must be one of "
            f"{', '.join(ROLLOUT_CORRECTIONS)}; got {mode!r}"
        )
    if level not in ROLLOUT_CORRECTION_LEVELS:
        raise ValueError(
            f"rollout_correction_weights: level must be one of "
            f"{', '.join(ROLLOUT_CORRECTION_LEVELS)}; got {level!r}"
        )
    if not (math.isfinite(cap) and cap > 1.0):
        raise ValueError(f"rollout_correction_weights: cap must be a finite number > 1, got {cap}")
    if old_log_probs.shape != behaviour_log_probs.shape or old_log_probs.shape != mask.shape:
        raise ValueError(
            f"rollout_correction_weights: shapes differ: old {tuple(old_log_probs.shape)}, "
            f"behaviour {tuple(behaviour_log_probs.shape)}, mask {tuple(mask.shape)}"
        )
    m = mask.bool()
    dtype = torch.promote_types(
        torch.promote_types(old_log_probs.dtype, behaviour_log_probs.dtype), torch.float32
    )
    zero = torch.zeros((), dtype=dtype, device=old_log_probs.device)
    log_ratio = torch.where(m, old_log_probs.to(dtype) - behaviour_log_probs.to(dtype), zero)
    seq_log_ratio = log_ratio.sum(-1)  # [B]
    has = m.any(-1)
    if level == "token":
        unit_log_ratio, units = log_ratio, m
    else:
        unit_log_ratio, units = seq_log_ratio[:, None], has[:, None]
    ratio = torch.exp(unit_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    truncated = torch.zeros_like(units)
    masked = torch.zeros_like(units)
    if mode == "none":
        weight = torch.ones_like(ratio)
    elif mode == "tis":
        truncated = units & (ratio > cap)
        weight = ratio.clamp(max=cap)
    else:
        masked = units & ((ratio < 1.0 / cap) | (ratio > cap))
        weight = torch.where(masked, torch.zeros_like(ratio), ratio)
    weights = torch.where(m, weight.expand_as(log_ratio), zero).detach()
    return _CorrectionTerms(weights, ratio, units, truncated, masked, seq_log_ratio, has, m)


# the sufficient statistics of rollout_correction_weights' stats, in this order
CORRECTION_SUMS = (
    "units", "ratio_sum", "truncated", "masked", "tokens", "weight_sum", "rows", "seq_sum",
    "seq_sq_sum",
)  # fmt: skip


@torch.no_grad()
def rollout_correction_sums(
    old_log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    level: str,
    cap: float,
) -> np.ndarray:
    """Counts and sums (float64, in the order of ``CORRECTION_SUMS``) from which
    :func:`correction_stats_from_sums` gives the statistics of
    :func:`rollout_correction_weights` except ``ratio_max``; summed over several row sets
    (ranks) they give the statistics of the union, as one process would compute them.
    The arguments are those of :func:`rollout_correction_weights`, checked there."""
    t = _correction_terms(old_log_probs, behaviour_log_probs, mask, mode=mode, level=level, cap=cap)
    seq = t.seq_log_ratio[t.has].double()
    return np.array([
        float(t.units.sum()), float(t.ratio[t.units].double().sum()),
        float(t.truncated[t.units].sum()), float(t.masked[t.units].sum()),
        float(t.mask.sum()), float(t.weights[t.mask].double().sum()),
        float(t.has.sum()), float(seq.sum()), float((seq * seq).sum()),
    ], dtype=np.float64)  # fmt: skip


def correction_stats_from_sums(sums: np.ndarray) -> dict[str, float]:
    """The ``rollout_correction/*`` statistics (all but ``ratio_max``) from
    :func:`rollout_correction_sums`, pooled; no stats when no response token is counted."""
    v = dict(zip(CORRECTION_SUMS, np.asarray(sums, dtype=np.float64).tolist(), strict=True))
    if v["tokens"] <= 0:
        return {}
    mean_seq = v["seq_sum"] / v["rows"]
    var = max(v["seq_sq_sum"] / v["rows"] - mean_seq * mean_seq, 0.0)
    return {
        "rollout_correction/ratio_mean": v["ratio_sum"] / v["units"],
        "rollout_correction/clipped_frac": v["truncated"] / v["units"],
        "rollout_correction/masked_frac": v["masked"] / v["units"],
        "rollout_correction/weight_mean": v["weight_sum"] / v["tokens"],
        "rollout_correction/seq_log_ratio_sd": math.sqrt(var),
    }
