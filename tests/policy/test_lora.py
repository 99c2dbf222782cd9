"""LoRA through PEFT (mcgpo.policy.lora): wrapping, the reference with adapters off, the
update touching adapters only, the PEFT adapter folder, merging.

The tiny Qwen2 model of tests/policy/conftest.py (width 32, 2 layers) with rank-4 adapters
on every attention and MLP projection.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("peft")  # the lora extra

from mcgpo.policy import load_policy, save_policy, token_log_probs
from mcgpo.policy.loading import full_parameters
from mcgpo.policy.lora import (
    AdaptersOff,
    LoraError,
    add_lora,
    has_lora,
    merged_model,
    merged_parameters,
    reference_forward,
    trainable_count,
)
from mcgpo.rollout.tokens import TokenBatch
from mcgpo.training.config import TrainConfig
from mcgpo.training.update import update_policy

TARGETS = TrainConfig().lora_targets  # the default: attention and MLP projections


def wrap(model, rank=4, alpha=8.0, targets=TARGETS, seed=0):
    return add_lora(model, rank=rank, alpha=alpha, dropout=0.0, targets=targets, seed=seed)


def ids_of(tokenizer, texts):
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    return enc.input_ids, enc.attention_mask


def nonzero_adapters(model, seed=1):
    """Give every lora_B random values (B = 0 after wrapping makes the adapters a no-op)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


@pytest.fixture
def pair(small_policy):
    """(base copy, LoRA-wrapped copy, tokenizer)."""
    model, tok = small_policy
    base = copy.deepcopy(model).eval()
    return base, wrap(copy.deepcopy(model)).eval(), tok


def test_wrapping_freezes_the_base_and_trains_only_adapters(pair):
    base, lora, _ = pair
    assert has_lora(lora) and not has_lora(base)
    assert type(lora) is type(base)  # in place: the model keeps its class
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    # 2 layers x 7 projections x (A, B)
    assert len(trainable) == 2 * 7 * 2 and all(".lora_" in n for n in trainable)
    # rank 4 on width 32 (q 32, k/v 16 with 1 kv head of 16? here 2 kv heads x 8 = 16), MLP 128:
    # A: r x in, B: out x r, summed over the projections of one layer
    h, f, kv = 32, 128, base.config.num_key_value_heads * (32 // base.config.num_attention_heads)
    shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, f), (h, f), (f, h)]  # (in, out)
    per_layer = sum(4 * i + 4 * o for i, o in shapes)
    assert trainable_count(lora) == 2 * per_layer


def test_first_forward_equals_the_base_model(pair):
    # B = 0: W x + (alpha / r) B A x = W x exactly (the adapter branch adds zeros)
    base, lora, tok = pair
    ids, mask = ids_of(tok, ["go to fridge 1", "take mug 1 from table 1 now"])
    assert torch.equal(token_log_probs(lora, ids, mask), token_log_probs(base, ids, mask))


def test_reference_with_adapters_off_equals_a_frozen_copy(pair):
    base, lora, tok = pair
    nonzero_adapters(lora)
    ids, mask = ids_of(tok, ["go to fridge 1", "open drawer 2 and look"])
    with torch.no_grad():
        with reference_forward(AdaptersOff(lora)) as ref:
            off = token_log_probs(ref, ids, mask)
        on = token_log_probs(lora, ids, mask)  # adapters back on after the block
        frozen = token_log_probs(base, ids, mask)
    assert torch.equal(off, frozen)
    assert (on - frozen).abs().max() > 1e-2  # the adapters do change the policy
    with reference_forward(base) as same:  # a plain frozen copy is used as it is
        assert same is base


def test_merged_model_equals_the_adapter_model_in_float64(pair):
    # merged: (W + s B A) x; adapters: W x + s B (A x). Equal maths; in float64 the two
    # orders of the sums differ by ~1e-16 relative, far below 1e-9 on the logits (compared
    # there: token_log_probs takes its log-softmax in float32). In float32 they differ by
    # rounding only: each is within its own float32 rounding of the float64 value, so
    # |merged32 - adapter32| <= dev(merged32) + dev(adapter32) + 1e-9 on the logits, and
    # the log-probs (log-softmax is 1-Lipschitz per logit in the max norm, times 2) move by
    # at most twice that.
    _, lora, tok = pair
    nonzero_adapters(lora)
    ids, mask = ids_of(tok, ["go to fridge 1", "put mug 1 in/on sink 1"])
    merged = merged_model(lora)
    assert not has_lora(merged) and has_lora(lora)

    def logits(model):
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask).logits

    a32, m32 = logits(lora), logits(merged)
    lora64 = copy.deepcopy(lora).double()  # merged in float64 too
    a64, m64 = logits(lora64), logits(merged_model(lora64))
    assert (a64 - m64).abs().max() < 1e-9
    bound = (a32 - a64).abs().max() + (m32 - m64).abs().max() + 1e-9
    assert (a32 - m32).abs().max() <= bound
    with torch.no_grad():
        lp_a, lp_m = token_log_probs(lora, ids, mask), token_log_probs(merged, ids, mask)
    assert (lp_a - lp_m).abs().max() <= 2 * bound + 1e-6  # + float32 log-softmax rounding
    assert bound < 1e-4  # float32 rounding only


def test_merged_parameters_are_the_merged_models_weights(pair):
    # what a vLLM engine syncs: the base model's names, W + s B A, bitwise the merged copy's
    _, lora, _ = pair
    nonzero_adapters(lora)
    synced = dict(full_parameters(lora))
    assert synced.keys() == dict(merged_parameters(lora)).keys()
    merged = dict(merged_model(lora).named_parameters())
    assert synced.keys() == merged.keys()
    for name, value in merged.items():
        assert torch.equal(synced[name], value), name
    # and they differ from the base weights where adapters sit
    q = "model.layers.0.self_attn.q_proj.weight"
    base_q = lora.get_submodule("model.layers.0.self_attn.q_proj").base_layer.weight
    assert (synced[q] - base_q).abs().max() > 1e-3


def test_adapter_folder_is_peft_format_and_loads_merged(pair, tmp_path):
    import json

    from peft import PeftModel

    base, lora, tok = pair
    nonzero_adapters(lora)
    base_folder = save_policy(base, tok, tmp_path / "base")
    lora._mcgpo_lora_config.base_model_name_or_path = str(base_folder)
    folder = save_policy(lora, tok, tmp_path / "adapter")
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8.0
    assert not (folder / "config.json").exists()  # adapters only
    # PEFT's own loader reads the folder: the same policy as ours
    peft_model = PeftModel.from_pretrained(copy.deepcopy(base), folder).eval()
    ids, mask = ids_of(tok, ["go to fridge 1"])
    with torch.no_grad():
        ours = token_log_probs(lora, ids, mask)
        theirs = token_log_probs(peft_model.base_model.model, ids, mask)
    assert torch.equal(ours, theirs)
    # load_policy merges it into a plain model: PEFT's merge is ours, bitwise
    loaded, loaded_tok = load_policy(folder)
    assert not has_lora(loaded) and len(loaded_tok) == len(tok)
    # trainable as a plain folder loads (PEFT loads for inference: mcgpo train --model
    # <adapter folder> had no parameter to train)
    assert all(p.requires_grad for p in loaded.parameters())
    ours_merged = dict(merged_model(lora).named_parameters())
    for name, value in loaded.named_parameters():
        assert torch.equal(value, ours_merged[name]), name


def test_an_update_changes_adapters_only_and_kl_reference_is_the_base(pair):
    # Two SGD steps (ppo_epochs 2) with KL and nonzero advantages: every adapter matrix
    # moves (B on the first step; A on the second, once B != 0), no base weight does. The
    # same update with a frozen base copy as the reference gives the same adapters.
    base, lora, _ = pair
    gen = torch.Generator().manual_seed(0)
    vocab = base.config.vocab_size
    prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (4, 3, 5)]
    responses = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (2, 3, 2)]
    batch = TokenBatch.from_sequences(
        prompts, responses, [[0.0] * len(r) for r in responses], pad_token_id=0
    )
    with torch.no_grad():
        old = token_log_probs(lora, batch.input_ids, batch.attention_mask)
    batch = dataclasses.replace(batch, old_log_probs=torch.where(batch.response_mask, old, 0.0))
    cfg = TrainConfig(grad_clip=0.0, kl_coef=0.1, entropy_coef=0.0, weight_decay=0.0,
                      ppo_epochs=2)  # fmt: skip
    adv = np.array([1.0, -1.0, 0.5], dtype=np.float32)

    def run(reference_of):
        model = copy.deepcopy(lora).train()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
        update_policy(model, opt, batch, adv, cfg, ref_model=reference_of(model))
        return before, dict(model.named_parameters())

    before, after = run(AdaptersOff)
    for name, value in after.items():
        if ".lora_" in name:
            assert not torch.equal(value, before[name]), f"{name} did not move"
        else:
            assert torch.equal(value, before[name]), f"base weight {name} moved"
    _, with_copy = run(lambda _: copy.deepcopy(base).requires_grad_(False))
    for name, value in after.items():
        torch.testing.assert_close(value, with_copy[name], rtol=0, atol=0, msg=name)


def test_targets_matching_no_module_are_one_line(small_policy):
    model, _ = small_policy
    with pytest.raises(LoraError, match="not found in the base model") as err:
        wrap(copy.deepcopy(model), targets="nope_proj")
    assert "\n" not in str(err.value)


def test_a_module_peft_cannot_wrap_is_one_line(small_policy):
    model, _ = small_policy
    # the RMSNorms match "norm" but are no layer type PEFT's LoRA supports
    with pytest.raises(LoraError, match="PEFT cannot wrap Qwen2ForCausalLM") as err:
        wrap(copy.deepcopy(model), targets="input_layernorm")
    assert "\n" not in str(err.value)


def test_the_adapters_draw_from_their_own_seed(small_policy):
    model, _ = small_policy
    state = torch.get_rng_state()
    a = wrap(copy.deepcopy(model), seed=3)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's RNG is untouched
    b = wrap(copy.deepcopy(model), seed=3)
    c = wrap(copy.deepcopy(model), seed=4)
    name = "model.layers.0.self_attn.q_proj.lora_A.default.weight"
    pa, pb, pc = (dict(m.named_parameters())[name] for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_adapters_are_float32_on_a_bf16_base(small_policy):
    # train.precision bf16: the frozen base in bf16 (2 bytes a parameter), the adapters and
    # so their AdamW moments in float32 (PEFT's autocast_adapter_dtype); B = 0 still
    model, _ = small_policy
    lora = wrap(copy.deepcopy(model).to(torch.bfloat16))
    dtypes = {n: p.dtype for n, p in lora.named_parameters()}
    assert {d for n, d in dtypes.items() if ".lora_" in n} == {torch.float32}
    assert {d for n, d in dtypes.items() if ".lora_" not in n} == {torch.bfloat16}
    merged = dict(merged_parameters(lora))  # what vLLM gets: the base's dtype
    assert {t.dtype for t in merged.values()} == {torch.bfloat16}


def test_an_adapter_folder_whose_base_is_gone_is_one_line(pair, tmp_path):
    from mcgpo.policy import PolicyLoadError

    _, lora, tok = pair
    lora._mcgpo_lora_config.base_model_name_or_path = str(tmp_path / "gone")
    folder = save_policy(lora, tok, tmp_path / "adapter")
    with pytest.raises(PolicyLoadError) as err:
        load_policy(folder)
    assert str(err.value) == (
        f"adapter folder {str(folder)!r}: its base model: policy folder "
        f"{str(tmp_path / 'gone')!r} does not exist"
    )


def test_export_merge_writes_the_merged_folder_and_refuses_bad_input(pair, tmp_path, capsys):
    from mcgpo.cli import main

    base, lora, tok = pair
    nonzero_adapters(lora)
    lora._mcgpo_lora_config.base_model_name_or_path = str(save_policy(base, tok, tmp_path / "b"))
    run = tmp_path / "run"
    save_policy(lora, tok, run / "model")  # a LoRA run's final model folder
    assert main(["export", "--merge", str(run)]) == 0
    assert capsys.readouterr().out.strip() == f"merged model written to {run / 'merged'}"
    exported, _ = load_policy(run / "merged")
    assert not (run / "merged" / "adapter_config.json").exists()
    ours = dict(merged_model(lora).named_parameters())
    for name, value in exported.named_parameters():
        assert torch.equal(value, ours[name]), name
    # bad input: one line, exit 2, nothing overwritten
    for argv, message in [
        (["export", "--merge", str(run)], f"--out {str(run / 'merged')!r} exists"),
        (["export", "--merge", str(tmp_path / "b")], f"{str(tmp_path / 'b')!r} is not a LoRA run"),
        (["export", "--merge", str(tmp_path)], "holds no LoRA adapter folder"),
        (["export", "--merge", str(tmp_path / "nope")], "nope': no such folder"),
        (["export", str(run)], "the following arguments are required: --merge"),
        (["export", "--merge", str(run), "--out", "/proc/merged"], "cannot write the merged"),
    ]:
        try:
            code = main(argv)
        except SystemExit as stop:  # the command line's own mistakes: argparse exits
            code = stop.code
        assert code == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith("mcgpo export: error: ") and message in err
    assert sorted(p.name for p in run.iterdir()) == ["merged", "model"]  # no half folder left
