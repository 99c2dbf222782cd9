"""Everything that touches weights, with LoRA adapters: the micro-batched update with the
pair loss and the KL to the adapters-off reference, pi_old recomputed and the rollout
correction, compiled layers, both HF samplers."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("peft")  # the lora extra

from mcgpo.cli import main
from mcgpo.policy import token_log_probs
from mcgpo.policy.lora import AdaptersOff, add_lora
from mcgpo.policy.tiny import tiny_model, train_tokenizer
from mcgpo.rollout.tokens import TokenBatch
from mcgpo.training.config import TrainConfig
from mcgpo.training.metrics import read_metrics
from mcgpo.training.update import PairBatch, update_policy

TEXTS = ["go to fridge 1", "open drawer 2", "take mug 1 from table 1", "put mug 1 in/on sink 1"]
LORA = ("--train.lora_rank", "4", "--train.lora_alpha", "8")


@pytest.fixture(scope="module")
def lora_policy():
    """A 1-layer, 16-wide Qwen2 with rank-2 adapters whose B is nonzero (a trained LoRA)."""
    tokenizer = train_tokenizer(TEXTS * 4, vocab_size=300)
    model = tiny_model(tokenizer, seed=0, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
    model = add_lora(model, rank=2, alpha=4.0, dropout=0.0, targets=TrainConfig().lora_targets,
                     seed=0)  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


def make_batch(model, lengths, seed=0) -> TokenBatch:
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prompts = [torch.randint(3, vocab, (p,), generator=gen).tolist() for p, _ in lengths]
    responses = [torch.randint(3, vocab, (r,), generator=gen).tolist() for _, r in lengths]
    zeros = [[0.0] * len(r) for r in responses]
    batch = TokenBatch.from_sequences(prompts, responses, zeros, pad_token_id=0)
    with torch.no_grad():
        old = token_log_probs(model, batch.input_ids, batch.attention_mask)
    return dataclasses.replace(batch, old_log_probs=torch.where(batch.response_mask, old, 0.0))


def sgd_step(model, batch, adv, cfg, pairs, lam):
    """One update of a copy with SGD lr 1 (delta = minus the accumulated gradient); the KL
    reference is the copy itself with its adapters off. Returns the adapters' deltas."""
    model = copy.deepcopy(model).train()
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    stats = update_policy(model, opt, batch, np.asarray(adv, dtype=np.float32), cfg,
                          pairs=pairs, lambda_pair=lam, ref_model=AdaptersOff(model))  # fmt: skip
    return {n: p.detach() - before[n] for n, p in model.named_parameters() if n in before}, stats


def test_lora_gradient_with_pairs_and_kl_does_not_depend_on_the_micro_batch_split(lora_policy):
    # The update's aggregation (training/update.py items 1-2) with adapters: micro-batches of
    # 2 or 4 rows accumulate the whole batch's adapter gradient, pair and KL terms included.
    # The KL is nonzero (the adapters moved the policy off the base), and the pair loss
    # reaches the adapters (lambda 0 gives another delta).
    lengths = [(5, 2), (3, 4), (6, 1), (2, 3), (4, 4), (3, 2), (5, 5), (2, 1)]
    batch = make_batch(lora_policy, lengths, seed=1)
    adv = [1.0, -0.5, 0.3, -1.2, 0.8, 0.0, -0.3, 2.0]
    pairs = PairBatch(np.array([0, 5]), np.array([3, 2]), np.array([1.0, 0.5]))
    cfg = TrainConfig(grad_clip=0.0, kl_coef=0.05, entropy_coef=0.01, weight_decay=0.0)
    whole, stats = sgd_step(lora_policy, batch, adv, dataclasses.replace(cfg, micro_batch_size=8),
                            pairs, 0.7)  # fmt: skip
    assert stats["pairs/used"] == 2.0 and stats["loss/kl"] > 1e-4
    for micro in (2, 4):
        split, _ = sgd_step(lora_policy, batch, adv,
                            dataclasses.replace(cfg, micro_batch_size=micro), pairs, 0.7)  # fmt: skip
        for name in whole:
            torch.testing.assert_close(split[name], whole[name], atol=1e-6, rtol=1e-5, msg=name)
    no_pairs, _ = sgd_step(lora_policy, batch, adv, dataclasses.replace(cfg, micro_batch_size=8),
                           pairs, 0.0)  # fmt: skip
    assert max(float((no_pairs[n] - whole[n]).abs().max()) for n in whole) > 1e-4


def _updates(folder):
    return [r for r in read_metrics(folder / "metrics.jsonl") if "loss/task" in r]


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["dynamic", "static"])
def test_lora_samplers_give_the_training_forwards_log_probs(smoke_args, tmp_path, sampler):
    """Both HF samplers sample from the adapter model, the policy being trained (its
    log-probs are the training forward's: every tis ratio pi_old / sampler is 1 up to
    float32 rounding, as without LoRA in test_rollout_correction.py); the KL to the
    adapters-off base is logged and is 0 at update 1's first step (adapters B = 0)."""
    out = tmp_path / "run"
    extra = ("--train.rollout_correction", "tis", "--rollout.sampler", sampler)
    assert main(smoke_args(out, *LORA, *extra)) == 0
    updates = _updates(out)
    for r in updates:
        assert r["pi_old/recomputed"] == 1.0
        assert abs(r["rollout_correction/ratio_max"] - 1.0) < 1e-3
        assert r["pi_old/ratio_max_dev_at_old"] < 1e-5
    assert updates[1]["loss/kl"] > 0.0  # the adapters moved the policy off the reference


@pytest.mark.slow  # compiles the micro policy's layer with its LoRA layers
def test_lora_with_compiled_layers_trains_as_the_eager_run(smoke_args, tmp_path):
    # bound as tests/training/test_compiled_update.py: the same rollouts at update 1, the
    # weights after two AdamW steps within float rounding (measured there 8.6e-7)
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    assert main(smoke_args(eager, *LORA, "--train.compile", "false")) == 0
    assert main(smoke_args(compiled, *LORA, "--train.compile", "true")) == 0
    first = _updates(compiled)[0]
    assert first["compile/graphs"] >= 1
    for key in ("loss/task", "loss/policy", "loss/kl", "policy/entropy"):
        e = _updates(eager)[0][key]
        assert math.isfinite(first[key])
        assert abs(first[key] - e) <= 3.8e-4 * max(abs(e), 1e-3), key
    a, b = (load_file(str(f / "model" / "adapter_model.safetensors")) for f in (eager, compiled))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-5


def test_lora_with_gradient_checkpointing_gets_the_same_adapter_gradient(lora_policy):
    # the frozen embeddings give the checkpointed layers inputs without requires_grad;
    # transformers then makes the embedding output require grad (enable_input_require_grads),
    # without which reentrant checkpointing would give the adapters no gradient at all
    batch = make_batch(lora_policy, [(5, 2), (3, 4), (6, 1), (2, 3)], seed=3)
    adv = [1.0, -0.5, 0.3, -1.2]
    cfg = TrainConfig(grad_clip=0.0, kl_coef=0.05, entropy_coef=0.0, weight_decay=0.0)
    plain, _ = sgd_step(lora_policy, batch, adv, cfg, None, 0.0)
    checkpointed = copy.deepcopy(lora_policy)
    checkpointed.gradient_checkpointing_enable()
    recomputed, _ = sgd_step(checkpointed, batch, adv, cfg, None, 0.0)
    assert max(float(d.abs().max()) for d in plain.values()) > 1e-4
    for name in plain:
        torch.testing.assert_close(recomputed[name], plain[name], atol=1e-6, rtol=1e-5, msg=name)


def test_lora_dropout_acts_in_the_update_forward_only(lora_policy):
    """``train.lora_dropout`` > 0: in train mode the adapter forward draws dropout (two
    forwards differ), pi_old's recompute turns it off (equal to the eval-mode forward, the
    samplers' mode, exactly) and the adapters-off reference never sees it."""
    from mcgpo.policy.lora import adapter_dropout_off, reference_forward
    from mcgpo.training.old_logprobs import recompute_log_probs

    model = copy.deepcopy(lora_policy)
    for name in [n for n, _ in model.named_modules()]:
        if name.endswith("lora_dropout.default"):  # PEFT's Identity at 0: a real dropout
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, torch.nn.Dropout(0.5))
    batch = make_batch(model, [(5, 4), (3, 6)], seed=3)

    def forward(module):
        with torch.no_grad():
            return token_log_probs(module, batch.input_ids, batch.attention_mask)

    model.eval()
    plain = forward(model)
    with reference_forward(AdaptersOff(model)) as reference:
        ref_eval = forward(reference)
    model.train()
    torch.manual_seed(0)
    assert not torch.equal(forward(model), forward(model))  # dropout draws in train mode
    with adapter_dropout_off(model):
        assert torch.equal(forward(model), plain)
    assert all(m.training for m in model.modules())  # the modes are restored
    mask = batch.response_mask
    old = recompute_log_probs(model, batch, [np.arange(2)], precision="fp32")
    assert torch.equal(old, torch.where(mask, plain, 0.0))
    with reference_forward(AdaptersOff(model)) as reference:
        assert torch.equal(forward(reference), ref_eval)
        assert torch.equal(forward(reference), ref_eval)
    assert not torch.equal(ref_eval, plain)  # the adapters (B != 0) matter


@pytest.mark.slow
def test_lora_run_with_dropout_trains_and_samples_without_it(smoke_args, tmp_path):
    """A run with ``train.lora_dropout 0.1`` trains the adapters with finite losses; the
    sampler (eval mode) and pi_old's recompute both run without the dropout: their
    log-probs agree to float32 rounding at every update (measured 4.8e-7; with the
    recompute drawing dropout 3.0e-4 at update 2), while the update's own forward draws it
    (its ratio at pi_old is off 1: measured 6.1e-4 at update 2; 0 at update 1, where B = 0
    and the adapters add nothing)."""
    out = tmp_path / "run"
    extra = ("--train.lora_dropout", "0.1", "--train.rollout_correction", "tis",
             "--train.old_logprobs", "recompute")  # fmt: skip
    assert main(smoke_args(out, *LORA, *extra)) == 0
    updates = _updates(out)
    assert len(updates) == 2
    for r in updates:
        assert all(math.isfinite(r[k]) for k in ("loss/task", "loss/kl", "loss/policy"))
        assert r["pi_old/max_abs_diff"] < 1e-5
    assert updates[0]["pi_old/ratio_max_dev_at_old"] == 0.0
    assert updates[1]["pi_old/ratio_max_dev_at_old"] > 1e-4
    weights = load_file(str(out / "model" / "adapter_model.safetensors"))
    assert all(w.abs().max() > 0 for k, w in weights.items() if "lora_B" in k)
