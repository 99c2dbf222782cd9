"""train.precision, pi_old recompute and its mismatch metrics, device checks, peak memory.

bf16 runs on the CPU (torch autocast supports bfloat16 there), so everything but the CUDA
kernels themselves is tested here: the sampler and the training forward disagree in bf16,
and recomputing pi_old makes the first step's ratio exactly 1.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from mcgpo.cli import main
from mcgpo.policy.precision import (
    PRECISIONS,
    PrecisionError,
    cast_weights,
    check_precision,
    compute,
    compute_dtype,
    weight_dtype,
)
from mcgpo.policy.tiny import tiny_model, train_tokenizer
from mcgpo.rollout.sampler import sample
from mcgpo.rollout.tokens import TokenBatch
from mcgpo.training.config import ConfigError, RunConfig, TrainConfig
from mcgpo.training.config_layout import from_dict
from mcgpo.training.metrics import PeakMemory, read_metrics
from mcgpo.training.old_logprobs import mismatch_stats, recompute_log_probs
from mcgpo.training.runtime import check_device
from mcgpo.training.update import update_policy

TEXTS = ["go to fridge 1", "open drawer 2", "take mug 1 from table 1", "put mug 1 in/on sink 1"]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS * 4, vocab_size=300)


def model_in(tokenizer, precision: str):
    model = tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1)
    return cast_weights(model, precision)


def sampled_batch(model, tokenizer, precision: str) -> TokenBatch:
    """Eight rows sampled at T = 1 in ``precision``, with the sampler's log-probs as pi_old."""
    prompts = [tokenizer(t)["input_ids"] for t in TEXTS * 2]
    gen = torch.Generator().manual_seed(0)
    with compute(precision, "cpu"):
        out = sample(
            model, prompts, temperature=1.0, max_new_tokens=10, generator=gen,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
    return TokenBatch.from_sequences(
        prompts, out.response_ids, out.log_probs, pad_token_id=tokenizer.pad_token_id
    )


def run_update(model, batch, **train):
    cfg = TrainConfig(kl_coef=0.0, micro_batch_size=4, lr=1e-3, **train)
    model = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    advantages = np.linspace(-1.0, 1.0, len(batch)).astype(np.float32)
    return update_policy(model, optimizer, batch, advantages, cfg)


def test_dtypes_of_each_precision():
    assert PRECISIONS == ("fp32", "bf16-mixed", "bf16")
    assert [weight_dtype(p) for p in PRECISIONS] == [torch.float32, torch.float32, torch.bfloat16]
    assert [compute_dtype(p) for p in PRECISIONS] == [torch.float32, torch.bfloat16, torch.bfloat16]
    with compute("bf16-mixed", "cpu"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with compute("fp32", "cpu"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    with pytest.raises(
        ValueError, match="precision must be one of fp32, bf16-mixed, bf16; got 'fp16'"
    ):
        weight_dtype("fp16")


def test_cast_weights_keeps_buffers_in_float32(tokenizer):
    model = model_in(tokenizer, "bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in model.buffers()} == {torch.float32}  # rotary frequencies
    assert {p.dtype for p in model_in(tokenizer, "bf16-mixed").parameters()} == {torch.float32}


def test_fp32_recompute_equals_the_sampler(tokenizer):
    model = model_in(tokenizer, "fp32").train()
    batch = sampled_batch(model, tokenizer, "fp32")
    fresh = recompute_log_probs(model, batch, [np.arange(0, 5), np.arange(5, 8)], precision="fp32")
    mask = batch.response_mask
    assert int(mask.sum()) > 20
    assert torch.allclose(fresh[mask], batch.old_log_probs[mask], atol=1e-5, rtol=0)
    assert torch.equal(fresh[~mask], torch.zeros_like(fresh[~mask]))
    stats = mismatch_stats(batch.old_log_probs, fresh, mask)
    assert stats["pi_old/max_abs_diff"] < 1e-5


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16"])
def test_bf16_mismatch_is_measured_and_recompute_makes_the_ratio_one(tokenizer, precision):
    model = model_in(tokenizer, precision)
    batch = sampled_batch(model, tokenizer, precision)
    sampler = run_update(model, batch, precision=precision, old_logprobs="sampler")
    assert "pi_old/max_abs_diff" not in sampler  # no extra pass unless asked
    assert sampler["pi_old/ratio_max_dev_at_old"] > 0  # bf16 rounding seen as a policy change
    assert sampler["pairs/d_spread_at_old"] > 0
    fresh = run_update(model, batch, precision=precision, old_logprobs="recompute")
    assert fresh["pi_old/recomputed"] == 1.0
    assert fresh["pi_old/max_abs_diff"] > 0 and fresh["pi_old/mean_abs_diff"] > 0
    assert fresh["pi_old/max_abs_diff"] >= fresh["pi_old/mean_abs_diff"]
    assert fresh["pi_old/ratio_max_dev_at_old"] == 0.0  # exactly 1 at theta = theta_old
    assert fresh["pairs/d_spread_at_old"] == 0.0
    # the sampler's d spread measured by the recompute is the one the sampler run saw
    assert fresh["pi_old/d_spread_sampler"] == pytest.approx(sampler["pairs/d_spread_at_old"])
    assert math.isfinite(fresh["loss/task"])


def test_check_option_measures_without_replacing_pi_old(tokenizer):
    model = model_in(tokenizer, "bf16-mixed")
    batch = sampled_batch(model, tokenizer, "bf16-mixed")
    stats = run_update(model, batch, precision="bf16-mixed", old_logprobs="sampler",
                       old_logprobs_check=True)  # fmt: skip
    assert stats["pi_old/recomputed"] == 0.0 and stats["pi_old/max_abs_diff"] > 0
    assert stats["pi_old/ratio_max_dev_at_old"] > 0  # still the sampler's pi_old


def test_mismatch_stats_by_hand():
    # row 0: responses at 1, 2 with |diff| 0.2, 0.4 -> d0 = mean(train - sampler) = -0.3
    # row 1: response at 1 with diff 0.1 -> d1 = +0.1; row 2 has no response (left out)
    # max 0.4, mean (0.2 + 0.4 + 0.1) / 3, SD of {-0.3, 0.1} = 0.2
    sampler = torch.tensor([[0.0, -1.0, -2.0], [0.0, -1.0, 0.0], [0.0, 0.0, 0.0]])
    train = torch.tensor([[0.0, -1.2, -2.4], [0.0, -0.9, 0.0], [0.0, 5.0, 0.0]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0], [0, 0, 0]], dtype=torch.bool)
    stats = mismatch_stats(sampler, train, mask)
    assert stats["pi_old/max_abs_diff"] == pytest.approx(0.4)
    assert stats["pi_old/mean_abs_diff"] == pytest.approx(0.7 / 3)
    assert stats["pi_old/d_spread_sampler"] == pytest.approx(0.2)


def test_recompute_must_cover_every_row(tokenizer):
    model = model_in(tokenizer, "fp32")
    batch = sampled_batch(model, tokenizer, "fp32")
    with pytest.raises(ValueError, match="micro_batches miss row 7 of the batch"):
        recompute_log_probs(model, batch, [np.arange(7)], precision="fp32")


def test_old_logprobs_auto_recomputes_unless_fp32():
    assert not TrainConfig().recompute_old()  # fp32 default: the sampler's
    assert TrainConfig(precision="bf16-mixed").recompute_old()
    assert TrainConfig(precision="bf16").recompute_old()
    assert not TrainConfig(precision="bf16", old_logprobs="sampler").recompute_old()
    assert TrainConfig(old_logprobs="recompute").recompute_old()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("precision", "fp16", "train.precision must be one of fp32, bf16-mixed, bf16; got 'fp16'"),
        ("old_logprobs", "vllm", "train.old_logprobs must be one of auto, sampler, recompute"),
    ],
)
def test_bad_precision_options(key, value, message):
    with pytest.raises(ConfigError, match=message):
        from_dict({"train": {key: value}}).check()


def _fake_cuda(monkeypatch, *, count=1, bf16=True):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100-SXM2-16GB")


def test_bf16_on_a_gpu_without_bf16_is_one_line(monkeypatch):
    _fake_cuda(monkeypatch, bf16=False)
    with pytest.raises(PrecisionError) as info:
        check_precision("bf16-mixed", "cuda")
    assert str(info.value) == (
        "train.precision bf16-mixed: Tesla V100-SXM2-16GB has no bfloat16 support (needs "
        "compute capability 8.0 or later); use --train.precision fp32"
    )
    check_precision("fp32", "cuda")  # fp32 runs anywhere
    check_precision("bf16", "cpu")  # the CPU has bf16 kernels


def test_device_checks_name_the_device(monkeypatch):
    _fake_cuda(monkeypatch, count=1)
    with pytest.raises(
        ConfigError, match=r"^--device cuda:3: this machine has 1 CUDA device\(s\)$"
    ):
        check_device(RunConfig(device="cuda:3"))
    check_device(RunConfig(device="cuda:0"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        ConfigError, match=r"^--device cuda: CUDA is not available on this machine$"
    ):
        check_device(RunConfig(device="cuda"))


def test_train_on_cuda_without_cuda_is_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code = main(["train", "--preset", "household-smoke", "--device", "cuda",
                 "--train.precision", "bf16-mixed"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert err == "mcgpo train: error: --device cuda: CUDA is not available on this machine"


def test_peak_memory_on_cpu_is_the_process_rss():
    memory = PeakMemory.start("cpu", "update")
    stats = memory.stop()
    assert list(stats) == ["memory/process_peak_rss_gb"]
    assert 0.01 < stats["memory/process_peak_rss_gb"] < 1000  # this process: tens of MB+


@pytest.mark.slow
def test_bf16_mixed_smoke_run_logs_pi_old_and_memory(smoke_args, tmp_path):
    out = tmp_path / "bf16"
    assert main(smoke_args(out, "--train.precision", "bf16-mixed")) == 0
    updates = [r for r in read_metrics(out / "metrics.jsonl") if "loss/task" in r]
    assert [r["update"] for r in updates] == [1, 2]
    for r in updates:
        assert math.isfinite(r["loss/task"])
        assert r["pi_old/recomputed"] == 1.0 and r["pi_old/ratio_max_dev_at_old"] == 0.0
        assert r["memory/process_peak_rss_gb"] > 0
    # the sampler ran in bf16 too: its pi_old differs from the training forward's somewhere
    # (on this 32-wide 1-layer model by ~1e-5 in update 1, and not at all in update 2's
    # batch, where every bf16 product rounds alike in both passes)
    assert max(r["pi_old/max_abs_diff"] for r in updates) > 0


def test_tf32_is_set_on_cuda_only_and_follows_the_option():
    """TF32 through the legacy API, so that torch.get_float32_matmul_precision() (which
    inductor and vLLM call) still answers afterwards: set through the per-backend
    fp32_precision attributes, it raises "mix of legacy and new APIs" (torch >= 2.9)."""
    from mcgpo.training.runtime import apply_runtime

    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        torch.set_float32_matmul_precision("highest")
        apply_runtime(RunConfig())  # cpu: untouched
        assert torch.get_float32_matmul_precision() == "highest"
        apply_runtime(RunConfig(device="cuda"))
        assert torch.get_float32_matmul_precision() == "high"  # answers, TF32 on
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        apply_runtime(from_dict({"device": "cuda", "train": {"tf32": False}}))
        assert torch.get_float32_matmul_precision() == "highest"
        assert not torch.backends.cudnn.allow_tf32
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]
