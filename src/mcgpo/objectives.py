"""Per-token objectives (torch): PPO-clip with dual clip, KL estimators, entropy, MCGPO pair loss.

Notation for shapes: ``B`` rows of one actor micro-batch (one row = one agent turn),
``L`` padded response length, ``V`` vocabulary size, ``P`` preference pairs. Every
``response_mask`` is ``[B, L]`` (bool or 0/1) and marks the response tokens that are trained;
values at masked positions never change a result.

Task loss (GraphGPO's, i.e. verl's PPO actor loss; docs/algorithms/mcgpo.md, Eq. L_task):

    r_t    = exp(log pi_theta - log pi_old)                          per token
    l_t    = max(-A r_t, -A clip(r_t, 1 - eps_low, 1 + eps_high))    PPO clipped surrogate
    l_t    = min(l_t, -A * dual_clip)            if A < 0            dual clip (Ye et al. 2020)
    L_task = token-mean(l) + kl_coef * token-mean(KL) - entropy_coef * token-mean(H)

Pair loss (MCGPO, seed step 5):

    d(row) = mean over the row's response tokens of (log pi_theta - log pi_old)
    L_pair = sum_{(+,-) in P(B)} c * softplus(-(d(+) - d(-))) / floor(|B| / 2)
    L      = L_task + lambda_pair * L_pair       (summed in mcgpo.training.update)

P(B) holds the pairs whose two rows are both in micro-batch B.

Rollout correction (:func:`rollout_correction_weights`, docs/training.md "Rollout
correction"): the tokens were sampled by the behaviour policy mu (the sampler, vLLM), whose
log-probs differ from the trainer's pi_old by kernels and precision. With
rho = pi_old / mu per token (``level`` token) or the product over a row's response
(``level`` sequence), a detached weight w multiplies l_t of the policy-gradient term:

    tis:  w = min(rho, cap)                             truncated IS (Yao et al. 2025)
    mis:  w = rho if 1/cap <= rho <= cap else 0         masked IS (verl's IcePop bounds)

The KL, entropy and pair terms are not weighted (verl's ``rollout_is_weights`` multiply
``pg_losses`` only); w = 1 exactly at zero mismatch, so the loss is then the uncorrected one.

The coefficients (eps, dual clip, kl_coef, KL kind, entropy_coef) have no defaults here: they
are required keyword arguments, and their defaults live in the run configuration only
(:class:`mcgpo.training.config.TrainConfig`, verl-agent's recipe). ``dual_clip = 0`` turns the
dual clip off, as ``train.dual_clip = 0`` does. ``KL_KINDS`` is defined here, next to the
estimators it names; the configuration checks ``train.kl_kind`` against it.

Departures, and why:

* The log-ratio is clamped to [-20, 20] before ``exp`` (as verl does) so one extreme token
  cannot overflow the ratio; the pair score d uses the unclamped log-ratio.
* ``floor(|B|/2)`` is replaced by 1 when |B| < 2 (no pair fits then, the loss is 0).
* Micro-batch losses are meant to be combined with weights |B_b| / |mini-batch| (verl's
  gradient-accumulation scaling). With an even micro-batch size and partners kept together
  (:func:`plan_micro_batches`) the pair loss then equals the whole-batch pair loss exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "CORRECTION_SUMS",
    "KL_KINDS",
    "ROLLOUT_CORRECTIONS",
    "ROLLOUT_CORRECTION_LEVELS",
    "MicroBatchPlan",
    "correction_stats_from_sums",
    "entropy_from_logits",
    "kl_penalty",
    "masked_mean",
    "pair_loss",
    "plan_micro_batches",
    "policy_loss",
    "response_log_ratio",
    "rollout_correction_sums",
    "rollout_correction_weights",
    "task_loss",
]

KL_KINDS = ("low_var_kl", "k3", "kl", "k1", "mse", "k2", "abs")
ROLLOUT_CORRECTIONS = ("none", "tis", "mis")  # train.rollout_correction (with "auto")
ROLLOUT_CORRECTION_LEVELS = ("token", "sequence")  # train.rollout_correction_level
_LOG_RATIO_CLAMP = 20.0
_K3_CLAMP = 10.0


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is set; 0 where nothing is set.

    ``x`` and ``mask`` have the same shape; ``dim=None`` reduces everything to a scalar,
    an int reduces that dimension. Masked positions are replaced by 0 before summing, so even
    inf / NaN there cannot leak into the result.
    """
    m = mask.bool()
    total = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        return total.sum() / m.sum().clamp(min=1)
    return total.sum(dim) / m.sum(dim).clamp(min=1)


def policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip: float,
    dual_clip: float,
    clip_high: float | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with dual clip, token-mean over the micro-batch.

    ``log_probs`` / ``old_log_probs``: ``[B, L]``; ``advantages``: ``[B, L]`` or ``[B]``
    (one value per row, broadcast to its tokens). ``clip`` is eps_low, ``clip_high`` eps_high
    (None: the same as ``clip``); ``dual_clip`` (> 1, or 0 for off) caps the loss of a token
    with negative advantage at ``-A * dual_clip``. ``weights`` ``[B, L]`` (detached; None:
    none) multiply each token's clipped loss before the token mean, as verl applies
    ``rollout_is_weights`` (:func:`rollout_correction_weights`). Returns (scalar loss, stats).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(log_probs)
    if dual_clip != 0 and not dual_clip > 1.0:
        raise ValueError(f"policy_loss: 'dual_clip' must be > 1 or 0 (off), got {dual_clip!r}")
    high = clip if clip_high is None else clip_high
    log_ratio = (log_probs - old_log_probs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip, 1.0 + high)
    loss = torch.maximum(unclipped, clipped)
    lower_hit = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip != 0:
        cap = -advantages * dual_clip
        lower_hit = (advantages < 0) & (loss > cap)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
    if weights is not None:
        loss = loss * weights.detach()
    with torch.no_grad():
        stats = {
            "pg_clipfrac": float(masked_mean((clipped > unclipped).float(), response_mask)),
            "pg_clipfrac_lower": float(masked_mean(lower_hit.float(), response_mask)),
            "ppo_kl": float(masked_mean(-log_ratio, response_mask)),
        }
    return masked_mean(loss, response_mask), stats


def kl_penalty(
    log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str = "low_var_kl"
) -> torch.Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate, ``[B, L]`` -> ``[B, L]`` (Schulman 2020).

    ``"kl"``/``"k1"``: log pi - log pi_ref.  ``"mse"``/``"k2"``: (log pi - log pi_ref)^2 / 2.
    ``"low_var_kl"``/``"k3"``: exp(q) - q - 1 with q = log pi_ref - log pi (q clamped to
    [-20, 20]), the estimate clamped to [-10, 10] as verl does.  ``"abs"``: |log pi - log pi_ref|.
    """
    diff = log_probs - ref_log_probs
    if kind in ("kl", "k1"):
        return diff
    if kind in ("mse", "k2"):
        return 0.5 * diff.square()
    if kind == "abs":
        return diff.abs()
    if kind in ("low_var_kl", "k3"):
        q = (-diff).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        return (torch.exp(q) - q - 1.0).clamp(-_K3_CLAMP, _K3_CLAMP)
    raise ValueError(f"kl_penalty: unknown kind {kind!r}; choose one of {', '.join(KL_KINDS)}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last dimension: ``[B, L, V]`` -> ``[B, L]``."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def task_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    ref_log_probs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    clip: float,
    dual_clip: float,
    kl_coef: float,
    kl_kind: str,
    entropy_coef: float,
    clip_high: float | None = None,
    rollout_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """L_task = policy_loss + kl_coef * token-mean KL - entropy_coef * token-mean entropy.

    ``ref_log_probs`` ``[B, L]`` (None: no KL term), ``entropy`` ``[B, L]`` from
    :func:`entropy_from_logits` (None: no entropy bonus). ``clip``, ``dual_clip`` and
    ``clip_high`` as in :func:`policy_loss`; ``kl_kind`` one of ``KL_KINDS``. The recipe's
    values are the defaults of :class:`mcgpo.training.config.TrainConfig`.
    ``rollout_weights`` ``[B, L]`` from :func:`rollout_correction_weights` (None: no
    correction) weight the policy-gradient term's tokens.
    """
    loss, stats = policy_loss(
        log_probs,
        old_log_probs,
        advantages,
        response_mask,
        clip=clip,
        clip_high=clip_high,
        dual_clip=dual_clip,
        weights=rollout_weights,
    )
    stats["pg_loss"] = float(loss.detach())
    if ref_log_probs is not None and kl_coef != 0:
        kl = masked_mean(kl_penalty(log_probs, ref_log_probs, kl_kind), response_mask)
        loss = loss + kl_coef * kl
        stats["kl"] = float(kl.detach())
    if entropy is not None and entropy_coef != 0:
        ent = masked_mean(entropy, response_mask)
        loss = loss - entropy_coef * ent
        stats["entropy"] = float(ent.detach())
    return loss, stats


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
    ratio = torch.exp(unit_log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
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


def response_log_ratio(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """d per row: mean over its response tokens of log pi_theta - log pi_old; ``[B, L]`` -> ``[B]``.

    Pass the same ``log_probs`` tensor the task loss uses (no extra forward pass). A row
    without response tokens gets d = 0.
    """
    return masked_mean(log_probs - old_log_probs, response_mask, dim=-1)


def pair_loss(
    d: torch.Tensor,
    plus: np.ndarray,
    minus: np.ndarray,
    weight: np.ndarray,
    batch_rows: np.ndarray,
) -> tuple[torch.Tensor, dict[str, float]]:
    """L_pair over the pairs whose two rows are in this micro-batch.

    ``d``: ``[B]`` scores of the micro-batch rows. ``batch_rows``: ``[B]`` ids of those rows
    in any global numbering (e.g. rows of the step table), unique. ``plus``, ``minus``,
    ``weight``: ``[P]`` global pairs in that numbering (e.g. ``prefs.plus``, ``prefs.minus``,
    ``prefs.weight``). Pairs with a row outside the micro-batch are left out here, and
    counted in ``stats["pairs_split"]`` when exactly one of their rows is inside.
    Returns (scalar loss normalised by floor(B / 2), stats).
    """
    batch_rows = np.asarray(batch_rows, dtype=np.int64).reshape(-1)
    plus = np.asarray(plus, dtype=np.int64).reshape(-1)
    minus = np.asarray(minus, dtype=np.int64).reshape(-1)
    weight = np.asarray(weight, dtype=np.float64).reshape(-1)
    if d.shape != (len(batch_rows),):
        raise ValueError(f"pair_loss: d has shape {tuple(d.shape)}, want ({len(batch_rows)},)")
    if not len(plus) == len(minus) == len(weight):
        raise ValueError(
            f"pair_loss: plus, minus and weight differ in length "
            f"({len(plus)}, {len(minus)}, {len(weight)})"
        )
    if len(np.unique(batch_rows)) != len(batch_rows):
        raise ValueError("pair_loss: batch_rows holds a row id twice")
    sorter = np.argsort(batch_rows, kind="stable")
    pos_plus, in_plus = _positions(batch_rows, sorter, plus)
    pos_minus, in_minus = _positions(batch_rows, sorter, minus)
    both = in_plus & in_minus
    idx_p = torch.as_tensor(pos_plus[both], device=d.device)
    idx_m = torch.as_tensor(pos_minus[both], device=d.device)
    c = torch.as_tensor(weight[both], dtype=d.dtype, device=d.device)
    margin = d[idx_p] - d[idx_m]
    loss = (c * F.softplus(-margin)).sum() / max(len(batch_rows) // 2, 1)
    with torch.no_grad():
        stats = {
            "pairs": float(both.sum()),
            "pairs_split": float((in_plus ^ in_minus).sum()),
            "pair_margin": float(margin.mean()) if len(margin) else 0.0,
            "pair_accuracy": float((margin > 0).float().mean()) if len(margin) else 0.0,
        }
    return loss, stats


@dataclass(frozen=True)
class MicroBatchPlan:
    """Rows of a mini-batch laid into micro-batches, partners together."""

    batches: list[np.ndarray]  # each [<= micro_batch_size] int64 row ids of one micro-batch
    split_pairs: int  # pairs whose rows ended in different micro-batches


def plan_micro_batches(
    n_rows: int, micro_batch_size: int, plus: np.ndarray, minus: np.ndarray
) -> MicroBatchPlan:
    """Cut rows ``0..n_rows-1`` into micro-batches of ``micro_batch_size`` keeping partners.

    ``plus`` / ``minus``: ``[P]`` row ids (in ``0..n_rows-1``) of the pairs; a row may belong
    to one pair at most (:func:`mcgpo.build_preferences` guarantees it). Deterministic
    layout: pairs in order of their smaller row id, each partner next to the other, then the
    unpaired rows in increasing order. When a batch has one free place and the next unit is
    a pair, the first remaining unpaired row fills it; if none is left, the pair starts a new
    batch and that batch stays one short. Pairs are split only when
    ``micro_batch_size == 1``. ``split_pairs`` counts the split pairs.
    """
    plus = np.asarray(plus, dtype=np.int64).reshape(-1)
    minus = np.asarray(minus, dtype=np.int64).reshape(-1)
    if micro_batch_size < 1:
        raise ValueError(
            f"plan_micro_batches: micro_batch_size must be >= 1, got {micro_batch_size}"
        )
    if len(plus) != len(minus):
        raise ValueError("plan_micro_batches: plus and minus differ in length")
    rows = np.concatenate([plus, minus])
    if len(rows) and (rows.min() < 0 or rows.max() >= n_rows):
        raise ValueError(f"plan_micro_batches: a pair row lies outside 0..{n_rows - 1}")
    if np.any(plus == minus):
        raise ValueError("plan_micro_batches: a pair joins a row with itself")
    if len(np.unique(rows)) != len(rows):
        raise ValueError("plan_micro_batches: a row belongs to two pairs")
    first = np.minimum(plus, minus)
    order = np.argsort(first, kind="stable")
    pairs = [(int(first[i]), int(np.maximum(plus, minus)[i])) for i in order]
    paired = np.zeros(n_rows, dtype=bool)
    paired[rows] = True
    singles = np.flatnonzero(~paired).tolist()
    batches: list[list[int]] = [[]]
    s = 0
    for a, b in pairs:
        if micro_batch_size - len(batches[-1]) == 1:  # one place left: a pair cannot fit
            if s < len(singles):
                batches[-1].append(singles[s])
                s += 1
            batches.append([])  # full now, or one short when no unpaired row is left
        batches[-1].append(a)
        if len(batches[-1]) == micro_batch_size:
            batches.append([])
        batches[-1].append(b)
        if len(batches[-1]) == micro_batch_size:
            batches.append([])
    for row in singles[s:]:
        batches[-1].append(row)
        if len(batches[-1]) == micro_batch_size:
            batches.append([])
    out = [np.asarray(batch, dtype=np.int64) for batch in batches if batch]
    where = np.empty(n_rows, dtype=np.int64)
    for i, batch in enumerate(out):
        where[batch] = i
    split = int(np.sum(where[plus] != where[minus])) if len(plus) else 0
    return MicroBatchPlan(batches=out, split_pairs=split)


def _positions(
    batch_rows: np.ndarray, sorter: np.ndarray, ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Position of each id in ``batch_rows`` and whether it is there at all."""
    if len(batch_rows) == 0:
        return np.zeros(len(ids), dtype=np.int64), np.zeros(len(ids), dtype=bool)
    at = np.searchsorted(batch_rows, ids, sorter=sorter)
    at = np.minimum(at, len(batch_rows) - 1)
    pos = sorter[at]
    return pos, batch_rows[pos] == ids
