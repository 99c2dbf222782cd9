"""The memory plan's arithmetic (mcgpo.policy.memory) against models built on the meta
device from the real configs, and against autograd's saved tensors of small real models."""

from __future__ import annotations

import pytest
import torch

from mcgpo.policy.memory import (
    activation_bytes_per_token,
    kv_cache_bytes_per_token,
    layer_bytes_per_token,
    lora_parameter_count,
    parameter_count,
    plan,
)
from mcgpo.policy.precision import compute
from mcgpo.policy.shapes import SHAPES, shaped_config

# Parameters as the model cards state them (billions, rounded there to two decimals).
PUBLISHED = {"qwen2.5-1.5b": 1.54, "qwen2.5-3b": 3.09, "qwen2.5-7b": 7.61, "qwen3-4b": 4.02,
             "qwen3-8b": 8.19}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_parameter_count_is_the_meta_models(name):
    from transformers import AutoModelForCausalLM

    config = shaped_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert parameter_count(config) == sum(p.numel() for p in model.parameters())
    assert parameter_count(config) / 1e9 == pytest.approx(PUBLISHED[name], abs=0.006)


def test_sizes_by_hand_for_qwen25_1_5b():
    config = shaped_config("qwen2.5-1.5b")
    # h 1536, f 8960, q = 12 x 128 = 1536, k = 2 x 128 = 256:
    # bf16-mixed layer = 20h + 14q + 4k + 8f = 30720 + 21504 + 1024 + 71680 = 124928
    assert layer_bytes_per_token(config) == 124_928
    assert activation_bytes_per_token(config) == 28 * 124_928
    # checkpointing: 28 fp32 layer inputs (4h = 6144) + one full layer
    assert activation_bytes_per_token(config, checkpointing=True) == 28 * 6144 + 124_928
    # KV cache: 28 layers x (k and v) x 256 x 2 bytes
    assert kv_cache_bytes_per_token(config) == 28_672


def test_fsdp_shards_the_states_and_not_the_activations():
    """FSDP2 shards the trained states and the reference (training/learner.py's
    distributed_reference), but every rank keeps the whole fp32 replica that follows the
    sharded steps, so at 4 GPUs the update holds 16n/4 + 4n + 4n/4 bytes of weights and
    states, not (16n + 4n)/4."""
    config = shaped_config("qwen2.5-7b")
    one, four = plan(config, gpus=1), plan(config, gpus=4)
    n = parameter_count(config)
    assert four.states_gb == pytest.approx(one.states_gb / 4)
    assert one.ref_gb == pytest.approx(4 * n / 1e9) and four.ref_gb == pytest.approx(n / 1e9)
    assert one.replica_gb == 0.0 and four.replica_gb == pytest.approx(4 * n / 1e9)
    assert four.activations_gb == one.activations_gb and four.head_gb == one.head_gb
    assert one.states_gb == pytest.approx(16 * n / 1e9)
    extra = four.activations_gb + four.head_gb
    assert one.update_gb == pytest.approx((16 * n + 4 * n) / 1e9 + extra)
    assert four.update_gb == pytest.approx((16 * n / 4 + 4 * n + 4 * n / 4) / 1e9 + extra)
    # the rollout: fp32 weights + bf16 copy (6n), the learner's weight shard (4n/4 at 4
    # GPUs, none on one), the moments (8n/gpus), the reference (4n/gpus); KV cache aside
    kv = one.rollout_gb - (6 * n + 8 * n + 4 * n) / 1e9
    assert kv > 0
    assert four.rollout_gb == pytest.approx((6 * n + 4 * n / 4 + 8 * n / 4 + n) / 1e9 + kv)
    assert plan(config, gpus=4, kl=False).ref_gb == 0.0
    no_ckpt = plan(config, checkpointing=False)
    assert no_ckpt.activations_gb > 5 * one.activations_gb


def _saved_bytes(model, ids, mask, precision: str) -> int:
    """Bytes of the distinct storages autograd saves in one forward of the decoder."""
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), compute(precision, "cpu"):
        model.base_model(input_ids=ids, attention_mask=mask, use_cache=False)
    return sum(seen.values())


@pytest.mark.parametrize("name", ["qwen2.5-1.5b", "qwen3-4b"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_layer_bytes_match_autograds_saved_tensors(name, precision):
    small = dict(hidden_size=128, intermediate_size=384, num_attention_heads=8,
                 num_key_value_heads=2, vocab_size=300, head_dim=16)  # fmt: skip
    per = _per_layer_token(name, precision, small, checkpointing=False)
    computed = layer_bytes_per_token(shaped_config(name, **small), precision)
    assert computed == pytest.approx(per, rel=0.08)


def test_checkpointed_layers_keep_their_fp32_input_only():
    small = dict(hidden_size=128, intermediate_size=384, num_attention_heads=8,
                 num_key_value_heads=2, vocab_size=300)  # fmt: skip
    per = _per_layer_token("qwen2.5-1.5b", "bf16-mixed", small, checkpointing=True)
    assert per == pytest.approx(4 * 128, rel=0.05)  # 4h: the rest is recomputed in backward
    config = shaped_config("qwen2.5-1.5b", num_hidden_layers=4, **small)
    assert activation_bytes_per_token(config, checkpointing=True) == 4 * 512 + (
        layer_bytes_per_token(config)
    )


def _per_layer_token(
    name: str, precision: str, small: dict, *, checkpointing: bool, lora: int = 0
) -> float:
    """Saved bytes per layer and token, from models of 2 and 4 layers at 2 lengths (with
    ``lora``: rank-``lora`` adapters on the seven projections)."""
    from transformers import AutoModelForCausalLM

    gen = torch.Generator().manual_seed(0)
    measured = {}
    for layers in (2, 4):
        model = AutoModelForCausalLM.from_config(
            shaped_config(name, num_hidden_layers=layers, **small)
        ).train()
        if lora:
            from mcgpo.policy.lora import add_lora

            targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
            add_lora(model, rank=lora, alpha=1.0, dropout=0.0, targets=targets, seed=0)
        if checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        for length in (32, 64):
            ids = torch.randint(0, 300, (4, length), generator=gen)
            mask = torch.ones_like(ids)
            mask[0, :3] = 0  # a left-padded row, as the sampler's batches have
            measured[layers, length] = _saved_bytes(model, ids, mask, precision)
    # per layer and per token: the difference of differences removes the weights' bf16
    # copies (per layer, not per token) and everything outside the layers
    return (measured[4, 64] - measured[4, 32] - measured[2, 64] + measured[2, 32]) / 2 / (4 * 32)


def test_plan_carries_the_vllm_engines_share_and_peaks():
    """The engine's share is engine_memory of the same rollout; the trainer keeps its fp32
    replica (4n), the learner's weight shard (4n / gpus), the sharded moments (8n / gpus)
    and the sharded reference (4n / gpus) while vLLM samples; asleep (level 2) the engine keeps only
    its overhead through the update."""
    from mcgpo.policy.memory import GB, engine_memory

    config = shaped_config("qwen2.5-1.5b")
    n = parameter_count(config)
    p = plan(config, gpus=4, sequences=64, row_tokens=1024)
    assert p.engine == engine_memory(config, rows=64, context_tokens=1024)
    assert p.resident_gb == pytest.approx((4 * n + 4 * n / 4 + 8 * n / 4 + 4 * n / 4) / GB)
    awake, asleep = p.vllm_peak_gb
    assert awake == pytest.approx(max(p.update_gb, p.resident_gb) + p.vllm_gb)
    overhead = p.engine.overhead_bytes / GB
    assert asleep == pytest.approx(max(p.update_gb + overhead, p.resident_gb + p.vllm_gb))
    assert asleep <= awake


def test_without_a_replica_fsdp2_keeps_only_shards_beside_vllm():
    """train.fsdp_replica false (vLLM's default): no whole fp32 copy on any of 4 GPUs; the
    update holds 16n/4 + 4n/4 (+ activations), and while vLLM samples the trainer keeps its
    weight shard, moments and reference (16n/4 in all): 4n less than with the replica in
    both. One GPU has no replica either way; the HF-sampler rollout is unchanged."""
    from mcgpo.policy.memory import GB

    config = shaped_config("qwen2.5-7b")
    n = parameter_count(config)
    kept, dropped = plan(config, gpus=4), plan(config, gpus=4, replica=False)
    assert dropped.replica_gb == 0.0
    assert kept.update_gb - dropped.update_gb == pytest.approx(4 * n / GB)
    assert dropped.resident_gb == pytest.approx((4 * n / 4 + 8 * n / 4 + 4 * n / 4) / GB)
    assert kept.resident_gb - dropped.resident_gb == pytest.approx(4 * n / GB)
    assert dropped.rollout_gb == kept.rollout_gb and dropped.engine == kept.engine
    assert plan(config, gpus=1, replica=False) == plan(config, gpus=1)


# --------------------------------------------------------------------------- LoRA
@pytest.mark.parametrize("name", ["qwen2.5-1.5b", "qwen3-4b"])
def test_lora_parameter_count_is_the_wrapped_meta_models(name):
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from mcgpo.policy.lora import add_lora, trainable_count
    from mcgpo.training.config import TrainConfig

    config = shaped_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    add_lora(model, rank=16, alpha=32.0, dropout=0.0, targets=TrainConfig().lora_targets, seed=0)
    assert trainable_count(model) == lora_parameter_count(config, 16)


def test_lora_plan_by_hand_for_qwen25_7b():
    # 7B, r = 16: n = 7.62e9, a = 28 x 16 x (7 x 3584 + 2 x 3584 + 2 x 512 + 3 x 18944)
    # = 28 x 16 x 90,112 = 40,370,176 adapter parameters (0.5 % of n)
    config = shaped_config("qwen2.5-7b")
    n, a = parameter_count(config), lora_parameter_count(config, 16)
    assert a == 28 * 16 * (7 * 3584 + 2 * 3584 + 2 * 512 + 3 * 18944) == 40_370_176
    bf16 = plan(config, lora_rank=16, base_bytes=2)
    assert bf16.states_gb == pytest.approx((2 * n + 16 * a) / 1e9)
    assert bf16.ref_gb == 0.0 and bf16.replica_gb == 0.0  # the base with adapters off
    assert bf16.trainable_b == pytest.approx(a / 1e9)
    full = plan(config)
    # the same micro-batch: activations differ by the adapters' 7 r bf16 values per layer
    extra = 8 * 2048 * 7 * 16 * 2 / 1e9
    assert bf16.activations_gb == pytest.approx(full.activations_gb + extra)
    assert bf16.update_gb == pytest.approx(bf16.states_gb + bf16.activations_gb + bf16.head_gb)
    # full fine-tuning of 7B does not fit one 80 GB GPU; LoRA on a bf16 base does
    assert full.update_gb > 80 and bf16.update_gb < 0.95 * 80
    fp32_base = plan(config, lora_rank=16, base_bytes=4)
    assert fp32_base.states_gb - bf16.states_gb == pytest.approx(2 * n / 1e9)


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_lora_layer_bytes_bound_autograds_saved_tensors(precision):
    # the count adds each adapter's A x to the full layer's; a frozen base saves a little
    # less than a trained one, so the count is an upper bound within 15 % (fp32: 12.6 %, bf16-mixed: 8 %)
    pytest.importorskip("peft")
    small = dict(hidden_size=128, intermediate_size=384, num_attention_heads=8,
                 num_key_value_heads=2, vocab_size=300, head_dim=16)  # fmt: skip
    config = shaped_config("qwen2.5-1.5b", num_hidden_layers=1, **small)
    for rank in (8, 16):
        per = _per_layer_token("qwen2.5-1.5b", precision, small, checkpointing=False, lora=rank)
        computed = activation_bytes_per_token(config, precision=precision, lora_rank=rank)
        assert per <= computed <= 1.15 * per
