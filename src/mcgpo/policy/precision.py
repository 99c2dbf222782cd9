"""Numeric precision of the policy: which dtype the weights hold and which the maths runs in.

Three settings (``train.precision``):

``"fp32"``        weights, compute and optimiser state in float32 (the CPU reference).
``"bf16-mixed"``  float32 master weights and float32 AdamW moments; forward and backward
                  run under ``torch.autocast(dtype=bfloat16)``, so matmuls and attention are
                  bf16 and their gradients land on the fp32 weights. This is the convention
                  of FSDP's ``MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)`` that
                  verl's actor uses, without FSDP. Memory: 4 bytes/param weights + 4 grads +
                  8 Adam, as fp32, but activations in bf16.
``"bf16"``        the weights themselves are bfloat16 ("pure" bf16); gradients and AdamW
                  moments are then bf16 too. Half the weight memory, but AdamW's update
                  ``lr * m / sqrt(v)`` is added to a bf16 weight with an 8-bit significand:
                  an update below half a bf16 step (2^-9 to 2^-8 of the weight) is rounded
                  away (at lr 1e-6 most are). Use it to fit a model, not for a faithful run.

Log-softmax, losses and log-probs are float32 in every setting (the logits are upcast in
:mod:`mcgpo.policy.logprobs`, as verl does). :func:`compute` is the context that the
training rollouts' sampler and the update's forwards run in, so that both compute in the
same dtype.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from mcgpo.update_choices import PRECISIONS

__all__ = [
    "PRECISIONS",
    "PrecisionError",
    "cast_weights",
    "check_precision",
    "compute",
    "compute_dtype",
    "weight_dtype",
]


class PrecisionError(ValueError):
    """A precision cannot run on a device; the message is one line naming both."""


def weight_dtype(precision: str) -> torch.dtype:
    """The dtype the weights are stored in (and AdamW's moments, which follow them)."""
    _known(precision)
    return torch.bfloat16 if precision == "bf16" else torch.float32


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype the matmuls run in."""
    _known(precision)
    return torch.float32 if precision == "fp32" else torch.bfloat16


def cast_weights(model: Any, precision: str) -> Any:
    """Store the floating-point parameters of ``model`` in :func:`weight_dtype`; return it.

    Parameters only: buffers keep their dtype (``model.to(bfloat16)`` would also round the
    rotary embedding's float32 frequency table, which the model never trains).
    """
    dtype = weight_dtype(precision)
    for param in model.parameters():
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
    return model


def compute(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager[Any]:
    """The context a forward of the policy runs in: autocast to bf16 for ``bf16-mixed``,
    nothing otherwise (fp32 is fp32; pure bf16 weights compute in bf16 by themselves)."""
    _known(precision)
    if precision != "bf16-mixed":
        return contextlib.nullcontext()
    kind = torch.device(device).type
    return torch.autocast(device_type=kind, dtype=torch.bfloat16)


def check_precision(precision: str, device: torch.device | str) -> None:
    """Raise :class:`PrecisionError` when ``device`` cannot compute in ``precision``.

    bf16 needs a CUDA device with bf16 support (compute capability 8.0, Ampere, or later;
    ``torch.cuda.is_bf16_supported``) or the CPU (autocast and bf16 kernels are there,
    slower than fp32 on most CPUs: use it to test, not for speed).
    """
    _known(precision)
    if precision == "fp32":
        return
    dev = torch.device(device)
    if dev.type == "cpu":
        return
    if dev.type != "cuda":
        raise PrecisionError(f"train.precision {precision}: device {dev} is not cpu or cuda")
    if not torch.cuda.is_available():
        raise PrecisionError(f"train.precision {precision}: CUDA is not available")
    if not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name(dev)
        raise PrecisionError(
            f"train.precision {precision}: {name} has no bfloat16 support (needs compute "
            "capability 8.0 or later); use --train.precision fp32"
        )


def _known(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
