"""The process's runtime for a run: the device and precision checked, threads, determinism,
TF32 and the global seeds (:func:`mcgpo.training.setup.prepare` calls these first)."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from mcgpo.training.config import ConfigError, RunConfig

__all__ = ["apply_runtime", "check_device", "process_threads"]


def check_device(cfg: RunConfig) -> None:
    """``cfg.device`` exists here and can run ``train.precision``; else a one-line ConfigError."""
    from mcgpo.policy.precision import PrecisionError, check_precision

    if cfg.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {cfg.device}: CUDA is not available on this machine")
        index = torch.device(cfg.device).index
        if index is not None and index >= torch.cuda.device_count():
            raise ConfigError(
                f"--device {cfg.device}: this machine has {torch.cuda.device_count()} CUDA "
                "device(s)"
            )
    try:
        check_precision(cfg.train.precision, cfg.device)
    except PrecisionError as err:
        raise ConfigError(str(err)) from None


def apply_runtime(cfg: RunConfig) -> None:
    """Threads, determinism, TF32 on CUDA (``train.tf32``) and the global seeds."""
    if cfg.device.startswith("cuda"):
        _set_tf32(cfg.train.tf32)
    if cfg.threads:
        torch.set_num_threads(process_threads(cfg.threads))
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    torch.manual_seed(cfg.seed)


def process_threads(threads: int, local_world: int | None = None, cores: int | None = None) -> int:
    """Torch threads of this process: ``threads``, capped so that the processes launched on
    this machine (``LOCAL_WORLD_SIZE``, set by torchrun and ``--nproc``) use at most its
    cores together (never below 1). Two processes with a preset's 2 threads each on a
    2-core machine made the sampler's many small operations about 10 times slower
    (OpenMP threads spinning against each other)."""
    if local_world is None:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    cores = cores or os.cpu_count() or 1
    if local_world <= 1:
        return threads
    return max(1, min(threads, cores // local_world))


def _set_tf32(enabled: bool) -> None:
    """TF32 for float32 matmuls and convolutions on CUDA, through the API that
    ``torch.get_float32_matmul_precision()`` reads ("high" or "highest"). The newer
    per-backend ``fp32_precision`` attributes are not used: once they are set, that getter
    raises ("mix of legacy and new APIs", torch >= 2.9), and inductor and vLLM call it."""
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled
