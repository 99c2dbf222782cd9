"""A CPU platform for verl 0.9.1 (``VERL_PLATFORM=cpu``): the FSDP engine on gloo.

verl resolves its device through a platform registry (``verl/plugin/platform``) that ships
CUDA, NPU and ROCm only; without an accelerator it falls back to ``nvidia`` and calls
``torch.cuda``. This platform is registered as ``cpu`` (always: registering is cheap and
does nothing until selected) and, when ``VERL_PLATFORM=cpu`` is set, verl's FSDP engine is
also registered for the device ``cpu`` (verl registers it for ``cuda`` and ``npu`` only,
``workers/engine/fsdp/transformer_impl.py`` ``FSDPEngineWithLMHead``).

Ray still needs a ``GPU`` resource per worker (``RayResourcePool`` bundles and
``ResourcePoolManager._check_resource_available`` count ``GPU`` by name), so a CPU run
starts Ray with logical GPUs: ``ray.init(num_cpus=100, num_gpus=K)``; no CUDA is touched.
On a busy machine add ``_system_config={"worker_niceness": 0}``: Ray's default nice 15
starves its workers beside CPU-bound processes of the same session (issue 17).
For tests and CPU smoke runs only; docs/integrations/verl.md.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

__all__ = ["PLATFORM_NAME", "CpuDevice", "PlatformCPU", "register_cpu_engine"]

PLATFORM_NAME = "cpu"


class CpuDevice:
    """The ``torch.<device>`` namespace verl calls (``get_torch_device()``), for the CPU:
    caches and memory statistics are no-ops or zero, everything else is ``torch.cpu``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    def empty_cache(self) -> None: ...
    def set_device(self, device: Any) -> None: ...
    def synchronize(self, device: Any = None) -> None: ...
    def reset_peak_memory_stats(self, device: Any = None) -> None: ...

    def is_available(self) -> bool:
        return True

    def current_device(self) -> str:
        return "cpu"

    def get_device_name(self, device: Any = None) -> str:
        return "CPU"  # verl's flops table has no CPU entry: MFU is reported against inf

    def device_count(self) -> int:
        return 1

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def memory_allocated(self, device: Any = None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return 0, 0

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl's platform interface on the CPU: gloo, no IPC, no profiler, logical Ray GPUs."""

    _device = CpuDevice()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return self._device  # type: ignore[return-value]

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME

    def current_device(self) -> str:  # type: ignore[override]  # torch.device("cpu") works
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None: ...
    def synchronize(self, device_index: int | None = None) -> None: ...
    def set_allocator_settings(self, settings: str) -> None: ...
    def empty_cache(self) -> None: ...
    def profiler_start(self) -> None: ...
    def profiler_stop(self) -> None: ...

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for its logical GPUs

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None


def _gloo_process_group(timeout_second: Any = None, backend: str | None = None) -> None:
    from verl.utils.distributed import initialize_global_process_group_ray

    initialize_global_process_group_ray(timeout_second, backend or "cpu:gloo")


def _unpinned_offload() -> None:
    """verl's forward-only (reference) FSDP2 engine offloads with
    ``CPUOffloadPolicy(pin_memory=True)`` (``workers/engine/fsdp/transformer_impl.py``
    ``_build_fsdp_module``), and pinning host memory needs an accelerator ("Cannot access
    accelerator device when none is available"). On the CPU the parameters already live in
    host memory: the engine module gets the same policy with ``pin_memory=False``."""
    from verl.workers.engine.fsdp import transformer_impl

    policy = transformer_impl.CPUOffloadPolicy
    if policy is None or getattr(policy, "_mcgpo_cpu", False):
        return

    class HostOffload(policy):  # type: ignore[misc, valid-type]
        _mcgpo_cpu = True

        def __init__(self, pin_memory: bool = True) -> None:
            super().__init__(pin_memory=False)

    transformer_impl.CPUOffloadPolicy = HostOffload


def register_cpu_engine() -> None:
    """Register verl's FSDP language-model engine for the device ``cpu`` (idempotent).

    Also the two shims of verl names, both for the device ``cpu`` only: the actor worker
    starts its process group with ``f"cpu:gloo,{device}:{backend}"`` (``utils/distributed.py``
    ``initialize_global_process_group_ray``), which torch rejects for the device ``cpu``
    ("Duplicate device type cpu"), so ``engine_workers`` gets a wrapper passing
    ``cpu:gloo``; and the reference engine's offload policy does not pin memory
    (:func:`_unpinned_offload`).
    """
    from verl.workers import engine_workers
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    engine_workers.initialize_global_process_group_ray = _gloo_process_group
    _unpinned_offload()

    backends = EngineRegistry._engines.get("language_model", {})
    if all(PLATFORM_NAME in backends.get(b, {}) for b in ("fsdp", "fsdp2")):
        return
    EngineRegistry.register(
        model_type="language_model", backend=["fsdp", "fsdp2"], device=PLATFORM_NAME
    )(FSDPEngineWithLMHead)
