"""The losses (torch): PPO-clip with dual clip, KL estimators, entropy, MCGPO pair loss.

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

The coefficients (eps, dual clip, kl_coef, KL kind, entropy_coef) have no defaults here: they
are required keyword arguments, and their defaults live in the run configuration only
(:class:`mcgpo.training.config.TrainConfig`, verl-agent's recipe). ``dual_clip = 0`` turns the
dual clip off, as ``train.dual_clip = 0`` does. ``KL_KINDS``, the estimators' names, is defined without torch in :mod:`mcgpo.update_choices`
(the configuration checks ``train.kl_kind`` against it) and named here too.

Departures, and why:

* The log-ratio is clamped to [-20, 20] before ``exp`` (as verl does) so one extreme token
  cannot overflow the ratio; the pair score d uses the unclamped log-ratio.
* ``floor(|B|/2)`` is replaced by 1 when |B| < 2 (no pair fits then, the loss is 0).
* Micro-batch losses are meant to be combined with weights |B_b| / |mini-batch| (verl's
  gradient-accumulation scaling). With an even micro-batch size and partners kept together
  (:func:`mcgpo.objectives.plan_micro_batches`) the pair loss then equals the whole-batch
  pair loss exactly.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mcgpo.update_choices import KL_KINDS

__all__ = [
    "KL_KINDS",
    "LOG_RATIO_CLAMP",
    "entropy_from_logits",
    "kl_penalty",
    "masked_mean",
    "pair_loss",
    "policy_loss",
    "response_log_ratio",
    "task_loss",
]

LOG_RATIO_CLAMP = 20.0  # |log-ratio| before exp, in every ratio of this package (as verl)
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
    ``rollout_is_weights`` (:func:`mcgpo.objectives.rollout_correction_weights`).
    Returns (scalar loss, stats).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(log_probs)
    if dual_clip != 0 and not dual_clip > 1.0:
        raise ValueError(f"policy_loss: 'dual_clip' must be > 1 or 0 (off), got {dual_clip!r}")
    high = clip if clip_high is None else clip_high
    log_ratio = (log_probs - old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
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
        q = (-diff).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
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
    ``rollout_weights`` ``[B, L]`` from :func:`mcgpo.objectives.rollout_correction_weights`
    (None: no correction) weight the policy-gradient term's tokens.
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
