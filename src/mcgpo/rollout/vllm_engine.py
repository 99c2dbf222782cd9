"""vLLM as the rollout engine (``rollout.engine = "vllm"``): colocated, weights synced in place.

:class:`VLLMEngine` samples the same responses as :func:`mcgpo.rollout.sample` would, in
the same :class:`~mcgpo.rollout.sampler.Samples` structure (response token ids, and the
log-prob of each sampled token under the distribution that drew it), so that
:func:`mcgpo.rollout.collect` uses either. It is built once per run from a policy folder
(``save_pretrained`` layout) and follows the policy's updates without a restart
(:meth:`VLLMEngine.update_weights`). Where it runs, in what dtype and with how much
memory is decided by :mod:`mcgpo.rollout.vllm_launch`: on the CPU in vLLM's own processes,
on CUDA in the trainer's process on ``cuda:LOCAL_RANK`` (vLLM's torchrun executor).

Sampling, stated exactly:

- prompts are token ids (no re-tokenisation); temperature, response budget and stop strings
  are the HF path's; ``top_p = 1``, ``top_k = 0`` (the full distribution);
- the log-prob returned for a token is vLLM's ``processed_logprobs`` (``log_softmax`` of the
  logits divided by the temperature; with top-p 1 and top-k 0 nothing else changes them):
  the distribution that drew the token, the HF samplers' convention (at temperature 0 the
  raw logits' own);
- a response ends at the first EOS id (kept, with its log-prob), at the first token after
  which the concatenated pieces ``tokenizer.decode([t])`` contain a stop string (kept), or
  after ``max_new_tokens`` -- the HF sampler's rule. vLLM is given the stop strings too so
  that it stops early; its own check runs on its incremental detokenisation, and the tokens
  it returns are then cut by mcgpo's rule, so a response never runs past where the HF path
  would stop it (it could stop earlier only where vLLM's whole-text decoding shows a stop
  string that the per-token pieces do not);
- one ``generate`` call per turn on CUDA (vLLM schedules the rows); on the CPU backend one
  per wave of rows whose prompts fit vLLM's prefill budget of one step (:func:`prefill_waves`; a
  seeded request prefilled over several steps crashes vLLM 0.32.0's CPU worker);
- per-row seeds: with one ``torch.Generator`` per row (what ``collect`` passes), row i's
  request gets ``seed = randint(0, 2**62)`` drawn from its own generator, so a row's tokens
  depend on its prompt, its generator and the weights only (vLLM seeds each request's own
  sampler), and a run is reproducible. The random streams are vLLM's, not the HF
  sampler's: the two engines sample different (equally distributed) responses.

Weight sync (:meth:`VLLMEngine.update_weights`, :meth:`VLLMEngine.update_weights_from`): in
memory where the engine shares the trainer's process, through the engine's folder otherwise,
with two fixes (prefix cache, tied head); stated exactly in :mod:`mcgpo.rollout.engine_weights`.

Several ranks: every rank builds its own engine on its own device from the policy (before
it is sharded) and syncs it from its replica (DDP; FSDP2 with ``train.fsdp_replica true``)
or from the gathered shards (FSDP2 without a replica), and each rank samples its own block
of groups as with the HF engine.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mcgpo.policy.loading import write_policy, write_tensors, write_weights
from mcgpo.rollout.engine_weights import policy_tensors, snapshot_tensors, weight_snapshot
from mcgpo.rollout.sampler import Samples
from mcgpo.rollout.vllm_launch import (
    CPU_BATCH_TOKENS,
    ENGINES,
    EngineError,
    backend,
    check_installed,
    check_vllm,
    engine_dtype,
    kept_matmul_precision,
    launch_environment,
    layout,
    planned_memory_utilization,
    scheduler_limits,
    startup_error,
    tied_head,
)
from mcgpo.rollout.vllm_requests import cut_at_stop, prefill_waves, row_seeds

__all__ = [
    "ENGINES",
    "EngineError",
    "VLLMEngine",
    "WorkerExtension",
    "check_installed",
    "check_vllm",
    "cut_at_stop",
    "weight_snapshot",
]

CPU_KV_CACHE_GB = 1.0  # the CPU engine's KV cache unless kv_cache_gb says otherwise


class WorkerExtension:
    """Methods vLLM mixes into its worker class (``worker_extension_cls``), called by name
    through ``collective_rpc`` in whatever process the worker runs."""

    def mcgpo_reprocess_tied_head(self) -> bool:
        """Re-run the LM head's post-load processing (the CPU backend's packed copy)."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        head = getattr(model, "lm_head", None)
        method = getattr(head, "quant_method", None)
        if method is None:
            return False
        method.process_weights_after_loading(head)
        return True


class VLLMEngine:
    """A vLLM engine serving the policy in ``folder``; see the module docstring.

    Args:
        folder: the policy folder (``save_pretrained`` layout); the engine starts from it,
            and the folder sync writes the new weights there.
        precision: ``train.precision`` (the dtype on the CPU: fp32 -> float32, bf16 /
            bf16-mixed -> bfloat16).
        dtype: ``rollout.vllm_dtype``: auto (bfloat16 on a GPU that has it, else from
            ``precision``), bfloat16 or float32.
        max_model_len: the longest prompt + response, in tokens.
        seed: the engine's seed (requests without their own seed).
        device: the trainer's device, "cpu" or "cuda[:N]" (the engine's on CUDA).
        gpu_memory_utilization: on a GPU, the share of its memory vLLM may take; 0 = planned
            for ``rows`` sequences of ``max_model_len`` tokens
            (:func:`~mcgpo.rollout.vllm_launch.planned_memory_utilization`).
        rows: the most sequences a turn samples at once (this rank's groups x group size).
        kv_cache_gb: KV-cache size in GiB; 0 = from the utilization on a GPU, 1 GiB on a CPU.
        enforce_eager: no compiled graphs (faster start, slower sampling); None = eager on
            the CPU, CUDA graphs on a GPU.
        sleep: free the engine's GPU memory during the update (:meth:`sleep`).
        in_process: CPU only: run the engine in this process (weights synced in memory).
        sync_folder: where the folder sync writes the new weights (default ``folder``);
            engines that start from one shared folder each sync through their own.
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        precision: str = "fp32",
        dtype: str = "auto",
        max_model_len: int,
        seed: int = 0,
        device: str = "cpu",
        gpu_memory_utilization: float = 0.0,
        rows: int = 0,
        kv_cache_gb: float = 0.0,
        enforce_eager: bool | None = None,
        sleep: bool = False,
        in_process: bool | None = None,
        sync_folder: str | Path | None = None,
    ) -> None:
        check_installed()
        from vllm import LLM

        self.folder = Path(folder)
        self.sync_folder = self.folder if sync_folder is None else Path(sync_folder)
        self.platform = backend()
        if sleep and self.platform == "cpu":
            raise EngineError("rollout.vllm_sleep: vLLM's sleep mode needs a GPU")
        if self.platform != "cpu" and not device.startswith(self.platform):
            raise EngineError(
                f"rollout.engine vllm: vLLM runs on {self.platform} here but the trainer's "
                f"device is {device}; use --device {self.platform}"
            )
        self.layout = layout(self.platform, device, in_process=in_process)
        self.dtype = engine_dtype(dtype, precision, self.platform, _bf16_ok(self.platform))
        kwargs: dict[str, Any] = dict(self.layout.llm_kwargs)
        self.memory_utilization = 0.0
        kv_gb = kv_cache_gb
        if self.platform == "cpu":
            kwargs["max_num_batched_tokens"] = max(CPU_BATCH_TOKENS, max_model_len)
            kv_gb = kv_gb or CPU_KV_CACHE_GB
        else:
            self.memory_utilization = gpu_memory_utilization or self._planned_utilization(
                rows, max_model_len, device
            )
            kwargs["gpu_memory_utilization"] = self.memory_utilization
            kwargs |= scheduler_limits(rows, max_model_len)  # what the plan counts
        if kv_gb:
            kwargs["kv_cache_memory_bytes"] = int(kv_gb * 2**30)
        if sleep:
            kwargs["enable_sleep_mode"] = True
        self.tied = tied_head(self.folder)
        self._sleeping = False
        self._can_sleep = sleep
        self._owns_world = self.layout.in_process and not _world_initialized()
        eager = self.platform == "cpu" if enforce_eager is None else enforce_eager
        started = time.perf_counter()
        try:
            with launch_environment(self.layout.env), kept_matmul_precision():
                self.llm = LLM(
                    model=str(self.folder),
                    dtype=self.dtype,
                    seed=seed,
                    max_model_len=max_model_len,
                    enable_prefix_caching=True,
                    enforce_eager=eager,
                    logprobs_mode="processed_logprobs",
                    worker_extension_cls=f"{__name__}.WorkerExtension",
                    **kwargs,
                )
        except Exception as err:  # vLLM raises ValueError, RuntimeError, OOM: one line each
            raise startup_error(err, self.memory_utilization, max_model_len) from None
        self.start_seconds = time.perf_counter() - started
        scheduler = self.llm.llm_engine.vllm_config.scheduler_config
        self.wave_tokens = int(scheduler.max_num_batched_tokens)
        self.wave_rows = int(scheduler.max_num_seqs)

    def _planned_utilization(self, rows: int, max_model_len: int, device: str) -> float:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(self.folder)
        return planned_memory_utilization(
            config, rows=max(rows, 1), context_tokens=max_model_len, dtype=self.dtype,
            total_bytes=_gpu_bytes(device),
        )  # fmt: skip

    @classmethod
    def for_policy(
        cls, model: Any, tokenizer: Any, folder: str | Path, **kwargs: Any
    ) -> VLLMEngine:
        """Write ``model`` and ``tokenizer`` to ``folder`` (from any rank:
        :func:`mcgpo.policy.write_policy`), then build the engine from it."""
        write_policy(model, tokenizer, folder)
        return cls(folder, **kwargs)

    def sample(
        self,
        prompts_ids: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        max_new_tokens: int = 32,
        eos_token_id: int | Iterable[int],
        pad_token_id: int | None = None,
        stop_strings: Sequence[str] = (),
        tokenizer: Any = None,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
    ) -> Samples:
        """One response per prompt, the arguments of :func:`mcgpo.rollout.sample` (less the
        model; ``pad_token_id`` is unused: vLLM does not pad); see the module docstring."""
        from vllm import SamplingParams

        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if stop_strings and tokenizer is None:
            raise ValueError("stop_strings need a tokenizer to decode the sampled tokens")
        eos = (
            [int(eos_token_id)]
            if isinstance(eos_token_id, int)
            else sorted({int(e) for e in eos_token_id})
        )
        if not eos:
            raise ValueError("eos_token_id is empty")
        n = len(prompts_ids)
        if n == 0:
            return Samples([], [])
        for i, p in enumerate(prompts_ids):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty")
        seeds = row_seeds(generator, n, temperature)
        params = [
            SamplingParams(
                n=1,
                temperature=temperature,
                top_p=1.0,
                top_k=0,
                max_tokens=max_new_tokens,
                seed=seeds[i],
                stop=list(stop_strings) or None,
                stop_token_ids=eos,
                include_stop_str_in_output=True,
                skip_special_tokens=False,
                logprobs=0,
            )
            for i in range(n)
        ]
        prompts = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts_ids]
        if self.layout.waves:
            calls = prefill_waves([len(p) for p in prompts_ids], self.wave_tokens, self.wave_rows)
        else:
            calls = [range(n)]
        outputs = []
        for rows in calls:
            wave = [prompts[i] for i in rows], [params[i] for i in rows]
            outputs += self.llm.generate(*wave, use_tqdm=False)
        responses: list[list[int]] = []
        log_probs: list[list[float]] = []
        pieces: dict[int, str] = {}
        for out in outputs:
            completion = out.outputs[0]
            ids = [int(t) for t in completion.token_ids]
            lps = [float(step[t].logprob) for t, step in zip(ids, completion.logprobs)]
            keep = cut_at_stop(ids, set(eos), stop_strings, tokenizer, pieces)
            responses.append(ids[:keep])
            log_probs.append(lps[:keep])
        return Samples(responses, log_probs)

    def sleep(self) -> None:
        """Free the engine's GPU memory until :meth:`update_weights` (when built with
        ``sleep=True``; otherwise nothing): level 2, weights and KV cache discarded, since
        the sync replaces every weight."""
        if self._can_sleep and not self._sleeping:
            self.llm.sleep(level=2)
            self._sleeping = True

    def update_weights(
        self, model: Any, *, reset_prefix_cache: bool = True, reprocess_tied_head: bool = True
    ) -> float:
        """Serve ``model``'s current weights from now on; returns the seconds it took.

        Order: weights awake, weights loaded (in memory, or through the folder), the
        trainer's cached blocks freed, KV cache awake, prefix cache reset.
        ``reset_prefix_cache`` and ``reprocess_tied_head`` are the two fixes stated in
        :mod:`mcgpo.rollout.engine_weights`; they are switches for the tests only (off, the engine serves stale
        log-probs)."""
        return self._reload(
            lambda dtype: policy_tensors(model, dtype),
            lambda folder: write_weights(model, folder),
            reset_prefix_cache=reset_prefix_cache,
            reprocess_tied_head=reprocess_tied_head,
        )

    def update_weights_from(self, weights: Mapping[str, torch.Tensor]) -> float:
        """Serve ``weights`` from now on, a snapshot of the policy taken earlier
        (:func:`weight_snapshot`: whole tensors by their checkpoint names), through the same
        path as :meth:`update_weights`; returns the seconds it took. It reads only the
        snapshot, never the policy, so it may run in another thread than the update's (the
        rollout producer of ``train.async_lag``) while the policy changes."""
        return self._reload(
            lambda dtype: snapshot_tensors(weights, dtype),
            lambda folder: write_tensors(weights, folder),
        )

    def _reload(
        self,
        tensors: Callable[[torch.dtype], Iterator[tuple[str, torch.Tensor]]],
        write: Callable[[Path], Any],
        *,
        reset_prefix_cache: bool = True,
        reprocess_tied_head: bool = True,
    ) -> float:
        """The sync of :meth:`update_weights`: ``tensors(dtype)`` in memory, or ``write``
        into the sync folder, whichever the layout takes."""
        started = time.perf_counter()
        if self._sleeping:
            self.llm.wake_up(tags=["weights"])
        if self.layout.sync_in_memory:
            self._load_in_memory(tensors(getattr(torch, self.dtype)))
        else:
            self._load_from_folder(write)
        if reprocess_tied_head and self.tied:
            self.llm.collective_rpc("mcgpo_reprocess_tied_head")
        if self._sleeping:  # awake, nothing waits for the memory: the producer of
            # train.async_lag loads while the update allocates, never emptying its cache
            _free_cached_blocks(self.platform)
            self.llm.wake_up(tags=["kv_cache"])
            self._sleeping = False
        if reset_prefix_cache:
            self.llm.reset_prefix_cache()
        return time.perf_counter() - started

    def _load_in_memory(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """The engine shares this process: vLLM's in-place reload takes the tensors."""
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
        )

    def _load_from_folder(self, write: Callable[[Path], Any]) -> None:
        """The engine is in other processes: the weights go through its folder."""
        write(self.sync_folder)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self.sync_folder)})

    def close(self) -> None:
        """Stop the engine (its processes, or in-process its vLLM groups; the process group
        only if the engine created it); also at interpreter exit."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        shutdown = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        with contextlib.suppress(Exception):
            if shutdown is not None:
                shutdown.shutdown()
        del llm
        if self.layout.in_process:
            with contextlib.suppress(Exception):
                from vllm.distributed.parallel_state import (
                    destroy_distributed_environment,
                    destroy_model_parallel,
                )

                destroy_model_parallel()
                if self._owns_world:
                    destroy_distributed_environment()


def _free_cached_blocks(platform: str) -> None:
    """Give the trainer's cached, unused CUDA blocks back before vLLM's KV cache wakes."""
    if platform == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _gpu_bytes(device: str) -> int:
    """The memory of the trainer's GPU (the engine's: they share it)."""
    index = torch.device(device).index
    return int(torch.cuda.get_device_properties(0 if index is None else index).total_memory)


def _bf16_ok(platform: str) -> bool:
    """Whether vLLM's GPU computes in bfloat16 (compute capability 8.0 and up)."""
    if platform == "cpu":
        return False
    from vllm.platforms import current_platform

    return bool(current_platform.has_device_capability(80))


def _world_initialized() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized()
