"""The rollout engine of a training run (``rollout.engine = "vllm"``; docs/rollout.md §9).

:func:`check_engine_installed` runs before any model work, :func:`rollout_engine` builds
this rank's engine from its replica of the policy; both turn the engine's errors into
one-line ConfigErrors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcgpo.policy.loading import write_policy
from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.distributed import World

__all__ = ["check_engine_installed", "rollout_engine"]


def check_engine_installed() -> None:
    """A one-line ConfigError when vLLM (the ``vllm`` extra) is not installed."""
    from mcgpo.rollout.vllm_engine import EngineError, check_installed

    try:
        check_installed()
    except EngineError as err:
        raise ConfigError(str(err)) from None


def rollout_engine(cfg: RunConfig, model: Any, tokenizer: Any, folder: Path, world: World) -> Any:
    """The vLLM engine of ``rollout.engine = "vllm"``, built from this rank's replica of the
    policy; every rank serves its own groups from its own engine, on the CPU or on this
    rank's GPU (``cfg.device`` is ``cuda:LOCAL_RANK`` under torchrun; docs/rollout.md). Eager
    on a CPU (compiled graphs cost more start-up than they save there), CUDA graphs on a
    GPU; its memory planned for this rank's rows of one turn (``rollout.groups / W x
    rollout.group_size``) at full context unless ``rollout.vllm_gpu_memory_utilization`` is
    set.

    The engines start from one policy folder, ``<out>/rollout-engine``, written once by rank
    0 while the others wait (the policy is the same on every rank before the first update):
    one copy on disk and in the page cache, not one per rank (7B in fp32 is 30 GB). Where
    the weights are later synced through a folder (the CPU engine in vLLM's processes), a
    rank > 0 writes its own, ``<out>/rollout-engine-rankR``."""
    from mcgpo.rollout.vllm_engine import EngineError, VLLMEngine
    from mcgpo.rollout.vllm_launch import backend, check_vllm
    from mcgpo.training.collectives import barrier

    try:
        check_vllm(model, backend())
    except EngineError as err:
        raise ConfigError(str(err)) from None
    limit = getattr(model.config, "max_position_embeddings", None) or 1 << 30
    budget = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
    start = folder / "rollout-engine"
    if world.main:
        write_policy(model, tokenizer, start)
    barrier(world)  # the folder is whole before any engine reads it
    sync = folder / f"rollout-engine-rank{world.rank}" if world.rank else start
    try:
        return VLLMEngine(
            start,
            sync_folder=sync,
            precision=cfg.train.precision,
            dtype=cfg.rollout.vllm_dtype,
            max_model_len=min(budget, limit),
            seed=cfg.seed,
            device=cfg.device,
            gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization,
            rows=cfg.rollout.groups // world.size * cfg.rollout.group_size,
            sleep=cfg.rollout.vllm_sleep,
        )
    except EngineError as err:
        raise ConfigError(str(err)) from None
