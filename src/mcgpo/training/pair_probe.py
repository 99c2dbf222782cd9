"""What the MCGPO pair term does to the update (``train.pair_probe``): its pull on the
weights, and whether the update moved the pairs' ranking.

**Its pull** (:class:`GradProbe`). The pair loss is a small number beside the task loss (issue 35: 0.002-0.005 against ~0.15),
but a loss's size says little about its pull on the weights: what moves the policy is its
gradient. The probe measures, on the first optimiser step of each update (theta = theta_old,
the same step that :func:`mcgpo.training.old_logprobs.at_old_stats` reads), the two terms'
gradients separately, summed over that step's micro-batches exactly as the step sums them:

    g_task = sum_B grad( T_B/T_M * L_task(B) )
    g_pair = sum_B grad( lambda_pair * |B|/|M| * L_pair(B) )

and reports their norms, the ratio ``||g_pair|| / ||g_task||`` and their cosine, all before
gradient clipping. Both are taken with :func:`torch.autograd.grad` on the graph the step
builds anyway (``retain_graph``), so the parameters' ``.grad`` and hence the update are
untouched (tested bit for bit); the cost is two extra backward passes over the first step's
micro-batches.

**Whether it moved the ranking** (:class:`PairFit`). ``pairs/margin`` and
``pairs/accuracy`` are read inside the update, each pair at the step that trains on it,
*before* that step: with one PPO epoch a pair's own gradient never shows there, and the
two stay near 0 and 0.5 whatever the pair term does (issue 35 asked why they do not move).
The probe reads the pairs' rows once before the update and once after it (no-grad forwards
over those rows only) and reports, for the update's pairs, the change of the
length-normalised log-probability of each row, d = (1/|y|) sum_t [log pi_new - log pi_before],
as ``pairs/margin_after`` (mean d+ - d-), ``pairs/accuracy_after`` (share with d+ > d-) and
``pairs/weighted_margin_after`` (sum c (d+ - d-) / sum c): the pair term's direct effect
plus whatever the task term did to the same rows. The pairs are measured also when
``algo.lambda_pair`` is 0 (MCGPO that trains like GraphGPO), which is the dose-response's
zero.

One process only: under DDP or FSDP2 ``autograd.grad`` would bypass the gradient reduction,
and a forward over one rank's pairs would not match the other ranks' passes (refused by
:func:`mcgpo.training.distributed.check_world`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mcgpo.objectives import response_log_ratio
from mcgpo.policy.logprobs import token_log_probs
from mcgpo.policy.precision import compute
from mcgpo.rollout.tokens import TokenBatch
from mcgpo.training.layout import PairBatch

__all__ = ["GradProbe", "PairFit"]


class GradProbe:
    """Accumulates the task and pair terms' gradients over one optimiser step."""

    def __init__(self, params: Sequence[torch.nn.Parameter]) -> None:
        self.params = list(params)
        self.task: list[torch.Tensor] | None = None
        self.pair: list[torch.Tensor] | None = None

    def add(self, task_term: torch.Tensor, pair_term: torch.Tensor | None) -> None:
        """Add one micro-batch's two (already scaled) loss terms; call before its backward."""
        self.task = self._accumulate(self.task, task_term)
        if pair_term is not None:
            self.pair = self._accumulate(self.pair, pair_term)

    def _accumulate(
        self, total: list[torch.Tensor] | None, term: torch.Tensor
    ) -> list[torch.Tensor]:
        if term.requires_grad:
            grads = torch.autograd.grad(term, self.params, retain_graph=True, allow_unused=True)
        else:  # e.g. a pair term over a micro-batch whose pairs all lie elsewhere: zero
            grads = (None,) * len(self.params)
        flat = [
            (g if g is not None else torch.zeros_like(p)).detach().float()
            for g, p in zip(grads, self.params, strict=True)
        ]
        if total is None:
            return flat
        return [t + g for t, g in zip(total, flat, strict=True)]

    def stats(self) -> dict[str, float]:
        """``loss/task_grad_norm``, ``pairs/grad_norm``, ``pairs/grad_ratio`` (pair over
        task) and ``pairs/grad_cos``; {} if nothing was added. Without a pair term the pair
        norm and ratio are 0 and the cosine is left out (undefined)."""
        if self.task is None:
            return {}
        task = torch.cat([g.reshape(-1) for g in self.task])
        task_norm = float(task.norm())
        if self.pair is None:
            return {
                "loss/task_grad_norm": task_norm,
                "pairs/grad_norm": 0.0,
                "pairs/grad_ratio": 0.0,
            }
        pair = torch.cat([g.reshape(-1) for g in self.pair])
        pair_norm = float(pair.norm())
        out = {
            "loss/task_grad_norm": task_norm,
            "pairs/grad_norm": pair_norm,
            "pairs/grad_ratio": pair_norm / task_norm if task_norm > 0 else float("inf"),
        }
        if task_norm > 0 and pair_norm > 0:
            out["pairs/grad_cos"] = float(task @ pair) / (task_norm * pair_norm)
        return out


class PairFit:
    """The pairs' rows read before the update; :meth:`stats` reads them again after it."""

    def __init__(self, parts: list[TokenBatch], pairs: PairBatch, precision: str) -> None:
        self.parts, self.pairs, self.precision = parts, pairs, precision
        self.before: list[torch.Tensor] = []

    @classmethod
    def before_update(
        cls,
        model: torch.nn.Module,
        batch: TokenBatch,
        pairs: PairBatch,
        precision: str,
        chunk: int,
    ) -> PairFit | None:
        """Read the log-probs of the rows of ``pairs`` (indices into ``batch``) now, ``chunk``
        rows per forward pass; None without pairs."""
        if len(pairs.plus) == 0:
            return None
        rows = np.unique(np.concatenate([pairs.plus, pairs.minus]))
        local = PairBatch(  # the pairs as positions in ``rows``
            np.searchsorted(rows, pairs.plus),
            np.searchsorted(rows, pairs.minus),
            np.asarray(pairs.weight, dtype=np.float64),
        )
        device = next(model.parameters()).device
        parts = [batch.select(rows[i : i + chunk]).to(device) for i in range(0, len(rows), chunk)]
        fit = cls(parts, local, precision)
        fit.before = fit._read(model)
        return fit

    def _read(self, model: torch.nn.Module) -> list[torch.Tensor]:
        with torch.no_grad(), compute(self.precision, self.parts[0].device):
            return [
                token_log_probs(
                    model, part.input_ids, part.attention_mask, positions=part.response_mask
                ).float()
                for part in self.parts
            ]

    def stats(self, model: torch.nn.Module) -> dict[str, float]:
        """``pairs/margin_after``, ``pairs/accuracy_after``, ``pairs/weighted_margin_after``."""
        after = self._read(model)
        d = torch.cat(
            [
                response_log_ratio(a, b, part.response_mask)
                for a, b, part in zip(after, self.before, self.parts, strict=True)
            ]
        ).double()
        margin = (d[self.pairs.plus] - d[self.pairs.minus]).cpu().numpy()
        weight = self.pairs.weight
        total = weight.sum()
        return {
            "pairs/margin_after": float(margin.mean()),
            "pairs/accuracy_after": float((margin > 0).mean()),
            "pairs/weighted_margin_after": float((weight * margin).sum() / total) if total else 0.0,
        }
