"""How much of the update's gradient the MCGPO pair term is (``train.pair_grad_probe``).

The pair loss is a small number beside the task loss (issue 35: 0.002-0.005 against ~0.15),
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
micro-batches. One process only: under DDP or FSDP2 ``autograd.grad`` would bypass the
gradient reduction (refused by :func:`mcgpo.training.distributed.check_world`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["GradProbe"]


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
