"""TokenBatch: the token side of a rollout, one row per agent turn (row i = StepTable row i).

Layout: each row is ``prompt ids + response ids``, **right-padded** with the pad id, so
column t is position t of the sequence for every row (position ids = 0, 1, 2, ... on the
real tokens, and :func:`mcgpo.policy.position_ids` gives the same numbers from the mask).
Right padding also lets :meth:`TokenBatch.select` drop the all-padding columns on the right
when a micro-batch holds only short rows.

Masks:
    attention_mask  1 on every real token (prompt and response), 0 on padding
    response_mask   True exactly on the sampled response tokens (EOS included when it was
                    sampled); prompt tokens, which hold the observations and the history,
                    and padding never carry a loss
    old_log_probs   log pi_old(token | prefix) at temperature 1 at response positions, 0
                    elsewhere; as collected, the sampler's log-probs (see
                    :func:`mcgpo.rollout.sampler.sample`: at a rollout temperature other
                    than 1 those are the sampling distribution's, and the update replaces
                    them by a training forward)
    behaviour_log_probs
                    the sampler's own log-probs of the same tokens (the behaviour policy
                    mu; same layout): equal to ``old_log_probs`` as collected, and kept when
                    the update replaces ``old_log_probs`` by a training forward
                    (:mod:`mcgpo.training.old_logprobs`), for the rollout correction
                    (:func:`mcgpo.objectives.rollout_correction_weights`)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["TokenBatch", "TokenBatchError"]


class TokenBatchError(ValueError):
    """A token batch was built from inconsistent input; the message says what and where."""


@dataclass(frozen=True, eq=False)
class TokenBatch:
    """Prompt + response token rows with their masks and sampling log-probs."""

    input_ids: torch.Tensor  # [R, L] int64   prompt then response, right-padded
    attention_mask: torch.Tensor  # [R, L] int64   1 on real tokens
    response_mask: torch.Tensor  # [R, L] bool    True exactly on sampled response tokens
    old_log_probs: torch.Tensor  # [R, L] float32 log pi_old (T=1) on responses, 0 elsewhere
    # [R, L] float32 the sampler's log mu (T=1) on responses; None = ``old_log_probs`` itself
    behaviour_log_probs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.behaviour_log_probs is None:  # as sampled: pi_old is the sampler's
            object.__setattr__(self, "behaviour_log_probs", self.old_log_probs)
        shape = tuple(self.input_ids.shape)
        if self.input_ids.ndim != 2:
            raise TokenBatchError(f"input_ids must be 2-D [R, L], got shape {shape}")
        expected = {
            "input_ids": torch.int64,
            "attention_mask": torch.int64,
            "response_mask": torch.bool,
            "old_log_probs": torch.float32,
            "behaviour_log_probs": torch.float32,
        }
        for name, dtype in expected.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape:
                raise TokenBatchError(f"{name} has shape {tuple(t.shape)}, expected {shape}")
            if t.dtype != dtype:
                raise TokenBatchError(f"{name} has dtype {t.dtype}, expected {dtype}")
        if bool((self.response_mask & (self.attention_mask == 0)).any()):
            row = int((self.response_mask & (self.attention_mask == 0)).any(1).nonzero()[0])
            raise TokenBatchError(f"row {row}: response_mask is True on a padding position")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_sequences(
        cls,
        prompts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        log_probs: Sequence[Sequence[float]],
        *,
        pad_token_id: int,
    ) -> TokenBatch:
        """Collate rows ``prompt + response`` (right padding); ``log_probs`` match responses."""
        if not len(prompts) == len(responses) == len(log_probs):
            raise TokenBatchError(
                f"prompts, responses and log_probs differ in length: "
                f"{len(prompts)}, {len(responses)}, {len(log_probs)}"
            )
        for i, (p, r, lp) in enumerate(zip(prompts, responses, log_probs)):
            if len(r) != len(lp):
                raise TokenBatchError(f"row {i}: {len(r)} response tokens but {len(lp)} log-probs")
            if len(p) == 0:
                raise TokenBatchError(f"row {i}: empty prompt")
        n = len(prompts)
        width = max((len(p) + len(r) for p, r in zip(prompts, responses)), default=0)
        ids = torch.full((n, width), pad_token_id, dtype=torch.int64)
        attn = torch.zeros((n, width), dtype=torch.int64)
        resp = torch.zeros((n, width), dtype=torch.bool)
        old = torch.zeros((n, width), dtype=torch.float32)
        for i, (p, r, lp) in enumerate(zip(prompts, responses, log_probs)):
            a, b = len(p), len(p) + len(r)
            ids[i, :a] = torch.as_tensor(list(p), dtype=torch.int64)
            ids[i, a:b] = torch.as_tensor(list(r), dtype=torch.int64)
            attn[i, :b] = 1
            resp[i, a:b] = True
            old[i, a:b] = torch.as_tensor(list(lp), dtype=torch.float32)
        return cls(ids, attn, resp, old)

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    def sequence_lengths(self) -> torch.Tensor:
        """[R] number of real tokens (prompt + response) per row."""
        return self.attention_mask.sum(1)

    def response_lengths(self) -> torch.Tensor:
        """[R] number of sampled response tokens per row."""
        return self.response_mask.sum(1)

    def select(self, index: Any) -> TokenBatch:
        """Rows picked by a boolean mask or integer indices (numpy, torch or list), in order.

        Columns that are padding in every selected row are dropped (right padding), so a
        micro-batch of short rows costs only its own length.
        """
        idx = torch.as_tensor(np.asarray(index) if not torch.is_tensor(index) else index)
        if idx.dtype == torch.bool:
            if idx.shape != (len(self),):
                raise TokenBatchError(
                    f"boolean index has shape {tuple(idx.shape)}, expected ({len(self)},)"
                )
            idx = idx.nonzero().flatten()
        idx = idx.to(torch.int64).to(self.input_ids.device)
        attn = self.attention_mask[idx]
        width = int(attn.sum(1).max()) if len(idx) else 0
        return TokenBatch(
            self.input_ids[idx, :width],
            attn[:, :width],
            self.response_mask[idx, :width],
            self.old_log_probs[idx, :width],
            None if self._behaviour_is_old() else self.behaviour_log_probs[idx, :width],
        )

    @classmethod
    def concatenate(cls, batches: Sequence[TokenBatch]) -> TokenBatch:
        """The rows of ``batches`` in order, right-padded to the widest (pad id 0: padding
        ids never matter, the attention mask says what is real)."""
        width = max((b.input_ids.shape[1] for b in batches), default=0)

        def padded(t: torch.Tensor) -> torch.Tensor:
            out = t.new_zeros((t.shape[0], width))
            out[:, : t.shape[1]] = t
            return out

        if not batches:
            empty = torch.zeros((0, 0), dtype=torch.int64)
            return cls(empty, empty, empty.bool(), empty.float())
        names = ["input_ids", "attention_mask", "response_mask", "old_log_probs"]
        if not all(b._behaviour_is_old() for b in batches):
            names.append("behaviour_log_probs")
        return cls(*(torch.cat([padded(getattr(b, name)) for b in batches]) for name in names))

    def to(self, device: torch.device | str) -> TokenBatch:
        """The same batch on another device."""
        return TokenBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.response_mask.to(device),
            self.old_log_probs.to(device),
            None if self._behaviour_is_old() else self.behaviour_log_probs.to(device),
        )

    def _behaviour_is_old(self) -> bool:
        """Whether the behaviour log-probs are pi_old's tensor itself (nothing to carry)."""
        return self.behaviour_log_probs is self.old_log_probs

    def per_token(self, values: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Broadcast one value per row (e.g. an advantage) onto that row's response tokens.

        Returns a float32 ``[R, L]`` tensor: ``values[i]`` on row i's response positions and
        0 everywhere else.
        """
        v = torch.as_tensor(np.asarray(values) if not torch.is_tensor(values) else values)
        if v.shape != (len(self),):
            raise TokenBatchError(
                f"per_token expects {len(self)} values, got shape {tuple(v.shape)}"
            )
        v = v.to(device=self.device, dtype=torch.float32)
        return v[:, None] * self.response_mask.to(torch.float32)
