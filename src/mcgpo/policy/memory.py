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

LoRA (``lora_rank`` r > 0, :mod:`mcgpo.policy.lora`, default targets: the seven attention
and MLP projections): each adapted layer ``in -> out`` adds ``r (in + out)`` parameters, per
decoder layer ``r (7h + 2q + 2k + 3f)`` (:func:`lora_parameter_count`). Only those train:
16 bytes each (fp32 weights, gradients, AdamW m and v; the adapters are fp32 whatever the
base's dtype); the frozen base holds its weights only (4 bytes a parameter under
bf16-mixed, 2 under ``train.precision bf16``), and the KL reference is that base with the
adapters off: 0 bytes. Activations: each adapter keeps ``A x`` (r values) for its
gradient, ``7 r`` per layer and token in the compute dtype, added to the full layer's count;
a frozen base keeps a little less than a trained one (measured 6-9 % fewer bytes per layer
on the CPU against autograd's saved tensors), so the LoRA figure is an upper bound.

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
    "lora_parameter_count",
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


def lora_parameter_count(config: Any, rank: int) -> int:
    """Parameters of rank-``rank`` LoRA adapters on the seven projections of every layer."""
    h, f, q, k, _ = _dims(config)
    return config.num_hidden_layers * rank * (7 * h + 2 * q + 2 * k + 3 * f)


def layer_bytes_per_token(config: Any, precision: str = "bf16-mixed") -> int:
    """Saved-for-backward bytes of one decoder layer per token (module docstring)."""
    h, f, q, k, _ = _dims(config)
    if precision == "fp32":
        size = 16 * h + 28 * q + 8 * k + 16 * f
        return size + (8 * (q + k) if _qk_norm(config) else 0)
    size = 20 * h + 14 * q + 4 * k + 8 * f
    return size + (10 * (q + k) if _qk_norm(config) else 0)


def activation_bytes_per_token(
    config: Any, *, precision: str = "bf16-mixed", checkpointing: bool = False, lora_rank: int = 0
) -> int:
    """Bytes per token of every layer's saved activations at the backward's peak (with
    ``lora_rank``: plus each adapter's ``A x``, module docstring)."""
    layers, full = config.num_hidden_layers, layer_bytes_per_token(config, precision)
    full += 7 * lora_rank * (4 if precision == "fp32" else 2)
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
    trainable_b: float = 0.0  # parameters that train, billions (LoRA: the adapters')

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
    lora_rank: int = 0,
    base_bytes: int = 4,
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
    if lora_rank > 0:
        return _lora_plan(
            config, lora_rank, base_bytes, gpus=gpus, checkpointing=checkpointing,
            micro_rows=micro_rows, row_tokens=row_tokens, logits_chunk=logits_chunk,
            response_tokens=response_tokens, sequences=sequences,
        )  # fmt: skip
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
        trainable_b=n / 1e9,
    )


def _lora_plan(
    config: Any,
    rank: int,
    base_bytes: int,
    *,
    gpus: int,
    checkpointing: bool,
    micro_rows: int,
    row_tokens: int,
    logits_chunk: int,
    response_tokens: int,
    sequences: int,
) -> MemoryPlan:
    """:func:`plan` with rank-``rank`` adapters on a frozen base of ``base_bytes`` a
    parameter (4: bf16-mixed; 2: ``train.precision bf16``). LoRA runs under DDP (every GPU
    holds the same), so ``gpus`` changes nothing per GPU; the reference is the base with
    the adapters off (0 bytes); no replica. Rollout with the HF sampler: the base, autocast's
    bf16 copy of an fp32 base (2 bytes a parameter; none for a bf16 base), the adapters and
    their moments, the KV cache; beside vLLM: the base, the adapters and their moments."""
    if base_bytes not in (2, 4):
        raise ValueError(f"base_bytes must be 2 (bf16) or 4 (fp32), got {base_bytes}")
    n, a = parameter_count(config), lora_parameter_count(config, rank)
    states = base_bytes * n + 16 * a
    tokens = micro_rows * row_tokens
    per_token = activation_bytes_per_token(config, checkpointing=checkpointing, lora_rank=rank)
    acts = tokens * per_token
    head = head_bytes(config, micro_rows, min(response_tokens, row_tokens), logits_chunk)
    kv = sequences * row_tokens * kv_cache_bytes_per_token(config)
    resident = base_bytes * n + 12 * a
    cast = 2 * n if base_bytes == 4 else 0
    return MemoryPlan(
        params_b=n / 1e9,
        states_gb=states / GB,
        ref_gb=0.0,
        activations_gb=acts / GB,
        head_gb=head / GB,
        update_gb=(states + acts + head) / GB,
        rollout_gb=(resident + cast + kv) / GB,
        engine=engine_memory(config, rows=sequences, context_tokens=row_tokens),
        resident_gb=resident / GB,
        replica_gb=0.0,
        trainable_b=a / 1e9,
    )
