"""What a training run needs in GPU memory: a model's bytes, computed from its config.

Everything here is arithmetic on a Qwen2 / Qwen3 config (:mod:`mcgpo.policy.shapes`); the
parameter count is exact (tested against the model built on the meta device), the
activation bytes are the tensors autograd saves for backward, counted op by op below and
checked on the CPU against ``torch.autograd.graph.saved_tensors_hooks`` at small sizes.
docs/reference/memory.md prints :func:`plan` for the recipe's models.

Activations per token of one decoder layer, bf16-mixed (fp32 residual stream, bf16 matmul
inputs under autocast; h hidden, f MLP, q = heads x head_dim, k = kv heads x head_dim):

    2 RMSNorms, each: fp32 input and normalised output (4h + 4h) + the bf16 cast (2h)   20h
    rotary: q, k and their rotate_half (2q + 2q + 2k + 2k)                               4q + 4k
    SDPA: q, k and v repeated to all heads (GQA with a padding mask), output (4 x 2q)   8q
    o_proj input (2q)                                                                    2q
    SwiGLU MLP: gate, up, silu(gate), product (4 x 2f)                                   8f
    Qwen3's q/k RMSNorms: fp32 copy, normalised, bf16 cast (10 (q + k))

In fp32 every 2 above becomes 4 and the casts vanish: 16h + 28q + 8k + 16f. With gradient
checkpointing a layer keeps only its fp32 input (4h) and one layer at a time holds the
full set while it is recomputed. The LM head runs on the response positions only (the
update passes the response mask as ``positions``; ``train.logits_chunk`` x rows of them at a
time, all if 0) and holds bf16 logits, their fp32 upcast and log-softmax, and for the
entropy its exp: 14 bytes per vocabulary entry per position.

A colocated vLLM engine (:func:`engine_memory`, ``rollout.engine vllm``) holds its own copy
of the weights in its dtype, a KV cache of ``2 x layers x kv_heads x head_dim x bytes`` per
token for every sequence of the rollout at full context, the activations of its profiling
forward (one prefill step of ``prefill_tokens``; nothing is saved for backward) and a fixed
allowance for the CUDA context and its CUDA graphs. The last two are estimates, not
measured on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "EngineMemory",
    "MemoryPlan",
    "activation_bytes_per_token",
    "engine_memory",
    "head_bytes",
    "kv_cache_bytes_per_token",
    "layer_bytes_per_token",
    "parameter_count",
    "plan",
]

GB = 1e9


def _dims(config: Any) -> tuple[int, int, int, int, int]:
    h, f = config.hidden_size, config.intermediate_size
    d = getattr(config, "head_dim", None) or h // config.num_attention_heads
    return h, f, config.num_attention_heads * d, config.num_key_value_heads * d, d


def _qk_norm(config: Any) -> bool:
    return config.model_type == "qwen3"


def parameter_count(config: Any) -> int:
    """Exact number of parameters of a Qwen2/Qwen3 causal LM with this config."""
    h, f, q, k, d = _dims(config)
    bias = bool(getattr(config, "attention_bias", config.model_type == "qwen2"))
    attn = h * q + 2 * h * k + q * h + (q + 2 * k if bias else 0)
    if _qk_norm(config):
        attn += 2 * d  # q_norm and k_norm weights, one per head dimension
    layer = attn + 3 * h * f + 2 * h  # MLP (gate, up, down) and two RMSNorm weights
    embed = config.vocab_size * h
    head = 0 if config.tie_word_embeddings else config.vocab_size * h
    return config.num_hidden_layers * layer + embed + head + h  # + the final norm


def layer_bytes_per_token(config: Any, precision: str = "bf16-mixed") -> int:
    """Saved-for-backward bytes of one decoder layer per token (module docstring)."""
    h, f, q, k, _ = _dims(config)
    if precision == "fp32":
        size = 16 * h + 28 * q + 8 * k + 16 * f
        return size + (8 * (q + k) if _qk_norm(config) else 0)
    size = 20 * h + 14 * q + 4 * k + 8 * f
    return size + (10 * (q + k) if _qk_norm(config) else 0)


def activation_bytes_per_token(
    config: Any, *, precision: str = "bf16-mixed", checkpointing: bool = False
) -> int:
    """Bytes per token of every layer's saved activations at the backward's peak."""
    layers, full = config.num_hidden_layers, layer_bytes_per_token(config, precision)
    if not checkpointing:
        return layers * full
    return layers * 4 * config.hidden_size + full  # fp32 layer inputs + one recomputed layer


def head_bytes(config: Any, rows: int, positions: int, chunk: int = 0) -> int:
    """Bytes of the LM head's logits, log-softmax and entropy for ``rows x positions``
    (``positions`` per row: the response tokens, which the head runs on)."""
    width = min(chunk, positions) if chunk else positions
    return 14 * config.vocab_size * rows * width


def kv_cache_bytes_per_token(config: Any, dtype_bytes: int = 2) -> int:
    """Bytes of the sampler's key/value cache per token (all layers)."""
    _, _, _, k, _ = _dims(config)
    return config.num_hidden_layers * 2 * k * dtype_bytes


ENGINE_OVERHEAD = 1.5 * GB  # CUDA context, CUDA graphs, sampler buffers: an allowance


@dataclass(frozen=True)
class EngineMemory:
    """Bytes of a colocated vLLM engine on one GPU (module docstring)."""

    weights_bytes: int  # parameters x dtype bytes (the whole model on every GPU)
    kv_bytes: int  # rows x context tokens x KV bytes per token
    activations_bytes: int  # one prefill step's forward, and the sampled rows' logits
    overhead_bytes: int  # ENGINE_OVERHEAD

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.activations_bytes + self.overhead_bytes


def engine_memory(
    config: Any,
    *,
    rows: int,
    context_tokens: int,
    dtype_bytes: int = 2,
    prefill_tokens: int = 8192,
) -> EngineMemory:
    """What a vLLM engine needs to hold ``rows`` sequences of ``context_tokens`` at once.

    Activations of the profiling forward over ``prefill_tokens`` tokens, per token: the
    residual stream and its normed copy, q/k/v and the attention output (4h + 2q + 2k),
    the MLP's gate-up output, its SwiGLU product (3f), in the engine's dtype; plus each
    row's fp32 logits, log-softmax and probabilities (12 bytes per vocabulary entry).
    """
    h, f, q, k, _ = _dims(config)
    acts = prefill_tokens * (4 * h + 2 * q + 2 * k + 3 * f) * dtype_bytes
    logits = rows * config.vocab_size * 12
    return EngineMemory(
        weights_bytes=parameter_count(config) * dtype_bytes,
        kv_bytes=rows * context_tokens * kv_cache_bytes_per_token(config, dtype_bytes),
        activations_bytes=acts + logits,
        overhead_bytes=int(ENGINE_OVERHEAD),
    )


@dataclass(frozen=True)
class MemoryPlan:
    """GB per GPU of one update and one rollout phase (computed, not measured)."""

    params_b: float  # parameters, billions
    states_gb: float  # weights + gradients + AdamW moments (sharded over the GPUs)
    ref_gb: float  # frozen fp32 reference policy for the KL term (sharded likewise)
    activations_gb: float  # one micro-batch's saved activations
    head_gb: float  # LM head of one micro-batch
    update_gb: float  # states + replica + ref + activations + head
    rollout_gb: float  # full weights + bf16 autocast copy + sharded states + ref + KV cache
    # rollout.engine vllm: the engine's own share (engine_memory, bf16, every sequence at
    # row_tokens), and what the trainer keeps while it samples (weights + moments + ref)
    engine: EngineMemory | None = None
    resident_gb: float = 0.0
    # FSDP2 (gpus > 1): the full fp32 replica every rank keeps for sampling and saving
    # (training/learner.py: it follows the sharded steps); 0 on one GPU, where the
    # trained module is the replica, and without one (train.fsdp_replica false)
    replica_gb: float = 0.0

    @property
    def vllm_gb(self) -> float:
        """The engine's share, GB (0 without one)."""
        return self.engine.total_bytes / GB if self.engine else 0.0

    @property
    def vllm_peak_gb(self) -> tuple[float, float]:
        """Peak GB per GPU with a colocated vLLM engine: (awake during the update: the
        engine beside the larger of the update and what the trainer keeps while sampling;
        asleep during it, ``rollout.vllm_sleep`` level 2, keeping only its overhead)."""
        engine = self.engine
        if engine is None:
            return (0.0, 0.0)
        awake = max(self.update_gb, self.resident_gb) + self.vllm_gb
        asleep = max(self.update_gb + engine.overhead_bytes / GB, self.resident_gb + self.vllm_gb)
        return (awake, asleep)


def plan(
    config: Any,
    *,
    gpus: int = 1,
    checkpointing: bool = True,
    micro_rows: int = 8,
    row_tokens: int = 2048,
    logits_chunk: int = 512,
    response_tokens: int = 512,
    sequences: int = 128,
    kl: bool = True,
    replica: bool = True,
) -> MemoryPlan:
    """The bf16-mixed memory of one GPU of ``gpus`` (FSDP2 shards states and reference).

    What mcgpo's trainer holds (training/setup.py, training/learner.py). States: 4 (fp32
    weights) + 4 (gradients) + 8 (AdamW m, v) bytes per parameter, divided by ``gpus``.
    Under FSDP2 (``gpus`` > 1) every rank also keeps the policy's full fp32 replica (4
    bytes per parameter) that follows the sharded steps, for sampling and saving. The
    reference is an fp32 copy (4 bytes), sharded like the learner under FSDP2
    (``training/learner.py``'s ``distributed_reference``). Rollout: the
    sampler runs on the whole fp32 weights (the replica, or on one GPU the trained module
    itself) plus autocast's cached bf16 copy (2 bytes per parameter), beside the sharded
    weights and AdamW moments (gradients are freed), the reference and the KV cache of
    ``sequences`` rows of ``row_tokens`` tokens in bf16. With a colocated vLLM engine
    instead of the HF sampler: ``engine`` (:func:`engine_memory` for the same sequences,
    bf16) beside what the trainer keeps while it samples, ``resident_gb`` (the fp32
    weights, the sharded weights and moments, the reference). ``replica`` false
    (``train.fsdp_replica false``, the default with vLLM): no full replica on any of
    ``gpus`` > 1; the trainer then keeps only its shards while vLLM samples (the HF-sampler
    fields, ``rollout_gb``, assume the replica).
    """
    n = parameter_count(config)
    states = 16 * n / gpus
    replica_bytes = 4 * n if gpus > 1 and replica else 0.0  # a whole copy beside the learner
    ref = 4 * n / gpus if kl else 0.0
    shard = 4 * n / gpus if gpus > 1 else 0.0  # the learner's own weights (sharded)
    tokens = micro_rows * row_tokens
    acts = tokens * activation_bytes_per_token(config, checkpointing=checkpointing)
    head = head_bytes(config, micro_rows, min(response_tokens, row_tokens), logits_chunk)
    kv = sequences * row_tokens * kv_cache_bytes_per_token(config)
    # while vLLM samples: the whole fp32 weights (one GPU's module, or the replica) or only
    # the learner's shard, the moments, the reference
    weights = 4 * n + shard if gpus == 1 or replica else shard
    resident = weights + 8 * n / gpus + ref
    # the HF sampler: the whole fp32 weights (it needs them) and autocast's bf16 copy
    hf_rollout = 4 * n + shard + 8 * n / gpus + ref + 2 * n
    engine = engine_memory(config, rows=sequences, context_tokens=row_tokens)
    return MemoryPlan(
        params_b=n / 1e9,
        states_gb=states / GB,
        ref_gb=ref / GB,
        activations_gb=acts / GB,
        head_gb=head / GB,
        update_gb=(states + replica_bytes + ref + acts + head) / GB,
        rollout_gb=(hf_rollout + kv) / GB,
        engine=engine,
        resident_gb=resident / GB,
        replica_gb=replica_bytes / GB,
    )
